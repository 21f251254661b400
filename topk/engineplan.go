package topk

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cxltier/cxltier/kernels"
)

// Planner says where a pool's slot tables live and who plans a step.
type Planner = kernels.Planner

const (
	// PlanAuto plans on the engine when it is a GPU engine that can plan
	// the pool's layout (kernels.TopKPlanner), else on the host.
	PlanAuto = kernels.PlanAuto
	// PlanHost keeps the tables in host memory and plans in Go; only the
	// copies run on the engine.
	PlanHost = kernels.PlanHost
	// PlanEngine keeps the tables in engine memory and lets the engine
	// plan: on a GPU, the kernels of kernels/topk.cu (one block per
	// request), so selections in GPU memory never cross the bus; on the
	// CPU engine, their Go twin.
	PlanEngine = kernels.PlanEngine
)

// ParsePlanner reads "auto", "host" or "engine".
func ParsePlanner(s string) (Planner, error) {
	p, err := kernels.ParsePlanner(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	return p, nil
}

// enginePlan is a pool's state when the engine plans: the tables of every
// request and layer in one engine buffer, and staging buffers for steps
// whose selections come from host memory.
type enginePlan struct {
	planner kernels.TopKPlanner
	layout  kernels.TopKLayout
	state   kernels.Buffer
	sel     kernels.Buffer // host selections uploaded here
	out     kernels.Buffer // slots downloaded from here
	reqs    []int32
	lens    []int32
}

// startEnginePlan decides the planner and, for the engine, allocates the
// tables.
func (p *Pool) startEnginePlan() error {
	planner, can := p.eng.(kernels.TopKPlanner)
	switch p.cfg.Planner {
	case PlanHost:
		return nil
	case PlanAuto:
		if !can || !strings.HasPrefix(p.eng.Name(), "cuda") {
			return nil
		}
	case PlanEngine:
		if !can {
			return fmt.Errorf("%w: engine %s cannot plan top-k steps", ErrBadConfig, p.eng.Name())
		}
	default:
		return fmt.Errorf("%w: %v", ErrBadConfig, p.cfg.Planner)
	}
	l := kernels.TopKLayout{Slots: p.cfg.Slots, TopK: p.cfg.TopK, Layers: p.cfg.Layers, ExtentEntries: p.extentEntries,
		EntryBytes: p.cfg.EntryBytes, MaxExtents: int((p.cfg.MaxContext + p.extentEntries - 1) / p.extentEntries)}
	if err := planner.CanPlanTopK(l); err != nil {
		if p.cfg.Planner == PlanAuto {
			return nil // the host can
		}
		return fmt.Errorf("%w: %v", ErrBadConfig, err)
	}
	n := int64(p.cfg.MaxRequests) * int64(p.cfg.Layers) * l.RegionBytes()
	state, err := p.eng.Alloc(n)
	if err != nil {
		return fmt.Errorf("topk: slot tables (%d bytes): %w", n, err)
	}
	p.ep = &enginePlan{planner: planner, layout: l, state: state}
	return nil
}

func (ep *enginePlan) free() error {
	var first error
	for _, b := range []kernels.Buffer{ep.state, ep.sel, ep.out} {
		if b != nil {
			if err := b.Free(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// Planner is where the pool plans (PlanHost or PlanEngine, never PlanAuto).
func (p *Pool) Planner() Planner {
	if p.ep != nil {
		return PlanEngine
	}
	return PlanHost
}

// regionOffset is where request req's tables of layer start in the state.
func (ep *enginePlan) regionOffset(req, layer int) int64 {
	return (int64(req)*int64(ep.layout.Layers) + int64(layer)) * ep.layout.RegionBytes()
}

// resetTables writes request req's initial tables for every layer; p.mu
// is held.
func (p *Pool) resetTables(req int, s *seq) error {
	l := p.ep.layout
	all := make([]byte, 0, int64(l.Layers)*l.RegionBytes())
	for _, ls := range s.layers {
		if len(ls.extents) > l.MaxExtents {
			return fmt.Errorf("%w: request %d: %d extents, the engine's tables hold %d (MaxContext %d)",
				ErrBadInput, req, len(ls.extents), l.MaxExtents, p.cfg.MaxContext)
		}
		addrs := make([]kernels.Addr, len(ls.extents))
		for i, e := range ls.extents {
			addrs[i] = e.addr
		}
		all = append(all, l.InitialRegion(addrs)...)
	}
	return p.eng.Upload(p.ep.state, p.ep.regionOffset(req, 0), all)
}

// pushExtents writes the addresses of extents [from, len) of a layer to the
// engine's tables after the sequence grew; p.mu is held.
func (p *Pool) pushExtents(req, layer int, ls *layerSeq, from int) error {
	l := p.ep.layout
	if len(ls.extents) > l.MaxExtents {
		return fmt.Errorf("%w: request %d layer %d: %d entries exceed MaxContext %d", ErrBadInput, req, layer, ls.length, p.cfg.MaxContext)
	}
	if from == len(ls.extents) {
		return nil
	}
	addrs := make([]kernels.Addr, len(ls.extents)-from)
	for i := range addrs {
		addrs[i] = ls.extents[from+i].addr
	}
	return p.eng.Upload(p.ep.state, p.ep.regionOffset(req, layer)+l.ExtentsOffset()+8*int64(from), kernels.AsBytes(addrs))
}

// ResolveIn resolves one step whose selections and output slots are in
// engine memory (int32 [len(reqs)][TopK] at sel and out; for a GPU engine,
// e.g. wrapped tensors): with engine planning they never leave it. Request
// and length errors are found on the host; a bad selection is found by the
// engine, reported with its request and position, and changes nothing.
func (p *Pool) ResolveIn(layer int, reqs []int, seqLens []int64, sel, out kernels.Span) (Step, error) {
	start := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ep == nil {
		return Step{}, fmt.Errorf("%w: ResolveIn needs engine planning (planner %v)", ErrBadConfig, p.Planner())
	}
	if _, err := p.checkRequests(layer, reqs, seqLens); err != nil {
		return Step{}, err
	}
	return p.planOnEngine(start, layer, reqs, seqLens, sel, out, false)
}

// resolveOnEngine is Resolve with engine planning: host selections are
// checked here, uploaded, planned and the slots downloaded.
func (p *Pool) resolveOnEngine(start time.Time, layer int, reqs []int, seqLens []int64, topk, out []int32) (Step, error) {
	n := int64(len(topk)) * 4
	if n == 0 {
		return p.planOnEngine(start, layer, reqs, seqLens, kernels.Span{}, kernels.Span{}, true)
	}
	ep := p.ep
	if ep.sel == nil || ep.sel.Len() < n {
		for _, b := range []*kernels.Buffer{&ep.sel, &ep.out} {
			if *b != nil {
				(*b).Free()
				*b = nil
			}
			buf, err := p.eng.Alloc(n)
			if err != nil {
				return Step{}, fmt.Errorf("topk: selection staging of %d bytes: %w", n, err)
			}
			*b = buf
		}
	}
	if err := p.eng.Upload(ep.sel, 0, kernels.AsBytes(topk)); err != nil {
		return Step{}, fmt.Errorf("topk: upload selections: %w", err)
	}
	st, err := p.planOnEngine(start, layer, reqs, seqLens, kernels.Span{Buf: ep.sel}, kernels.Span{Buf: ep.out}, true)
	if err != nil {
		return st, err
	}
	if err := p.eng.Download(kernels.AsBytes(out), ep.out, 0); err != nil {
		return st, fmt.Errorf("topk: download slots: %w", err)
	}
	return st, nil
}

// planOnEngine runs a checked step on the engine; p.mu is held.
func (p *Pool) planOnEngine(start time.Time, layer int, reqs []int, seqLens []int64, sel, out kernels.Span, checked bool) (Step, error) {
	ep := p.ep
	ep.reqs, ep.lens = ep.reqs[:0], ep.lens[:0]
	for b, r := range reqs {
		ep.reqs, ep.lens = append(ep.reqs, int32(r)), append(ep.lens, int32(seqLens[b]))
	}
	if len(reqs) == 0 {
		return Step{}, nil
	}
	plan := time.Since(start)
	c, err := ep.planner.PlanTopK(kernels.TopKStep{Layout: ep.layout, Layer: layer, State: ep.state, Data: p.bufs[layer],
		Reqs: ep.reqs, Lens: ep.lens, Sel: sel, Out: out, Checked: checked})
	var bad *kernels.BadSelection
	switch {
	case errors.As(err, &bad):
		return Step{}, fmt.Errorf("%w: request %d: selection %d is position %d, length %d", ErrBadPosition, reqs[bad.Row], bad.Index, bad.Pos, bad.Len)
	case err != nil:
		p.forgetOnEngine(reqs, layer)
		return Step{}, fmt.Errorf("topk: layer %d: engine step: %w", layer, err)
	}
	st := Step{Hits: c.Hits, Misses: c.Misses, Fills: c.Fills, Newest: c.Newest, Bytes: int64(c.Copies()) * p.cfg.EntryBytes, Plan: plan}
	p.stats.add(st, time.Since(start))
	p.publishStats()
	return st, nil
}

// forgetOnEngine marks every slot of the batch's requests in layer as
// holding nothing after a failed step, so the next step copies again.
func (p *Pool) forgetOnEngine(reqs []int, layer int) {
	l := p.ep.layout
	none := make([]byte, 4*(l.Slots+1))
	for i := range none {
		none[i] = 0xff
	}
	for _, r := range reqs {
		p.eng.Upload(p.ep.state, p.ep.regionOffset(r, layer)+4*int64(l.Slots+1), none)
	}
}

// tables returns a copy of request req's slot table, LRU order and loaded
// tokens of layer, wherever they live (for tests and inspection).
func (p *Pool) tables(req, layer int) (tokens, lru, loaded []int32, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, err := p.lookup(req)
	if err != nil {
		return nil, nil, nil, err
	}
	if p.ep == nil {
		t := &s.layers[layer].table
		lru = make([]int32, len(t.lru))
		for i, v := range t.lru {
			lru[i] = int32(v)
		}
		return append([]int32(nil), t.tokens...), lru, append([]int32(nil), t.loaded...), nil
	}
	S := p.cfg.Slots
	all := make([]int32, 3*S+2)
	if err := p.eng.Download(kernels.AsBytes(all), p.ep.state, p.ep.regionOffset(req, layer)); err != nil {
		return nil, nil, nil, err
	}
	return all[:S+1], all[2*S+2:], all[S+1 : 2*S+2], nil
}
