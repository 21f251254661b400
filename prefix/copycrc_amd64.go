package prefix

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// copyCRC3 is in copycrc_amd64.s.
//
//go:noescape
func copyCRC3(dst, src *byte, seg int, r uint32) (ra, rb, rc uint32)

// copyCRC3T is copyCRC3 with ordinary stores, in copycrc_amd64.s.
//
//go:noescape
func copyCRC3T(dst, src *byte, seg int, r uint32) (ra, rb, rc uint32)

// fusedKernel is the fused copy and checksum for dst and src on this
// core: none without the CRC32 instruction (SSE 4.2); copyCRC3's
// non-temporal stores where dst is 16-byte aligned, as they need, and
// does not alias src (see aliasWindow); copyCRC3T's ordinary stores
// otherwise.
func fusedKernel(dst, src []byte) fused {
	switch {
	case !cpu.X86.HasSSE42:
		return nil
	case uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%16 == 0 && !aliases(dst, src):
		return copyCRC3
	default:
		return copyCRC3T
	}
}
