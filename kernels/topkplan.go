package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"unsafe"
)

// TopKLayout describes the slot tables of a sparse-attention pool kept in
// engine memory, so that the engine can plan a step without the host
// (package topk owns the semantics; topk.cu documents the layout). Request
// r's tables for layer l are one region at (r*Layers+l)*RegionBytes() of
// the state buffer.
type TopKLayout struct {
	Slots         int   // LRU slots per request (slot Slots holds the newest token)
	TopK          int   // selections per request and step
	Layers        int   // layers per request
	MaxExtents    int   // extents a request's layer may have
	ExtentEntries int64 // entries per extent
	EntryBytes    int64 // bytes per entry, a multiple of 16
}

// Check reports a layout the planners cannot serve.
func (l TopKLayout) Check() error {
	switch {
	case l.Slots < 1 || l.Slots > 1<<15-1 || l.TopK < 1 || l.TopK > l.Slots:
		return fmt.Errorf("%w: top-k layout of %d slots, top-k %d", ErrBadRequest, l.Slots, l.TopK)
	case l.Layers < 1 || l.MaxExtents < 1 || l.ExtentEntries < 1:
		return fmt.Errorf("%w: top-k layout of %d layers, %d extents of %d entries", ErrBadRequest, l.Layers, l.MaxExtents, l.ExtentEntries)
	case l.EntryBytes < 16 || l.EntryBytes%16 != 0:
		return fmt.Errorf("%w: top-k entries of %d bytes (want a multiple of 16)", ErrBadRequest, l.EntryBytes)
	case int64(l.TopK)*(l.EntryBytes/16) >= 1<<32:
		// cxl_topk_plan counts a request's copies in 16-byte vectors in 32 bits.
		return fmt.Errorf("%w: top-k %d of %d-byte entries is too much for one step", ErrBadRequest, l.TopK, l.EntryBytes)
	}
	return nil
}

// ExtentsOffset is where the extent table starts in a region.
func (l TopKLayout) ExtentsOffset() int64 { return (4*int64(2*l.Slots+2+l.Slots) + 7) &^ 7 }

// RegionBytes is one request's tables for one layer.
func (l TopKLayout) RegionBytes() int64 { return l.ExtentsOffset() + 8*int64(l.MaxExtents) }

// InitialRegion is a region as a request starts: slot s holds token s, LRU
// order is slot order, nothing is loaded, extents are given (the rest 0).
func (l TopKLayout) InitialRegion(extents []Addr) []byte {
	b := make([]byte, l.RegionBytes())
	s := l.Slots
	for i := range s + 1 {
		tok := int32(i)
		if i == s {
			tok = -1
		}
		binary.LittleEndian.PutUint32(b[4*i:], uint32(tok))
		binary.LittleEndian.PutUint32(b[4*(s+1+i):], ^uint32(0))
	}
	for i := range s {
		binary.LittleEndian.PutUint32(b[4*(2*s+2+i):], uint32(i))
	}
	for i, a := range extents {
		binary.LittleEndian.PutUint64(b[l.ExtentsOffset()+8*int64(i):], uint64(a))
	}
	return b
}

// hashBits sizes the planners' table of selected tokens: at most half full.
func (l TopKLayout) hashBits() uint { return uint(bits.Len(uint(2*l.TopK - 1))) }

// sharedBytes is the shared memory one block of cxl_topk_plan needs.
func (l TopKLayout) sharedBytes() int {
	return 8<<l.hashBits() + 4*(33+8) + 8*l.Slots + 2*l.TopK + 2*l.Slots + l.Slots
}

