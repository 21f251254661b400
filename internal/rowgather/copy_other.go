//go:build !amd64

package rowgather

// vectorRows: no vector copy on this architecture; memmove does the rows.
func vectorRows(rowBytes int) bool { return false }

func vecRows(p Plane, ids []int64, lo, hi int) { panic("rowgather: no vector copy") }

func vecSpans(dst, src []byte, dstOffs, srcOffs []int64, rowBytes int) {
	panic("rowgather: no vector copy")
}
