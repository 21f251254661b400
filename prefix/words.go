package prefix

import (
	"fmt"
	"unsafe"
)

// Word access into the mapped tier. Invariants these rely on:
//   - b is a slice of the tier's mmap'd devices, never Go-managed memory, so
//     the pointer is not moved or collected, and the Region keeps the mapping
//     until Close, after which a Store is not used;
//   - every field offset is a multiple of its size and every structure is
//     line-aligned in the tier (checked here), so each atomic is one
//     instruction on one cache line.

func u32At(b []byte, off int) *uint32 {
	if off%4 != 0 || off < 0 || off+4 > len(b) {
		panic(fmt.Sprintf("prefix: u32 at %d outside or misaligned in %d bytes", off, len(b)))
	}
	return (*uint32)(unsafe.Pointer(&b[off]))
}

func u64At(b []byte, off int) *uint64 {
	if off%8 != 0 || off < 0 || off+8 > len(b) {
		panic(fmt.Sprintf("prefix: u64 at %d outside or misaligned in %d bytes", off, len(b)))
	}
	return (*uint64)(unsafe.Pointer(&b[off]))
}
