package lowprio

import "golang.org/x/sys/unix"

// lowerThisThread lowers the calling thread, which the caller has locked
// to its goroutine. Linux keeps a nice value and a policy per thread, so
// PRIO_PROCESS with the thread's id and sched_setattr on 0 change this
// thread alone.
func lowerThisThread(p Policy) error {
	switch p {
	case Low:
		return unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 19)
	case Idle:
		return unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0)
	}
	return nil
}