// TopKStep is one decode step of one layer for a batch: request Reqs[b] of
// length Lens[b] selected Sel[b*TopK:(b+1)*TopK] (int32 token positions,
// -1 padded, in engine memory); the planner writes each selection's slot to
// Out (same shape), updates the tables in State and copies what the slots
// lack from the tier into Data (request r's slot s is row r*(Slots+1)+s).
// Reqs must be distinct and registered, Lens within what was appended; the
// caller checks those, the planner checks the selections.
type TopKStep struct {
	Layout TopKLayout
	Layer  int
	State  Buffer
	Data   Buffer
	Reqs   []int32
	Lens   []int32
	Sel    Span
	Out    Span
	// Checked says the caller already checked every selection (they came
	// from host memory), so the engine need not.
	Checked bool
}

// TopKCounts is what a step did, summed over the batch.
type TopKCounts struct {
	Hits, Misses, Fills, Newest int
}

// Copies is the number of entries the step fetched.
func (c TopKCounts) Copies() int { return c.Misses + c.Fills + c.Newest }

// ErrBadSelection is wrapped by *BadSelection.
var ErrBadSelection = errors.New("kernels: selection outside the sequence")

// BadSelection is a step's first selection outside [-1, length): batch row
// Row, index Index, value Pos. Nothing was changed.
type BadSelection struct {
	Row, Index int
	Pos        int32
	Len        int32
}

func (e *BadSelection) Error() string {
	return fmt.Sprintf("kernels: batch row %d: selection %d is position %d, length %d", e.Row, e.Index, e.Pos, e.Len)
}

func (e *BadSelection) Unwrap() error { return ErrBadSelection }

// TopKPlanner is implemented by engines that plan top-k steps in their
// own memory: the CUDA engine with the kernels of topk.cu, the CPU engine
// with their Go twin. PlanTopK returns when the step's copies are done.
// CanPlanTopK reports, before any step, a layout the engine cannot plan
// (on a GPU: one that needs more shared memory per block than it has).
type TopKPlanner interface {
	CanPlanTopK(TopKLayout) error
	PlanTopK(TopKStep) (TopKCounts, error)
}

// CanPlanTopK implements TopKPlanner: the Go twin plans any valid layout.
func (e *CPU) CanPlanTopK(l TopKLayout) error { return l.Check() }

// checkTopKStep validates the shapes of a step against the buffers' sizes.
func checkTopKStep(s *TopKStep) error {
	l := s.Layout
	if err := l.Check(); err != nil {
		return err
	}
	n := int64(len(s.Reqs)) * int64(l.TopK) * 4
	switch {
	case len(s.Lens) != len(s.Reqs):
		return fmt.Errorf("%w: %d requests, %d lengths", ErrBadRequest, len(s.Reqs), len(s.Lens))
	case s.Layer < 0 || s.Layer >= l.Layers:
		return fmt.Errorf("%w: layer %d of %d", ErrBadRequest, s.Layer, l.Layers)
	case s.State == nil || s.Data == nil || s.Sel.Buf == nil || s.Out.Buf == nil:
		return fmt.Errorf("%w: top-k step without its buffers", ErrBadRequest)
	case s.Sel.Offset < 0 || s.Sel.Offset+n > s.Sel.Buf.Len() || s.Out.Offset < 0 || s.Out.Offset+n > s.Out.Buf.Len():
		return fmt.Errorf("%w: %d bytes of selections or outputs beyond their buffers", ErrOutOfBounds, n)
	}
	rows := s.Data.Len() / (l.EntryBytes * int64(l.Slots+1))
	regions := s.State.Len() / l.RegionBytes() / int64(l.Layers)
	for b, r := range s.Reqs {
		if r < 0 || int64(r) >= rows || int64(r) >= regions {
			return fmt.Errorf("%w: request %d beyond the buffers (%d rows, %d regions)", ErrOutOfBounds, r, rows, regions)
		}
		if s.Lens[b] < 1 || int64(s.Lens[b]) > int64(l.MaxExtents)*l.ExtentEntries {
			return fmt.Errorf("%w: request %d length %d", ErrBadRequest, r, s.Lens[b])
		}
	}
	return nil
}

