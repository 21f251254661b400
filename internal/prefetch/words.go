package prefetch

import "unsafe"

// Words asks the CPU to start loading the lines of w. The pointer is only
// a hint's address: nothing is read or written through it here.
func Words(w []uint64) {
	if len(w) > 0 {
		Lines((*byte)(unsafe.Pointer(&w[0])), uintptr(len(w))*8)
	}
}
