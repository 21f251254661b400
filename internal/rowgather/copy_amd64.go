package rowgather

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// copyVec is in copy_amd64.s.
//
//go:noescape
func copyVec(dst, src unsafe.Pointer, dstOffs, srcIdx *int64, n, rowBytes, srcScale int, wide bool)

var (
	hasVec  = cpu.X86.HasAVX2
	hasWide = cpu.X86.HasAVX512F
)

// vecRows copies rows [lo, hi) of p in vector steps; p's rows must be
// vectorRows. Invariant the assembly relies on: every id in ids[lo:hi]
// was checked against p's rows (check) and p.Dst holds hi rows; the
// slicing below re-checks the destination span.
func vecRows(p Plane, ids []int64, lo, hi int) {
	rb := p.RowBytes
	dst := p.Dst[lo*rb : hi*rb]
	copyVec(unsafe.Pointer(&dst[0]), unsafe.Pointer(&p.Src[0]), nil, &ids[lo], hi-lo, rb, rb, hasWide)
}

// vecSpans copies rows of rowBytes from src at srcOffs to dst at dstOffs
// in vector steps; rowBytes must be vectorRows. Invariant: CopySpans
// checked every span inside its slice.
func vecSpans(dst, src []byte, dstOffs, srcOffs []int64, rowBytes int) {
	copyVec(unsafe.Pointer(&dst[0]), unsafe.Pointer(&src[0]), &dstOffs[0], &srcOffs[0], len(srcOffs), rowBytes, 1, hasWide)
}
