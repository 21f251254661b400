package tier

import (
	"fmt"
	"math/bits"
	"sort"
	"sync/atomic"
)

// The global chunk allocator: a bitmap (bit set = chunk in use) and one owner
// word per chunk, both changed only under SystemLock. The owner word is the
// lease slot+1 of the client that owns a private chunk, ownerShared for a
// chunk handed to a shared structure, 0 for none. Invariant: a set bit has a
// non-zero owner, so a client that dies mid-operation leaves either a free
// chunk or one its reaper can find by owner.

const ownerShared uint32 = 0xFFFFFFFF

// ChunkSize is the allocator's unit in bytes.
func (r *Region) ChunkSize() int64 { return r.l.ChunkSize }

// ChunkOffset is the Offset of chunk i.
func (r *Region) ChunkOffset(i int64) Offset { return Offset(r.l.ControlSize + i*r.l.ChunkSize) }

// chunkIndex maps an Offset to its chunk, checking that it is chunk-aligned.
func (r *Region) chunkIndex(off Offset) (int64, error) {
	o := int64(off) - r.l.ControlSize
	if off < r.DataStart() || o/r.l.ChunkSize >= r.l.ChunkCount || o%r.l.ChunkSize != 0 {
		return 0, fmt.Errorf("tier: %v is not the start of a data chunk: %w", off, ErrOutOfBounds)
	}
	return o / r.l.ChunkSize, nil
}

func (r *Region) chunkUsed(i int64) bool {
	return atomic.LoadUint64(r.bitmapWord(i/64))&(1<<(i%64)) != 0
}

// setChunks marks chunks [first, first+n) used by owner, or free; the
// caller holds SystemLock. Owner words and bitmap words of neighbouring
// chunks share lines: each line is reloaded before it is changed, so that
// the write-back carries other hosts' published words, not this host's
// stale copies of them (without it, on a tier shared without coherence, an
// allocation wrote back a line naming a neighbour's chunks free).
func (r *Region) setChunks(first, n int64, used bool, owner uint32) {
	lastWord := (first + n - 1) / 64
	r.sync.refresh(r.ownerBytes(first, first+n))
	r.sync.refresh(r.bitmapBytes(first/64, lastWord+1))
	if used {
		for i := first; i < first+n; i++ {
			atomic.StoreUint32(r.ownerWord(i), owner)
		}
		r.sync.publish(r.ownerBytes(first, first+n))
	}
	for i := first; i < first+n; i++ {
		w := r.bitmapWord(i / 64)
		if used {
			atomic.StoreUint64(w, atomic.LoadUint64(w)|1<<(i%64))
		} else {
			atomic.StoreUint64(w, atomic.LoadUint64(w)&^(1<<(i%64)))
		}
	}
	r.sync.publish(r.bitmapBytes(first/64, lastWord+1))
	if !used {
		for i := first; i < first+n; i++ {
			atomic.StoreUint32(r.ownerWord(i), 0)
		}
		r.sync.publish(r.ownerBytes(first, first+n))
	}
}

// findFree returns the first run of n free chunks at or after hint, wrapping.
func (r *Region) findFree(n, hint int64) (int64, bool) {
	total := r.l.ChunkCount
	r.sync.refresh(r.bitmapBytes(0, (total+63)/64))
	if hint >= total {
		hint = 0
	}
	for _, span := range [][2]int64{{hint, total}, {0, min(hint+n-1, total)}} {
		run := int64(0)
		for i := span[0]; i < span[1]; i++ {
			if i%64 == 0 && i+64 <= span[1] && run == 0 && atomic.LoadUint64(r.bitmapWord(i/64)) == ^uint64(0) {
				i += 63 // a full word: skip it whole
				continue
			}
			if r.chunkUsed(i) {
				run = 0
				continue
			}
			if run++; run == n {
				return i - n + 1, true
			}
		}
	}
	return 0, false
}

