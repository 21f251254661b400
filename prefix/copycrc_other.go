//go:build !amd64

package prefix

// fusedCopyCRC: no fused copy and checksum on this architecture.
func fusedCopyCRC([]byte) bool { return false }

func copyCRC3(dst, src *byte, seg int, r uint32) (ra, rb, rc uint32) {
	panic("prefix: copyCRC3 without fusedCopyCRC")
}
