package tier

import (
	"fmt"
	"math/bits"
	"sync"
)

// Heap is a per-process allocator in local memory that carves chunks from the
// global allocator into cache-line-aligned blocks (TraCT's two-level scheme):
// the shared bitmap is touched once per chunk, not once per allocation.
// Small sizes come from slabs (one chunk per slab, one size class per slab,
// classes are powers of two from 64 B to half a chunk); larger sizes take
// whole chunk runs. Its bookkeeping is process-local: only the owning process
// frees its blocks, and everything returns to the tier when the client closes
// or is reaped. A Heap is safe for concurrent use.
type Heap struct {
	c       *Client
	mu      sync.Mutex
	classes []heapClass
	slabs   map[int64]*slab // chunk index → slab
	large   map[int64]int64 // first chunk → chunk count
}

type heapClass struct {
	size    int64
	partial []*slab // slabs with at least one free block
}

type slab struct {
	chunk   int64
	class   int
	used    int64
	blocks  int64
	bitmap  []uint64
	hint    int64
	partial bool // listed in its class's partial list
}

const minBlock = LineSize

// NewHeap returns a heap drawing chunks as client c.
func NewHeap(c *Client) *Heap {
	h := &Heap{c: c, slabs: map[int64]*slab{}, large: map[int64]int64{}}
	for size := int64(minBlock); size <= c.r.l.ChunkSize/2; size *= 2 {
		h.classes = append(h.classes, heapClass{size: size})
	}
	return h
}

// Alloc returns a block of at least size bytes, aligned to a cache line.
func (h *Heap) Alloc(size int64) (Offset, error) {
	if size <= 0 || size > h.c.r.l.ChunkCount*h.c.r.l.ChunkSize {
		return 0, fmt.Errorf("tier: heap alloc of %d bytes: %w", size, ErrInvalidConfig)
	}
	if len(h.classes) == 0 || size > h.classes[len(h.classes)-1].size {
		return h.allocLarge(size)
	}
	k := 0
	if size > minBlock {
		k = bits.Len64(uint64(size-1)) - bits.Len64(minBlock-1)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	cl := &h.classes[k]
	if len(cl.partial) == 0 {
		s, err := h.newSlab(k)
		if err != nil {
			return 0, err
		}
		cl.partial = append(cl.partial, s)
		s.partial = true
	}
	s := cl.partial[len(cl.partial)-1]
	i := s.take()
	if s.used == s.blocks {
		cl.partial = cl.partial[:len(cl.partial)-1]
		s.partial = false
	}
	return h.c.r.ChunkOffset(s.chunk) + Offset(i*cl.size), nil
}

func (h *Heap) allocLarge(size int64) (Offset, error) {
	n := (size + h.c.r.l.ChunkSize - 1) / h.c.r.l.ChunkSize
	off, err := h.c.AllocChunks(n)
	if err != nil {
		return 0, err
	}
	first, _ := h.c.r.chunkIndex(off)
	h.mu.Lock()
	h.large[first] = n
	h.mu.Unlock()
	return off, nil
}

func (h *Heap) newSlab(k int) (*slab, error) {
	off, err := h.c.AllocChunks(1)
	if err != nil {
		return nil, err
	}
	chunk, _ := h.c.r.chunkIndex(off)
	blocks := h.c.r.l.ChunkSize / h.classes[k].size
	s := &slab{chunk: chunk, class: k, blocks: blocks, bitmap: make([]uint64, (blocks+63)/64)}
	h.slabs[chunk] = s
	return s, nil
}

// take marks and returns a free block; the slab must have one.
func (s *slab) take() int64 {
	for w := s.hint; ; w = (w + 1) % int64(len(s.bitmap)) {
		free := ^s.bitmap[w]
		if w == int64(len(s.bitmap))-1 && s.blocks%64 != 0 {
			free &= 1<<(s.blocks%64) - 1
		}
		if free != 0 {
			b := int64(bits.TrailingZeros64(free))
			s.bitmap[w] |= 1 << b
			s.used++
			s.hint = w
			return w*64 + b
		}
	}
}

// Free returns a block obtained from Alloc.
func (h *Heap) Free(off Offset) error {
	r := h.c.r
	if off < r.DataStart() || int64(off) >= r.l.size() {
		return fmt.Errorf("tier: heap free %v: %w", off, ErrInvalidFree)
	}
	chunk := (int64(off) - r.l.ControlSize) / r.l.ChunkSize
	within := (int64(off) - r.l.ControlSize) % r.l.ChunkSize
	h.mu.Lock()
	if n, ok := h.large[chunk]; ok && within == 0 {
		delete(h.large, chunk)
		h.mu.Unlock()
		return h.c.FreeChunks(off, n)
	}
	defer h.mu.Unlock()
	s, ok := h.slabs[chunk]
	if !ok {
		return fmt.Errorf("tier: heap free %v: not allocated by this heap: %w", off, ErrInvalidFree)
	}
	size := h.classes[s.class].size
	i := within / size
	if within%size != 0 || s.bitmap[i/64]&(1<<(i%64)) == 0 {
		return fmt.Errorf("tier: heap free %v: not a live %d-byte block: %w", off, size, ErrInvalidFree)
	}
	s.bitmap[i/64] &^= 1 << (i % 64)
	s.used--
	return h.afterFree(s)
}

// afterFree keeps one empty slab per class for reuse and returns the others.
func (h *Heap) afterFree(s *slab) error {
	cl := &h.classes[s.class]
	if !s.partial {
		cl.partial = append(cl.partial, s)
		s.partial = true
	}
	if s.used > 0 || len(cl.partial) == 1 {
		return nil
	}
	for i, p := range cl.partial {
		if p == s {
			cl.partial = append(cl.partial[:i], cl.partial[i+1:]...)
			break
		}
	}
	delete(h.slabs, s.chunk)
	return h.c.FreeChunks(h.c.r.ChunkOffset(s.chunk), 1)
}

// BlockSize returns the usable size of the block at off (its size class).
func (h *Heap) BlockSize(off Offset) (int64, error) {
	r := h.c.r
	if off < r.DataStart() || int64(off) >= r.l.size() {
		return 0, fmt.Errorf("tier: heap block %v: %w", off, ErrOutOfBounds)
	}
	chunk := (int64(off) - r.l.ControlSize) / r.l.ChunkSize
	h.mu.Lock()
	defer h.mu.Unlock()
	if n, ok := h.large[chunk]; ok {
		return n * r.l.ChunkSize, nil
	}
	if s, ok := h.slabs[chunk]; ok {
		return h.classes[s.class].size, nil
	}
	return 0, fmt.Errorf("tier: heap block %v: %w", off, ErrNotFound)
}
