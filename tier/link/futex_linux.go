package link

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The futex calls rely on the word being in a MAP_SHARED mapping of the
// tier (a file, a device): the kernel keys a non-private futex by the
// mapping's page, so every process that maps the tier sleeps and wakes on
// the same word. words.U32At checked its alignment.
const (
	futexWait = 0 // FUTEX_WAIT, not _PRIVATE: the word is shared by processes
	futexWake = 1
)

// sleepOn sleeps while *w == v, at most d; a spurious or early return only
// costs the caller another look.
func sleepOn(w *uint32, v uint32, d time.Duration) {
	if d <= 0 {
		return
	}
	ts := unix.NsecToTimespec(int64(d))
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWait, uintptr(v), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// wakeAll wakes every sleeper on w.
func wakeAll(w *uint32) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(w)), futexWake, uintptr(1<<31-1), 0, 0, 0)
}
