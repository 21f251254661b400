package ptxsim

import (
	"sync/atomic"
	"unsafe"
)

// Global memory is host memory that other threads of this process, and
// other processes mapping the same tier, may touch while a kernel runs:
// its 4- and 8-byte accesses and its atomics use the host's atomic
// instructions, so they are as atomic as the GPU's over the bus. Each
// helper is called with a slice of exactly 4 or 8 bytes that access has
// already checked to be aligned to its size on the device. sync/atomic
// needs the host pointer aligned too; memory mapped at an address not
// aligned like its device address (a caller registering mem[3:]) falls
// back to plain accesses, atomic only within this interpreter.

func hostAligned(b []byte) bool { return uintptr(unsafe.Pointer(&b[0]))%uintptr(len(b)) == 0 }

func atomicLoad(b []byte) uint64 {
	if !hostAligned(b) {
		return readLE(b)
	}
	p := unsafe.Pointer(&b[0])
	if len(b) == 4 {
		return uint64(atomic.LoadUint32((*uint32)(p)))
	}
	return atomic.LoadUint64((*uint64)(p))
}

func atomicStore(b []byte, v uint64) {
	if !hostAligned(b) {
		writeLE(b, v)
		return
	}
	p := unsafe.Pointer(&b[0])
	if len(b) == 4 {
		atomic.StoreUint32((*uint32)(p), uint32(v))
		return
	}
	atomic.StoreUint64((*uint64)(p), v)
}

// atomicUpdate replaces the word at b by f of it, atomically, and returns
// the word it replaced.
func atomicUpdate(b []byte, f func(uint64) uint64) uint64 {
	if !hostAligned(b) {
		old := readLE(b)
		writeLE(b, f(old))
		return old
	}
	p := unsafe.Pointer(&b[0])
	if len(b) == 4 {
		w := (*uint32)(p)
		for {
			old := atomic.LoadUint32(w)
			if atomic.CompareAndSwapUint32(w, old, uint32(f(uint64(old)))) {
				return uint64(old)
			}
		}
	}
	w := (*uint64)(p)
	for {
		old := atomic.LoadUint64(w)
		if atomic.CompareAndSwapUint64(w, old, f(old)) {
			return old
		}
	}
}

// hostPageOffset is where mem starts in its host page.
func hostPageOffset(mem []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&mem[0])) & 4095) }
