package kernels

import (
	"sync"

	"github.com/cxltier/cxltier/internal/crccopy"
)

// Blocks moved with their checksums on engines that run gather.cu: the
// kernel (cxl_blocks_crc) leaves the raw CRC-32C register of every chunk it
// moved, from the registers that carried the bytes; the host joins a
// block's chunks onto its seed with the CRC shift, four table lookups a
// chunk. The constants the kernel multiplies by come from here, so the
// arithmetic has one source.

// blockKernels are an engine's two blocks kernels: plain, and with
// checksums.
type blockKernels struct{ plain, crc Function }

// crcShiftWords are cxl_blocks_crc's constants for lanes lanes per chunk:
// x^(128·lanes), then x^(128·2^j) for j = 0..4, two to a word.
func crcShiftWords(lanes int) []uint64 {
	k := [6]uint32{crccopy.XPow8n(16 * uint64(lanes))}
	for j := range 5 {
		k[1+j] = crccopy.XPow8n(16 << j)
	}
	return []uint64{uint64(k[0]) | uint64(k[1])<<32, uint64(k[2]) | uint64(k[3])<<32, uint64(k[4]) | uint64(k[5])<<32}
}

// joinChunks folds each block's chunk registers (raw, nc a block, in
// order) onto its checksum in crcs.
func joinChunks(crcs, raw []uint32, nc int, shift *crccopy.Shift) {
	for blk := range crcs {
		crc := crcs[blk]
		for _, r := range raw[blk*nc : (blk+1)*nc] {
			crc = crccopy.Append(crc, r, shift)
		}
		crcs[blk] = crc
	}
}

// shiftCache keeps the shifts of the chunk sizes an engine moves: a
// Shift costs a thousand multiplications to make, as much as the joins of
// a whole large call.
type shiftCache struct {
	mu    sync.Mutex
	byLen map[int64]*crccopy.Shift
}

// maxShifts bounds the cache; a pool has one or two chunk sizes.
const maxShifts = 16

func (c *shiftCache) get(n int64) *crccopy.Shift {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s := c.byLen[n]; s != nil {
		return s
	}
	if c.byLen == nil || len(c.byLen) >= maxShifts {
		c.byLen = make(map[int64]*crccopy.Shift)
	}
	s := crccopy.NewShift(n)
	c.byLen[n] = s
	return s
}
