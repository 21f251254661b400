package kernels

import (
	"fmt"
	"math"
	"sync"
)

// rangeTable is the set of registered ranges, shared by the engines for
// bounds checks. The zero length marks a free id.
type rangeTable struct {
	mu   sync.RWMutex
	lens [MaxRanges]int64
}

// claim takes the lowest free id for a range of n bytes.
func (t *rangeTable) claim(n int64) (RangeID, error) {
	if n <= 0 {
		return 0, fmt.Errorf("%w: empty range", ErrBadRequest)
	}
	if n > MaxRangeBytes {
		return 0, fmt.Errorf("%w: range of %d bytes exceeds %d", ErrBadRequest, n, MaxRangeBytes)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for id := range t.lens {
		if t.lens[id] == 0 {
			t.lens[id] = n
			return RangeID(id), nil
		}
	}
	return 0, ErrTooManyRanges
}

func (t *rangeTable) release(id RangeID) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.lens[id] == 0 {
		return fmt.Errorf("%w: %d", ErrNoRange, id)
	}
	t.lens[id] = 0
	return nil
}

// checkSpan reports whether n bytes at a lie inside a registered range.
// Callers hold t.mu for reading.
func (t *rangeTable) checkSpan(a Addr, n int64, what string, i int) error {
	l := t.lens[a.Range()]
	if l == 0 {
		return fmt.Errorf("%s %d at %v: %w", what, i, a, ErrNoRange)
	}
	if a.Offset() > l-n {
		return fmt.Errorf("%s %d at %v, %d bytes, range is %d bytes: %w", what, i, a, n, l, ErrOutOfBounds)
	}
	return nil
}

// checkOne checks n bytes at a single address (bulk copies).
func (t *rangeTable) checkOne(a Addr, n int64, what string) error {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.checkSpan(a, n, what, 0)
}

// checkBufSpan checks that n bytes at off lie inside a buffer of bufLen.
func checkBufSpan(op string, bufLen, off, n int64) error {
	if maxIndex(bufLen, off, 1, n) < 0 {
		return fmt.Errorf("%s of %d bytes at %d, buffer of %d: %w", op, n, off, bufLen, ErrOutOfBounds)
	}
	return nil
}

// maxIndex is the largest index k for which off + k*stride + n <= bufLen,
// or -1 when none fits.
func maxIndex(bufLen, off, stride, n int64) int64 {
	if off < 0 || off > bufLen-n {
		return -1
	}
	return (bufLen - off - n) / stride
}

// checkRows validates r against the ranges and its buffer's length.
func (t *rangeTable) checkRows(r *Rows) error {
	if r.RowBytes <= 0 {
		return fmt.Errorf("%w: row size %d", ErrBadRequest, r.RowBytes)
	}
	if r.SlotStride == 0 {
		r.SlotStride = r.RowBytes
	}
	if r.SlotStride < r.RowBytes {
		return fmt.Errorf("%w: slot stride %d below row size %d", ErrBadRequest, r.SlotStride, r.RowBytes)
	}
	if r.Slots != nil && len(r.Slots) != len(r.Tier) {
		return fmt.Errorf("%w: %d slots for %d rows", ErrBadRequest, len(r.Slots), len(r.Tier))
	}
	if r.Buf == nil {
		return fmt.Errorf("%w: no buffer", ErrBadRequest)
	}
	last := maxIndex(r.Buf.Len(), r.BufOffset, r.SlotStride, r.RowBytes)
	if r.Slots == nil && int64(len(r.Tier))-1 > last {
		return fmt.Errorf("%d rows of %d bytes from buffer offset %d overrun a %d-byte buffer: %w",
			len(r.Tier), r.RowBytes, r.BufOffset, r.Buf.Len(), ErrOutOfBounds)
	}
	for i, s := range r.Slots {
		if s < 0 || s > last {
			return fmt.Errorf("row %d: slot %d outside the buffer's %d slots: %w", i, s, last+1, ErrOutOfBounds)
		}
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.checkAddrs(r.Tier, r.RowBytes, "row")
}

// checkAddrs checks n bytes at every address. It is on the path of every
// call, a million rows at a time for small rows, so the common case is one
// table load and one compare per row; the slow path names the culprit.
// Callers hold t.mu for reading.
func (t *rangeTable) checkAddrs(addrs []Addr, n int64, what string) error {
	var last [MaxRanges]int64 // last valid offset + 1 per range, 0 if none fits
	for id, l := range t.lens {
		if l >= n {
			last[id] = l - n + 1
		}
	}
	for i, a := range addrs {
		if a.Offset() >= last[a.Range()] {
			return t.checkSpan(a, n, what, i)
		}
	}
	return nil
}

// checkBlocks validates b against the ranges and its chunk buffers.
func (t *rangeTable) checkBlocks(b *Blocks) error {
	if b.ChunkBytes <= 0 || len(b.Chunks) == 0 {
		return fmt.Errorf("%w: %d chunks of %d bytes", ErrBadRequest, len(b.Chunks), b.ChunkBytes)
	}
	if b.PageStride == 0 {
		b.PageStride = b.ChunkBytes
	}
	if b.PageStride < b.ChunkBytes {
		return fmt.Errorf("%w: page stride %d below chunk size %d", ErrBadRequest, b.PageStride, b.ChunkBytes)
	}
	if len(b.Pages) != len(b.Tier) {
		return fmt.Errorf("%w: %d pages for %d blocks", ErrBadRequest, len(b.Pages), len(b.Tier))
	}
	if b.CRCs != nil && len(b.CRCs) != len(b.Tier) {
		return fmt.Errorf("%w: %d checksums for %d blocks", ErrBadRequest, len(b.CRCs), len(b.Tier))
	}
	if int64(len(b.Chunks)) > math.MaxInt64/b.ChunkBytes {
		return fmt.Errorf("%w: block size overflows", ErrBadRequest)
	}
	blockBytes := int64(len(b.Chunks)) * b.ChunkBytes
	lastPage := int64(math.MaxInt64)
	for c, ch := range b.Chunks {
		if ch.Buf == nil {
			return fmt.Errorf("%w: chunk %d has no buffer", ErrBadRequest, c)
		}
		lastPage = min(lastPage, maxIndex(ch.Buf.Len(), ch.Offset, b.PageStride, b.ChunkBytes))
	}
	for i, p := range b.Pages {
		if p < 0 || p > lastPage {
			return fmt.Errorf("block %d: page %d outside the chunk buffers' %d pages: %w", i, p, lastPage+1, ErrOutOfBounds)
		}
	}
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.checkAddrs(b.Tier, blockBytes, "block")
}

// lanesPerRow is how many threads (CUDA) share one row: enough for one
// 16-byte vector each, a power of two up to a warp.
func lanesPerRow(rowBytes int64) int {
	l := 1
	for l < 32 && int64(l)*16 < rowBytes {
		l *= 2
	}
	return l
}
