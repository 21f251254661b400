package words

import "unsafe"

// unsafeBytes views test words as bytes; the words stay reachable through
// the caller's slice for the test's length.
func unsafeBytes(w []uint64) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(w))), 8*len(w))
}
