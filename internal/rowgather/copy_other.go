//go:build !amd64

package rowgather

// No vector copy on this architecture: memmove does the rows.
var hasVec, hasWide = false, false

func vecRows(p Plane, ids []int64, lo, hi int) { panic("rowgather: no vector copy") }

func vecSpans(dst, src []byte, dstOffs, srcOffs []int64, rowBytes int) {
	panic("rowgather: no vector copy")
}
