package tier

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cxltier/cxltier/internal/procmaps"
)

// procStartTime reads a process's start time (clock ticks since boot) from
// /proc/PID/stat. Together with the pid it identifies a process across pid
// reuse. The second result is false if the process is gone or a zombie, or
// its stat could not be read.
func procStartTime(pid string) (uint64, bool) {
	raw, err := os.ReadFile("/proc/" + pid + "/stat")
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
// Only a judge in the lease's PID namespace may ask (Region.sameNamespace):
// elsewhere the pid names another process or none.
func processAlive(pid int, start uint64) bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return !procGone(raw, err, start)
}

// pidNamespace is the inode of the PID namespace of process pid ("self"
// for this one), the identity a lease records. Namespace inodes are 32-bit
// (the kernel's proc inode numbers).
func pidNamespace(pid string) (uint32, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/"+pid+"/ns/pid", &st); err != nil {
		return 0, fmt.Errorf("PID namespace of %s: %w", pid, err)
	}
	if st.Ino == 0 || st.Ino > 1<<32-1 {
		return 0, fmt.Errorf("PID namespace of %s: inode %d does not fit 32 bits", pid, st.Ino)
	}
	return uint32(st.Ino), nil
}

// nsPIDs is the NSpid line of /proc/PID/status: the process's pid in each
// PID namespace from the reader's down to its own, which is last.
func nsPIDs(pid int) ([]int, error) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	return parseNSpid(raw)
}

func parseNSpid(status []byte) ([]int, error) {
	for _, line := range bytes.Split(status, []byte("\n")) {
		rest, ok := bytes.CutPrefix(line, []byte("NSpid:"))
		if !ok {
			continue
		}
		var out []int
		for _, f := range bytes.Fields(rest) {
			n, err := strconv.Atoi(string(f))
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("NSpid %q", rest)
			}
			out = append(out, n)
		}
		if len(out) == 0 {
			return nil, fmt.Errorf("NSpid is empty")
		}
		return out, nil
	}
	return nil, fmt.Errorf("no NSpid line (a kernel before 4.1)")
}

// inspect tells, for a judge in the lease's PID namespace, what its
// process is: gone, or running and mapping the tier or not. The /proc reads
// come between a pidfd's opening and a check that it has not exited, so a
// pid reused meanwhile cannot pass for the lease's process.
func (r *Region) inspect(pid int, start uint64) (gone, maps bool, err error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return true, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(fd)
	if !processAlive(pid, start) {
		return true, false, nil // exited, or the pid is another process's now
	}
	maps, err = r.mappedBy(pid)
	if pidfdExited(fd) {
		return true, false, nil
	}
	return false, maps, err
}

// stopPeer ends a proven client's process and waits up to wait for it to
// be gone. The signal goes through the pidfd the kernel gave when the
// client connected, which names that process and no other.
func stopPeer(p *peer, wait time.Duration) error {
	if err := unix.PidfdSendSignal(p.fd, unix.SIGKILL, nil, 0); err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		return fmt.Errorf("kill %d: %w", p.pid, err)
	}
	deadline := time.Now().Add(wait)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("process %d did not exit within %v of SIGKILL", p.pid, wait)
		}
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int(left/time.Millisecond)+1)
		if n > 0 {
			return nil // the pidfd reads ready once the process has exited
		}
		if err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for process %d: %w", p.pid, err)
		}
	}
}

// initPIDNamespace is the proc inode number of the kernel's initial PID
// namespace (PROC_PID_INIT_INO), fixed by the kernel: a process in it sees
// the processes of every PID namespace in its /proc.
const initPIDNamespace = 0xEFFFFFFC

// findInNamespace looks among the processes this process sees for pid
// nspid of PID namespace ns, started at start: a lease's process taken in
// a container. host is its pid here (0: none); seen says whether any
// process of ns is visible here, so that one not found is proven gone. A
// process that vanishes while it is read is skipped, and so is one this
// process may not inspect if it started at another time than the lease's
// (it is another process); any other failed read is an error, proof of
// nothing.
func findInNamespace(ns uint32, nspid int, start uint64) (host int, seen bool, err error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, false, fmt.Errorf("list /proc: %w", err)
	}
	var unsure []int
	for _, e := range ents {
		pid, convErr := strconv.Atoi(e.Name())
		if convErr != nil || pid <= 0 {
			continue
		}
		got, err := pidNamespace(e.Name())
		switch {
		case errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) || (err == nil && got != ns):
			continue
		case errors.Is(err, os.ErrPermission):
			if at, ok := procStartTime(e.Name()); ok && (start == 0 || at == start) {
				unsure = append(unsure, pid)
			}
			continue
		case err != nil:
			return 0, seen, err
		}
		seen = true
		ids, err := nsPIDs(pid)
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
			continue
		}
		if err != nil {
			return 0, seen, fmt.Errorf("NSpid of %d: %w", pid, err)
		}
		if ids[len(ids)-1] != nspid {
			continue
		}
		if at, ok := procStartTime(e.Name()); ok && (start == 0 || at == start) {
			return pid, true, nil
		}
	}
	if len(unsure) > 0 {
		return 0, seen, fmt.Errorf("processes %v started when it did and may not be inspected (%w)", unsure, os.ErrPermission)
	}
	return 0, seen, nil
}

// sameNamespace reports whether a lease's pid names a process this process
// can look up: the lease was taken in this process's PID namespace. Leases
// of builds that did not record the namespace (0) are judged as if taken
// elsewhere.
func (r *Region) sameNamespace(inf LeaseInfo) bool { return inf.PIDNS != 0 && inf.PIDNS == r.pidns }

// provenGone reports whether the lease's process is proven to have exited:
// only a judge in its PID namespace can tell, from /proc.
func (r *Region) provenGone(inf LeaseInfo) bool {
	return r.sameNamespace(inf) && !processAlive(inf.PID, inf.start)
}

// mappedBy reports whether process pid (in this PID namespace) maps one of
// the tier's devices: a mapping of the same file (device and inode, however
// the process reached it), or for a DAX tier the same character device,
// which a container may reach through a device node of its own
// (/proc/PID/map_files, readable to a daemon with CAP_SYS_ADMIN). An error
// means it could not tell.
func (r *Region) mappedBy(pid int) (bool, error) {
	type key struct{ dev, ino uint64 }
	files := map[key]bool{}
	var chars []uint64
	for _, m := range r.devs {
		if m.file.ino != 0 {
			files[key{m.file.dev, m.file.ino}] = true
		}
		if m.file.char {
			chars = append(chars, m.file.rdev)
		}
	}
	if len(files) == 0 {
		return false, fmt.Errorf("an anonymous tier has no file to look for")
	}
	found := false
	var candidates []procmaps.Mapping
	err := procmaps.Of(strconv.Itoa(pid), func(m procmaps.Mapping) bool {
		if !m.File() || !m.Shared() {
			return true
		}
		if files[key{unix.Mkdev(m.Major, m.Minor), m.Inode}] {
			found = true
			return false
		}
		candidates = append(candidates, m)
		return true
	})
	if err != nil || found || len(chars) == 0 {
		return found, err
	}
	for _, m := range candidates {
		var st unix.Stat_t
		if err := unix.Stat(fmt.Sprintf("/proc/%d/map_files/%s", pid, m.Range()), &st); err != nil {
			return false, fmt.Errorf("look up %s in /proc/%d/map_files: %w", m.Path, pid, err)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR && slices.Contains(chars, st.Rdev) {
			return true, nil
		}
	}
	return false, nil
}
