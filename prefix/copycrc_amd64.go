package prefix

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// copyCRC3 is in copycrc_amd64.s.
//
//go:noescape
func copyCRC3(dst, src *byte, seg int, r uint32) (ra, rb, rc uint32)

// fusedCopyCRC reports whether copyCRC3 may copy into dst: the core has
// the CRC32 instruction (SSE 4.2) and dst is 16-byte aligned, as its
// non-temporal stores need (tier blocks are line-aligned; a caller's
// buffer may not be, and then takes the portable path).
func fusedCopyCRC(dst []byte) bool {
	return cpu.X86.HasSSE42 && uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%16 == 0
}