// AllocChunks allocates n contiguous chunks owned by this client. They are
// freed when the client closes or is reaped, unless handed to a shared
// structure with ShareChunks. On a striped tier a run of several chunks
// spans devices; a single chunk never does.
func (c *Client) AllocChunks(n int64) (Offset, error) {
	switch {
	case n <= 0:
		return 0, fmt.Errorf("tier: alloc %d chunks: %w", n, ErrInvalidConfig)
	case n > c.r.l.ChunkCount:
		return 0, fmt.Errorf("tier: alloc %d chunks (%d bytes): the tier's whole data area is %d chunks of %d bytes (%d bytes): %w",
			n, n*c.r.l.ChunkSize, c.r.l.ChunkCount, c.r.l.ChunkSize, c.r.l.ChunkCount*c.r.l.ChunkSize, ErrExhausted)
	}
	var first int64
	err := c.withLock(SystemLock, func() error {
		i, ok := c.r.findFree(n, c.hint)
		if !ok {
			return fmt.Errorf("tier: alloc %d chunks (%d bytes): %d of %d chunks are free, not %d in a row: %w",
				n, n*c.r.l.ChunkSize, c.r.freeChunks(), c.r.l.ChunkCount, n, ErrExhausted)
		}
		c.r.setChunks(i, n, true, uint32(c.slot+1))
		first, c.hint = i, i+n
		return nil
	})
	if err != nil {
		return 0, err
	}
	return c.r.ChunkOffset(first), nil
}

// checkRun verifies that chunks [first, first+n) are in use and owned by
// one of the given owners, before anything is modified.
func (r *Region) checkRun(off Offset, n int64, owners ...uint32) (int64, error) {
	first, err := r.chunkIndex(off)
	if err != nil {
		return 0, err
	}
	if n <= 0 || first+n > r.l.ChunkCount {
		return 0, fmt.Errorf("tier: %d chunks at %v: %w", n, off, ErrOutOfBounds)
	}
	for i := first; i < first+n; i++ {
		if !r.chunkUsed(i) {
			return 0, fmt.Errorf("tier: chunk %d (at %v) is not allocated: %w", i, r.ChunkOffset(i), ErrInvalidFree)
		}
		o := atomic.LoadUint32(r.ownerWord(i))
		ok := false
		for _, want := range owners {
			ok = ok || o == want
		}
		if !ok {
			return 0, fmt.Errorf("tier: chunk %d owned by %#x: %w", i, o, ErrNotOwner)
		}
	}
	return first, nil
}

// FreeChunks frees n chunks at off, which this client owns or which are shared.
func (c *Client) FreeChunks(off Offset, n int64) error {
	return c.withLock(SystemLock, func() error { return c.freeChunksLocked(off, n) })
}

// freeChunksLocked is FreeChunks for a caller holding the system lock.
func (c *Client) freeChunksLocked(off Offset, n int64) error {
	c.r.sync.refresh(c.r.ownerBytes(0, c.r.l.ChunkCount))
	first, err := c.r.checkRun(off, n, uint32(c.slot+1), ownerShared)
	if err != nil {
		return err
	}
	c.r.setChunks(first, n, false, 0)
	return nil
}

// ShareChunks hands n chunks this client owns to shared structures: they
// outlive the client and are freed only explicitly.
func (c *Client) ShareChunks(off Offset, n int64) error {
	return c.withLock(SystemLock, func() error { return c.shareLocked(off, n) })
}

// shareLocked is ShareChunks for a caller holding SystemLock.
func (c *Client) shareLocked(off Offset, n int64) error {
	c.r.sync.refresh(c.r.ownerBytes(0, c.r.l.ChunkCount))
	first, err := c.r.checkRun(off, n, uint32(c.slot+1))
	if err != nil {
		return err
	}
	for i := first; i < first+n; i++ {
		atomic.StoreUint32(c.r.ownerWord(i), ownerShared)
	}
	c.r.sync.publish(c.r.ownerBytes(first, first+n))
	return nil
}

// freeOwnedBy frees every chunk owned by lease slot, under the system lock
// taken by c (a reaper). It returns the chunks freed.
func (r *Region) freeOwnedBy(c *Client, slot int) (int64, error) {
	if !r.ownsChunks(slot) {
		return 0, nil
	}
	var freed int64
	err := c.withLock(SystemLock, func() error {
		freed = r.freeOwnedLocked(slot)
		return nil
	})
	return freed, err
}

