package topk

import (
	"encoding/binary"
	"slices"

	"github.com/cxltier/cxltier/kernels"
)

// twinStepper is the CPU engine's stepper: the Go twin of cxl_topk_plan
// on the engine's host buffers, then one gather of the step's copies. It
// plans any valid layout and holds no resources of its own.
type twinStepper struct{ e *kernels.CPU }

func (t *twinStepper) fits(engineLayout) error { return nil }
func (t *twinStepper) close() error            { return nil }

func (t *twinStepper) plan(s *engineStep) (engineCounts, error) {
	var bufs [3][]byte
	for i, b := range []kernels.Buffer{s.state, s.sel.Buf, s.out.Buf} {
		m, err := t.e.Bytes(b)
		if err != nil {
			return engineCounts{}, err
		}
		bufs[i] = m
	}
	state := bufs[0]
	l, k := s.layout, s.layout.TopK
	sel := kernels.Int32s(bufs[1][s.sel.Offset:], len(s.reqs)*k)
	out := kernels.Int32s(bufs[2][s.out.Offset:], len(s.reqs)*k)
	for i, p := range sel {
		if n := s.lens[i/k]; p < -1 || p >= n {
			return engineCounts{}, &badSelection{row: i / k, index: i % k, pos: p, len: n}
		}
	}
	var c engineCounts
	rows := kernels.Rows{RowBytes: l.EntryBytes, Buf: s.data}
	pl := twinPlanner{l: l, hash: make([]uint64, 1<<l.hashBits())}
	for b, req := range s.reqs {
		off := (int64(req)*int64(l.Layers) + int64(s.layer)) * l.regionBytes()
		reg := newRegionView(l, state[off:off+l.regionBytes()])
		ops := pl.plan(reg, s.lens[b], sel[b*k:(b+1)*k], out[b*k:(b+1)*k], &c)
		for _, op := range ops {
			rows.Tier = append(rows.Tier, reg.addr(l, op.token))
			rows.Slots = append(rows.Slots, int64(req)*int64(l.Slots+1)+int64(op.slot))
		}
	}
	if len(rows.Tier) == 0 {
		return c, nil
	}
	h, err := t.e.Gather(rows)
	if err == nil {
		err = h.Wait()
	}
	return c, err
}

// regionView is one request's tables for one layer in host memory.
type regionView struct {
	tokens, loaded, lru []int32
	extents             []byte
}

func newRegionView(l engineLayout, b []byte) regionView {
	s := l.Slots
	all := kernels.Int32s(b, 3*s+2)
	return regionView{tokens: all[:s+1], loaded: all[s+1 : 2*s+2], lru: all[2*s+2:], extents: b[l.extentsOffset():]}
}

func (r regionView) addr(l engineLayout, tok int32) kernels.Addr {
	t := int64(tok)
	base := binary.LittleEndian.Uint64(r.extents[8*(t/l.ExtentEntries):])
	return kernels.Addr(base) + kernels.Addr(t%l.ExtentEntries*l.EntryBytes)
}

type topkOp struct{ slot, token int32 }

// twinPlanner is cxl_topk_plan's Go twin: it runs the kernel's phases in
// order on one request at a time, with the same table of selected tokens (entry: token<<32 | first
// selection index<<16 | slot).
type twinPlanner struct {
	l        engineLayout
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

func (p *twinPlanner) home(tok int32) int {
	return int(uint32(tok) * 2654435769 >> (32 - p.l.hashBits()))
}

func (p *twinPlanner) find(tok int32) int {
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

func (p *twinPlanner) insert(tok int32, i int) {
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

func (p *twinPlanner) first(h int) int  { return int(p.hash[h] >> 16 & 0xffff) }
func (p *twinPlanner) slot(h int) int32 { return int32(p.hash[h] & hashNoSlot) }
func (p *twinPlanner) setSlot(h int, s int32) {
	p.hash[h] = p.hash[h]&^hashNoSlot | uint64(s)
}

func (p *twinPlanner) plan(r regionView, n int32, sel, out []int32, c *engineCounts) []topkOp {
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
			c.hits++
			if r.loaded[tok] != tok {
				r.loaded[tok] = tok
				p.ops = append(p.ops, topkOp{tok, tok})
				c.fills++
			}
		}
		return p.ops
	}
	p.planLong(r, newest, sel, out, c)
	return p.ops
}

func (p *twinPlanner) planLong(r regionView, newest int32, sel, out []int32, c *engineCounts) {
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
			c.fills++
		}
	}
	if newestSelected && r.loaded[S] != newest {
		r.loaded[S] = newest
		p.ops = append(p.ops, topkOp{int32(S), newest})
		c.newest++
	}
	c.hits += len(p.hitSlots)
	c.misses += m
}
