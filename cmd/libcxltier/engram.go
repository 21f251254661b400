package main

// #include <stdint.h>
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/tier"
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

// cxl_engram_table_name writes to out (outLen bytes, NUL included) the
// tier object name of SGLang's host table `table` of `model`, per-rank when
// world > 1 (engram.HostTableName: the names the CLI loads and destroys).
//
//export cxl_engram_table_name
func cxl_engram_table_name(model, table *C.char, rank, world C.int, out *C.char, outLen C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_engram_table_name", errbuf, errlen, &code)
	if model == nil || table == nil || out == nil || outLen <= 0 || rank < 0 || (world > 1 && rank >= world) {
		return report(fmt.Errorf("engram table name: %w: rank %d of %d", errBadArg, rank, world), errbuf, errlen)
	}
	name := engram.HostTableName(C.GoString(model), C.GoString(table), int(rank), int(world))
	if len(name)+1 > int(outLen) {
		return report(fmt.Errorf("engram table name: %w: %d bytes, room for %d", errRange, len(name)+1, outLen), errbuf, errlen)
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(out)), len(name)+1)
	copy(dst, name)
	dst[len(name)] = 0
	return report(nil, errbuf, errlen)
}

// cxl_engram_checkpoint_digest writes to out (outLen bytes, NUL included)
// the digest of Engram layer `layer` of a DeepSeek-V4.1 checkpoint (spec:
// its .safetensors files, comma-separated, or its folder): what a seal's
// label records (engram.SGLangLayer.Digest), so a server can tell a table
// of another checkpoint from its own.
//
//export cxl_engram_checkpoint_digest
func cxl_engram_checkpoint_digest(spec *C.char, layer C.int, out *C.char, outLen C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_engram_checkpoint_digest", errbuf, errlen, &code)
	if spec == nil || out == nil || outLen < 17 {
		return report(fmt.Errorf("engram checkpoint digest: %w", errBadArg), errbuf, errlen)
	}
	digest, err := checkpointDigest(C.GoString(spec), int(layer))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(out)), len(digest)+1)
	copy(dst, digest)
	dst[len(digest)] = 0
	return report(nil, errbuf, errlen)
}

func checkpointDigest(spec string, layer int) (string, error) {
	files, err := engram.CheckpointFiles(spec)
	if err != nil {
		return "", err
	}
	layers, err := engram.FindSGLangLayers(files)
	if err != nil {
		return "", err
	}
	for _, l := range layers {
		if l.Layer == layer {
			return l.Digest()
		}
	}
	return "", fmt.Errorf("engram checkpoint digest: %s has no Engram layer %d: %w", spec, layer, tier.ErrNotFound)
}
