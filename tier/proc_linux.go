package tier

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
)

// procStartTime reads a process's start time (clock ticks since boot) from
// /proc/PID/stat. Together with the pid it identifies a process across pid
// reuse. The second result is false if the process is gone or a zombie.
func procStartTime(pid int) (uint64, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	return parseProcStat(raw)
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
	got, ok := procStartTime(pid)
	return ok && (start == 0 || got == start)
}
