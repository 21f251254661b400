package crccopy

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

// copyCRC3L is copyCRC3 with its stores a round behind its loads (AVX2),
// in copycrc_amd64.s.
//
//go:noescape
func copyCRC3L(dst, src *byte, seg int, r uint32) (ra, rb, rc uint32)

// fusedKernel is the fused copy and checksum for dst and src on this
// core: none without the CRC32 instruction (SSE 4.2). Non-temporal
// stores need dst 16-byte aligned; where it is, copyCRC3 unless dst
// aliases src (see aliasWindow), copyCRC3L where it aliases within the
// lag's reach and the core has AVX2. copyCRC3T's ordinary stores
// otherwise.
func fusedKernel(dst, src []byte) fused {
	if !cpu.X86.HasSSE42 {
		return nil
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%16 != 0 {
		return copyCRC3T
	}
	switch d := aliasDistance(dst, src); {
	case d == 0 || d >= aliasWindow:
		return copyCRC3
	case d <= lagReach && cpu.X86.HasAVX2:
		return copyCRC3L
	default:
		return copyCRC3T
	}
}
