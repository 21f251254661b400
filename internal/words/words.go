// Package words gives atomic access to 32- and 64-bit words of mapped tier
// memory. It is the one place outside the tier's own mapping code that
// turns bytes into word pointers. Its callers guarantee:
//   - b is a slice of an mmap'd tier device, never Go-managed memory, so the
//     pointer is neither moved nor collected, and the mapping outlives every
//     use (a Region keeps it until Close, after which its users stop);
//   - offsets are multiples of the word size (checked here, with bounds), so
//     each atomic is one aligned instruction on one cache line.
//
// Both accessors are small enough for the compiler to inline (a lookup
// calls them several times per key), which is why the check panics with a
// value and formats only when the panic is printed.
package words

import (
	"fmt"
	"unsafe"
)

// U32At is the uint32 at byte off of b.
func U32At(b []byte, off int64) *uint32 {
	if off < 0 || off&3 != 0 || off > int64(len(b))-4 {
		panic(outsideError{4, off, len(b)})
	}
	// In bounds and aligned, checked above.
	return (*uint32)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), off))
}

// U64At is the uint64 at byte off of b.
func U64At(b []byte, off int64) *uint64 {
	if off < 0 || off&7 != 0 || off > int64(len(b))-8 {
		panic(outsideError{8, off, len(b)})
	}
	// In bounds and aligned, checked above.
	return (*uint64)(unsafe.Add(unsafe.Pointer(unsafe.SliceData(b)), off))
}

// outsideError is the panic of a word outside its slice or misaligned: a
// caller's layout bug, since callers check offsets read from shared memory
// before they use them.
type outsideError struct {
	size int
	off  int64
	n    int
}

func (e outsideError) Error() string {
	return fmt.Sprintf("words: %d-byte word at %d outside or misaligned in %d bytes", e.size, e.off, e.n)
}
