package tier

import (
	"fmt"
	"unsafe"
)

// Word access into the mapped region. Invariants these rely on:
//   - b is a slice of an mmap'd region, not Go-managed memory, so the pointer
//     is never moved or collected while the mapping lives, and the Region
//     keeps the mapping alive until Close (after which no accessor runs);
//   - off is aligned to the word size (checked), so atomic operations are
//     single instructions and never split across cache lines.

func u32At(b []byte, off int64) *uint32 {
	if off%4 != 0 || off < 0 || off+4 > int64(len(b)) {
		panic(fmt.Sprintf("tier: u32 at %d outside or misaligned in %d bytes", off, len(b)))
	}
	return (*uint32)(unsafe.Pointer(&b[off]))
}

func u64At(b []byte, off int64) *uint64 {
	if off%8 != 0 || off < 0 || off+8 > int64(len(b)) {
		panic(fmt.Sprintf("tier: u64 at %d outside or misaligned in %d bytes", off, len(b)))
	}
	return (*uint64)(unsafe.Pointer(&b[off]))
}
