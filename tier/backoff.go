package tier

import (
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// backoff waits a little longer on each try: spin, then yield, then sleep.
// Waits on shared words must leave the CPU to the holder on small machines.
func backoff(try int) {
	switch {
	case try < 32:
		for i := 0; i < 30; i++ {
			_ = i
		}
	case try < 64:
		runtime.Gosched()
	case try < 256:
		// Give the core to another process (the holder, or the manager):
		// Gosched only yields to goroutines of this one.
		_, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	default:
		d := time.Duration(1<<min(try-256, 8)) * time.Microsecond
		time.Sleep(d)
	}
}