// PlanTopK implements TopKPlanner: the Go twin of cxl_topk_plan, run on
// the CPU engine's host buffers, then one gather of the step's copies.
func (e *CPU) PlanTopK(s TopKStep) (TopKCounts, error) {
	if err := checkTopKStep(&s); err != nil {
		return TopKCounts{}, err
	}
	state, err := e.own(s.State)
	if err != nil {
		return TopKCounts{}, err
	}
	selBuf, err := e.own(s.Sel.Buf)
	if err != nil {
		return TopKCounts{}, err
	}
	outBuf, err := e.own(s.Out.Buf)
	if err != nil {
		return TopKCounts{}, err
	}
	l, k := s.Layout, s.Layout.TopK
	sel := int32s(selBuf.b[s.Sel.Offset:], len(s.Reqs)*k)
	out := int32s(outBuf.b[s.Out.Offset:], len(s.Reqs)*k)
	for i, p := range sel {
		if n := s.Lens[i/k]; p < -1 || p >= n {
			return TopKCounts{}, &BadSelection{Row: i / k, Index: i % k, Pos: p, Len: n}
		}
	}
	var c TopKCounts
	rows := Rows{RowBytes: l.EntryBytes, Buf: s.Data}
	pl := cpuPlanner{l: l, hash: make([]uint64, 1<<l.hashBits())}
	for b, req := range s.Reqs {
		off := (int64(req)*int64(l.Layers) + int64(s.Layer)) * l.RegionBytes()
		reg := newRegionView(l, state.b[off:off+l.RegionBytes()])
		ops := pl.plan(reg, s.Lens[b], sel[b*k:(b+1)*k], out[b*k:(b+1)*k], &c)
		for _, op := range ops {
			rows.Tier = append(rows.Tier, reg.addr(l, op.token))
			rows.Slots = append(rows.Slots, int64(req)*int64(l.Slots+1)+int64(op.slot))
		}
	}
	if len(rows.Tier) == 0 {
		return c, nil
	}
	h, err := e.Gather(rows)
	if err == nil {
		err = h.Wait()
	}
	return c, err
}

// int32s views n little-endian int32s at the start of b (host buffers are
// 8-byte aligned Go allocations and the offsets callers pass are multiples
// of 4; the machine is little endian, as the kernels assume).
func int32s(b []byte, n int) []int32 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(&b[0])), n)
}

// regionView is one request's tables for one layer in host memory.
type regionView struct {
	tokens, loaded, lru []int32
	extents             []byte
}

func newRegionView(l TopKLayout, b []byte) regionView {
	s := l.Slots
	all := int32s(b, 3*s+2)
	return regionView{tokens: all[:s+1], loaded: all[s+1 : 2*s+2], lru: all[2*s+2:], extents: b[l.ExtentsOffset():]}
}

func (r regionView) addr(l TopKLayout, tok int32) Addr {
	t := int64(tok)
	base := binary.LittleEndian.Uint64(r.extents[8*(t/l.ExtentEntries):])
	return Addr(base) + Addr(t%l.ExtentEntries*l.EntryBytes)
}

type topkOp struct{ slot, token int32 }

// cpuPlanner runs cxl_topk_plan's phases in order on one request at a
// time, with the same table of selected tokens (entry: token<<32 | first
// selection index<<16 | slot).
type cpuPlanner struct {
	l        TopKLayout
	hash     []uint64
	hit      []bool
	missSel  []int
	evict    []int32
	hitSlots []int32
	ops      []topkOp
}

const (
	hashEmpty  = ^uint64(0)
	hashNoSlot = 0xffff
)

func (p *cpuPlanner) home(tok int32) int {
	return int(uint32(tok) * 2654435769 >> (32 - p.l.hashBits()))
}

func (p *cpuPlanner) find(tok int32) int {
	mask := len(p.hash) - 1
	for h := p.home(tok); ; h = (h + 1) & mask {
		switch e := p.hash[h]; {
		case e == hashEmpty:
			return -1
		case int32(e>>32) == tok:
			return h
		}
	}
}

