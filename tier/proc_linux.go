package tier

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// procStartTime reads a process's start time (clock ticks since boot) from
// /proc/PID/stat. Together with the pid it identifies a process across pid
// reuse. The second result is false if the process is gone or a zombie, or
// its stat could not be read.
func procStartTime(pid int) (uint64, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	return parseProcStat(raw)
}

// procGone says whether a read of /proc/PID/stat that gave raw and err
// proves the process that started at start gone: the file is not there
// (ENOENT, ESRCH), the process is a zombie, or the pid names a process
// started at another time. A read that failed for another reason (too many
// open files, an interrupted call, memory) proves nothing: a live client
// must never be reaped, and its memory handed on, because this process ran
// short of file descriptors.
func procGone(raw []byte, err error, start uint64) bool {
	if err != nil {
		return errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH)
	}
	got, ok := parseProcStat(raw)
	if !ok { // a zombie is gone; a stat this parser does not follow proves nothing
		i := bytes.LastIndexByte(raw, ')')
		f := bytes.Fields(raw[i+1:])
		return i >= 0 && len(f) > 0 && (f[0][0] == 'Z' || f[0][0] == 'X')
	}
	return start != 0 && got != start
}

// parseProcStat extracts state and start time. The command name (field 2)
// may contain spaces and parentheses, so fields are counted after the last ')'.
func parseProcStat(raw []byte) (uint64, bool) {
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(raw[i+1:])
	// f[0] is field 3 (state); start time is field 22, so f[19].
	if len(f) < 20 {
		return 0, false
	}
	if s := f[0][0]; s == 'Z' || s == 'X' {
		return 0, false
	}
	start, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return 0, false
	}
	return start, true
}

// processAlive says whether pid still runs the process that took the lease.
func processAlive(pid int, start uint64) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return !procGone(raw, err, start)
}

// stopProcess ends process pid (started at start) and waits up to wait for
// it to be gone. The reaper calls it for a process of its own host that is
// alive past its lease (stopped, frozen, paused in a debugger): its memory
// may be handed to another client only once it can no longer write there.
// The signal goes through a pidfd, which names that process and no other,
// so a pid reused since the check is never signalled.
func stopProcess(pid int, start uint64, wait time.Duration) error {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return nil // gone already
	}
	if err != nil {
		return fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if !processAlive(pid, start) {
		return nil // exited (or the pid is another process's now)
	}
	if err := unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("kill %d: %w", pid, err)
	}
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("process %d did not exit within %v of SIGKILL", pid, wait)
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left/time.Millisecond)+1)
		if n > 0 {
			return nil // the pidfd reads ready once the process has exited
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for process %d: %w", pid, err)
		}
	}
}
