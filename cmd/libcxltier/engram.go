package main

// #include <stdint.h>
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/cxltier/cxltier/engram"
)

//export cxl_engram_hash
func cxl_engram_hash(spec *C.char, layer C.int, ids *C.int64_t, n C.int64_t, out *C.int64_t, outCap C.int64_t, nRows *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_engram_hash", errbuf, errlen, &code)
	return report(engramHash(C.GoString(spec), int(layer), ids, n, out, outCap, nRows), errbuf, errlen)
}

// engramHash hashes one sequence's ids (no history): for each position,
// the layer's rows, position-major, as `cxltier engram hash` prints them.
func engramHash(spec string, layer int, ids *C.int64_t, n C.int64_t, out *C.int64_t, outCap C.int64_t, nRows *C.int64_t) error {
	if n < 0 || (n > 0 && ids == nil) || nRows == nil {
		return fmt.Errorf("engram hash: %w: %d ids", errBadArg, n)
	}
	g, err := geometryOf(spec)
	if err != nil {
		return err
	}
	h, err := engram.NewHasher(g)
	if err != nil {
		return err
	}
	in := int64sAt(unsafe.Pointer(ids), int64(n))
	rows, err := h.Hash(nil, layer, nil, in)
	if err != nil {
		return err
	}
	*nRows = C.int64_t(len(rows))
	if int64(len(rows)) > int64(outCap) {
		return fmt.Errorf("engram hash: %w: %d rows, room for %d", errRange, len(rows), outCap)
	}
	if len(rows) > 0 {
		copy(unsafe.Slice((*int64)(unsafe.Pointer(out)), len(rows)), rows)
	}
	return nil
}