func (p *cpuPlanner) insert(tok int32, i int) {
	if p.find(tok) >= 0 {
		return // a later duplicate: the first index stays
	}
	mask := len(p.hash) - 1
	h := p.home(tok)
	for p.hash[h] != hashEmpty {
		h = (h + 1) & mask
	}
	p.hash[h] = uint64(uint32(tok))<<32 | uint64(i)<<16 | hashNoSlot
}

func (p *cpuPlanner) first(h int) int  { return int(p.hash[h] >> 16 & 0xffff) }
func (p *cpuPlanner) slot(h int) int32 { return int32(p.hash[h] & hashNoSlot) }
func (p *cpuPlanner) setSlot(h int, s int32) {
	p.hash[h] = p.hash[h]&^hashNoSlot | uint64(s)
}

func (p *cpuPlanner) plan(r regionView, n int32, sel, out []int32, c *TopKCounts) []topkOp {
	for i := range p.hash {
		p.hash[i] = hashEmpty
	}
	p.ops = p.ops[:0]
	long := int(n) > p.l.Slots
	newest := n - 1
	for i, tok := range sel {
		if tok >= 0 && !(long && tok == newest) {
			p.insert(tok, i)
		}
	}
	if !long {
		for i, tok := range sel {
			out[i] = tok
			if tok < 0 || p.first(p.find(tok)) != i {
				continue
			}
			c.Hits++
			if r.loaded[tok] != tok {
				r.loaded[tok] = tok
				p.ops = append(p.ops, topkOp{tok, tok})
				c.Fills++
			}
		}
		return p.ops
	}
	p.planLong(r, newest, sel, out, c)
	return p.ops
}

func (p *cpuPlanner) planLong(r regionView, newest int32, sel, out []int32, c *TopKCounts) {
	S := p.l.Slots
	p.hit = slices.Grow(p.hit[:0], S)[:S]
	clear(p.hit)
	for s, tok := range r.tokens[:S] {
		if tok < 0 {
			continue
		}
		if h := p.find(tok); h >= 0 {
			p.hit[s] = true
			p.setSlot(h, int32(s))
		}
	}
	p.missSel = p.missSel[:0]
	for i, tok := range sel {
		if tok >= 0 && tok != newest {
			if h := p.find(tok); p.first(h) == i && p.slot(h) == hashNoSlot {
				p.missSel = append(p.missSel, i)
			}
		}
	}
	p.evict, p.hitSlots = p.evict[:0], p.hitSlots[:0]
	for _, s := range r.lru {
		if p.hit[s] {
			p.hitSlots = append(p.hitSlots, s)
		} else {
			p.evict = append(p.evict, s)
		}
	}
	m := len(p.missSel)
	for rank, i := range p.missSel {
		s, tok := p.evict[rank], sel[i]
		p.setSlot(p.find(tok), s)
		r.tokens[s], r.loaded[s] = tok, tok
		p.ops = append(p.ops, topkOp{s, tok})
	}
	k := copy(r.lru, p.evict[m:])
	k += copy(r.lru[k:], p.evict[:m])
	copy(r.lru[k:], p.hitSlots)
	newestSelected := false
	for i, tok := range sel {
		switch {
		case tok < 0:
			out[i] = -1
		case tok == newest:
			out[i] = int32(S)
			newestSelected = true
		default:
			out[i] = p.slot(p.find(tok))
		}
	}
	for s := range S {
		if tok := r.tokens[s]; p.hit[s] && r.loaded[s] != tok {
			r.loaded[s] = tok
			p.ops = append(p.ops, topkOp{int32(s), tok})
			c.Fills++
		}
	}
	if newestSelected && r.loaded[S] != newest {
		r.loaded[S] = newest
		p.ops = append(p.ops, topkOp{int32(S), newest})
		c.Newest++
	}
	c.Hits += len(p.hitSlots)
	c.Misses += m
}