// freeOwnedLocked frees slot's chunks; the caller holds SystemLock. A
// chunk inside a directory object's runs is the object's whatever its
// owner word says (one damaged word must not free a live index's payload
// under it to the next allocation): it goes back to the shared owner.
func (r *Region) freeOwnedLocked(slot int) int64 {
	var freed int64
	spans := r.auditDirectory(func(string, ...any) {})
	r.sync.refresh(r.ownerBytes(0, r.l.ChunkCount))
	for i := int64(0); i < r.l.ChunkCount; i++ {
		if atomic.LoadUint32(r.ownerWord(i)) != uint32(slot+1) {
			continue
		}
		if inSpans(spans, i) {
			atomic.StoreUint32(r.ownerWord(i), ownerShared)
			r.sync.publish(r.ownerBytes(i, i+1))
			continue
		}
		r.setChunks(i, 1, false, 0)
		freed++
	}
	return freed
}

// inSpans reports whether chunk i lies in one of spans (sorted by first).
func inSpans(spans []dirSpan, i int64) bool {
	k := sort.Search(len(spans), func(k int) bool { return spans[k].first > i })
	return k > 0 && i <= spans[k-1].last
}

// ownsChunks reports, without a lock, whether any chunk names slot as owner.
// Only slot's own client (or its reaper, once it is dead) adds such chunks,
// so a false answer from them is final.
func (r *Region) ownsChunks(slot int) bool {
	r.sync.refresh(r.ownerBytes(0, r.l.ChunkCount))
	for i := int64(0); i < r.l.ChunkCount; i++ {
		if atomic.LoadUint32(r.ownerWord(i)) == uint32(slot+1) {
			return true
		}
	}
	return false
}

// PrivateChunks counts the chunks each lease slot's client owns (allocated
// and not handed to a shared structure), read without a lock: for status
// pages and for finding who holds memory. An owner word naming no slot
// (damage) is not counted; Audit reports it.
func (r *Region) PrivateChunks() map[int]int64 {
	out := map[int]int64{}
	if r.live("private chunks") != nil {
		return out
	}
	slots := uint32(r.MaxClients())
	r.sync.refresh(r.ownerBytes(0, r.l.ChunkCount))
	for i := int64(0); i < r.l.ChunkCount; i++ {
		if o := atomic.LoadUint32(r.ownerWord(i)); o != 0 && o <= slots {
			out[int(o)-1]++
		}
	}
	return out
}

func (r *Region) usedChunks() int64 {
	words := (r.l.ChunkCount + 63) / 64
	r.sync.refresh(r.bitmapBytes(0, words))
	var used int
	for w := int64(0); w < words; w++ {
		word := atomic.LoadUint64(r.bitmapWord(w))
		if w == words-1 && r.l.ChunkCount%64 != 0 {
			// Bits past the last chunk are padding: set (damage), they
			// are no chunk's, and counting them made free space negative.
			word &= 1<<(r.l.ChunkCount%64) - 1
		}
		used += bits.OnesCount64(word)
	}
	return int64(used)
}

func (r *Region) freeChunks() int64 { return r.l.ChunkCount - r.usedChunks() }

// Usage is the allocator's view of the data area.
type Usage struct {
	ChunkSize    int64
	Chunks       int64
	UsedChunks   int64
	SharedChunks int64 // in use by shared structures (no owning client)
	DataBytes    int64
	UsedBytes    int64
	FreeBytes    int64
}

// Usage reads the bitmap and owner words without a lock (a consistent
// enough snapshot for monitoring).
func (r *Region) Usage() Usage {
	if r.live("usage") != nil {
		return Usage{}
	}
	u := Usage{ChunkSize: r.l.ChunkSize, Chunks: r.l.ChunkCount, UsedChunks: r.usedChunks()}
	r.sync.refresh(r.ownerBytes(0, r.l.ChunkCount))
	for i := int64(0); i < r.l.ChunkCount; i++ {
		if atomic.LoadUint32(r.ownerWord(i)) == ownerShared {
			u.SharedChunks++
		}
	}
	u.DataBytes = u.Chunks * u.ChunkSize
	u.UsedBytes = u.UsedChunks * u.ChunkSize
	u.FreeBytes = u.DataBytes - u.UsedBytes
	return u
}
