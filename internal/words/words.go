// Package words gives atomic access to 32- and 64-bit words of mapped tier
// memory. It is the one place outside the tier's own mapping code that
// turns bytes into word pointers. Its callers guarantee:
//   - b is a slice of an mmap'd tier device, never Go-managed memory, so the
//     pointer is neither moved nor collected, and the mapping outlives every
//     use (a Region keeps it until Close, after which its users stop);
//   - offsets are multiples of the word size (checked here, with bounds), so
//     each atomic is one aligned instruction on one cache line.
package words

import (
	"fmt"
	"unsafe"
)

// U32At is the uint32 at byte off of b.
func U32At(b []byte, off int64) *uint32 {
	if off%4 != 0 || off < 0 || off+4 > int64(len(b)) {
		panic(fmt.Sprintf("words: u32 at %d outside or misaligned in %d bytes", off, len(b)))
	}
	return (*uint32)(unsafe.Pointer(&b[off]))
}

// U64At is the uint64 at byte off of b.
func U64At(b []byte, off int64) *uint64 {
	if off%8 != 0 || off < 0 || off+8 > int64(len(b)) {
		panic(fmt.Sprintf("words: u64 at %d outside or misaligned in %d bytes", off, len(b)))
	}
	return (*uint64)(unsafe.Pointer(&b[off]))
}
