package topk

import (
	"errors"
	"fmt"
	"time"

	"github.com/cxltier/cxltier/kernels"
)

// Planner says where a pool's slot tables live and who plans a step.
type Planner = kernels.Planner

const (
	// PlanAuto plans on the engine when the engine runs kernels (a GPU:
	// kernels.Launcher) and its limits fit the pool's layout, else on the
	// host.
	PlanAuto = kernels.PlanAuto
	// PlanHost keeps the tables in host memory and plans in Go; only the
	// copies run on the engine.
	PlanHost = kernels.PlanHost
	// PlanEngine keeps the tables in engine memory and lets the engine
	// plan: on a GPU, the kernels of topk.cu (one block per request), so
	// selections in GPU memory never cross the bus; on the CPU engine,
	// their Go twin.
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

// planner is where a pool's slot tables live and who plans its steps,
// chosen once by New: hostPlanner (tables in Go, resolve.go) or
// enginePlanner (tables in engine memory). Every method runs with p.mu held.
type planner interface {
	kind() Planner
	// maxContext is the longest a request's layer may grow.
	maxContext() int64
	// register sets up the tables of a new request.
	register(req int, s *seq) error
	// grown is told that a layer grew from extent from on.
	grown(req, layer int, ls *layerSeq, from int) error
	// resolve runs a checked step whose selections are in host memory.
	resolve(start time.Time, layer int, reqs []int, seqLens []int64, seqs []*seq, topk, out []int32) (Step, error)
	// resolveIn runs a step whose requests were checked and whose
	// selections and slots are in engine memory.
	resolveIn(start time.Time, layer int, reqs []int, seqLens []int64, sel, out kernels.Span) (Step, error)
	// tables copies out a request's slot table, LRU order and loaded tokens.
	tables(req, layer int, s *seq) (tokens, lru, loaded []int32, err error)
	free() error
}

// newPlanner picks the pool's planner.
func (p *Pool) newPlanner() (planner, error) {
	host := &hostPlanner{p: p}
	st, can := newStepper(p.eng)
	switch p.cfg.Planner {
	case PlanHost:
		return host, nil
	case PlanAuto:
		if _, gpu := p.eng.(kernels.Launcher); !can || !gpu {
			return host, nil // the CPU twin is for tests, not speed
		}
	case PlanEngine:
		if !can {
			return nil, fmt.Errorf("%w: engine %s cannot plan top-k steps", ErrBadConfig, p.eng.Name())
		}
	default:
		return nil, fmt.Errorf("%w: %v", ErrBadConfig, p.cfg.Planner)
	}
	l := engineLayout{Slots: p.cfg.Slots, TopK: p.cfg.TopK, Layers: p.cfg.Layers, ExtentEntries: p.extentEntries,
		EntryBytes: p.cfg.EntryBytes, MaxExtents: int((p.cfg.MaxContext + p.extentEntries - 1) / p.extentEntries)}
	err := l.check()
	if err == nil {
		err = st.fits(l)
	}
	if err != nil {
		st.close()
		if p.cfg.Planner == PlanAuto {
			return host, nil // the host can
		}
		return nil, err
	}
	n := int64(p.cfg.MaxRequests) * int64(p.cfg.Layers) * l.regionBytes()
	state, err := p.eng.Alloc(n)
	if err != nil {
		st.close()
		return nil, fmt.Errorf("topk: slot tables (%d bytes): %w", n, err)
	}
	return &enginePlanner{p: p, st: st, layout: l, state: state}, nil
}

// Planner is where the pool plans (PlanHost or PlanEngine, never PlanAuto).
func (p *Pool) Planner() Planner { return p.pl.kind() }

// enginePlanner keeps the tables of every request and layer in one engine
// buffer and plans steps with a stepper; host selections go through
// staging buffers.
type enginePlanner struct {
	p      *Pool
	st     stepper
	layout engineLayout
	state  kernels.Buffer
	sel    kernels.Buffer // host selections uploaded here
	out    kernels.Buffer // slots downloaded from here
	reqs   []int32
	lens   []int32
}

func (ep *enginePlanner) kind() Planner     { return PlanEngine }
func (ep *enginePlanner) maxContext() int64 { return ep.p.cfg.MaxContext }

func (ep *enginePlanner) free() error {
	first := ep.st.close()
	for _, b := range []kernels.Buffer{ep.state, ep.sel, ep.out} {
		if b != nil {
			if err := b.Free(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// regionOffset is where request req's tables of layer start in the state.
func (ep *enginePlanner) regionOffset(req, layer int) int64 {
	return (int64(req)*int64(ep.layout.Layers) + int64(layer)) * ep.layout.regionBytes()
}

// register writes request req's initial tables for every layer.
func (ep *enginePlanner) register(req int, s *seq) error {
	l := ep.layout
	all := make([]byte, 0, int64(l.Layers)*l.regionBytes())
	for _, ls := range s.layers {
		if len(ls.extents) > l.MaxExtents {
			return fmt.Errorf("%w: request %d: %d extents, the engine's tables hold %d (MaxContext %d)",
				ErrBadInput, req, len(ls.extents), l.MaxExtents, ep.p.cfg.MaxContext)
		}
		addrs := make([]kernels.Addr, len(ls.extents))
		for i, e := range ls.extents {
			addrs[i] = e.addr
		}
		all = append(all, l.initialRegion(addrs)...)
	}
	return ep.p.eng.Upload(ep.state, ep.regionOffset(req, 0), all)
}

// grown writes the addresses of extents [from, len) of a layer to the
// engine's tables after the sequence grew.
func (ep *enginePlanner) grown(req, layer int, ls *layerSeq, from int) error {
	l := ep.layout
	if len(ls.extents) > l.MaxExtents {
		return fmt.Errorf("%w: request %d layer %d: %d entries exceed MaxContext %d", ErrBadInput, req, layer, ls.length, ep.p.cfg.MaxContext)
	}
	if from == len(ls.extents) {
		return nil
	}
	addrs := make([]kernels.Addr, len(ls.extents)-from)
	for i := range addrs {
		addrs[i] = ls.extents[from+i].addr
	}
	return ep.p.eng.Upload(ep.state, ep.regionOffset(req, layer)+l.extentsOffset()+8*int64(from), kernels.AsBytes(addrs))
}

// ResolveIn resolves one step whose selections and output slots are in
// engine memory (int32 [len(reqs)][TopK] at sel and out; for a GPU engine,
// e.g. wrapped tensors): with engine planning they never leave it. Request
// and length errors are found on the host; a bad selection is found by the
// engine, reported with its request and position, and changes nothing.
func (p *Pool) ResolveIn(layer int, reqs []int, seqLens []int64, sel, out kernels.Span) (Step, error) {
	held, herr := p.holdFenced("resolve")
	if herr != nil {
		return Step{}, herr
	}
	defer held.Done()
	start := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.checkRequests(layer, reqs, seqLens); err != nil {
		return Step{}, err
	}
	done := p.claim(start)
	st, err := p.pl.resolveIn(start, layer, reqs, seqLens, sel, out)
	done(err)
	return st, err
}

// resolve uploads host selections, plans them and downloads the slots.
func (ep *enginePlanner) resolve(start time.Time, layer int, reqs []int, seqLens []int64, _ []*seq, topk, out []int32) (Step, error) {
	n := int64(len(topk)) * 4
	if n == 0 {
		return ep.step(start, layer, reqs, seqLens, kernels.Span{}, kernels.Span{}, true)
	}
	if ep.sel == nil || ep.sel.Len() < n {
		for _, b := range []*kernels.Buffer{&ep.sel, &ep.out} {
			if *b != nil {
				(*b).Free()
				*b = nil
			}
			buf, err := ep.p.eng.Alloc(n)
			if err != nil {
				return Step{}, fmt.Errorf("topk: selection staging of %d bytes: %w", n, err)
			}
			*b = buf
		}
	}
	if err := ep.p.eng.Upload(ep.sel, 0, kernels.AsBytes(topk)); err != nil {
		return Step{}, fmt.Errorf("topk: upload selections: %w", err)
	}
	st, err := ep.step(start, layer, reqs, seqLens, kernels.Span{Buf: ep.sel}, kernels.Span{Buf: ep.out}, true)
	if err != nil {
		return st, err
	}
	if err := ep.p.eng.Download(kernels.AsBytes(out), ep.out, 0); err != nil {
		return st, fmt.Errorf("topk: download slots: %w", err)
	}
	return st, nil
}

func (ep *enginePlanner) resolveIn(start time.Time, layer int, reqs []int, seqLens []int64, sel, out kernels.Span) (Step, error) {
	return ep.step(start, layer, reqs, seqLens, sel, out, false)
}

// step runs a step on the engine.
func (ep *enginePlanner) step(start time.Time, layer int, reqs []int, seqLens []int64, sel, out kernels.Span, checked bool) (Step, error) {
	p := ep.p
	ep.reqs, ep.lens = ep.reqs[:0], ep.lens[:0]
	for b, r := range reqs {
		ep.reqs, ep.lens = append(ep.reqs, int32(r)), append(ep.lens, int32(seqLens[b]))
	}
	if len(reqs) == 0 {
		return Step{}, nil
	}
	plan := time.Since(start)
	s := &engineStep{layout: ep.layout, layer: layer, state: ep.state, data: p.bufs[layer],
		reqs: ep.reqs, lens: ep.lens, sel: sel, out: out, checked: checked}
	if err := s.checkShapes(); err != nil {
		return Step{}, fmt.Errorf("topk: layer %d: %w", layer, err)
	}
	c, err := ep.st.plan(s)
	var bad *badSelection
	switch {
	case errors.As(err, &bad):
		return Step{}, fmt.Errorf("%w: request %d: selection %d is position %d, length %d", ErrBadPosition, reqs[bad.row], bad.index, bad.pos, bad.len)
	case err != nil:
		ep.forget(reqs, layer)
		return Step{}, fmt.Errorf("topk: layer %d: engine step: %w", layer, err)
	}
	st := Step{Hits: c.hits, Misses: c.misses, Fills: c.fills, Newest: c.newest, Bytes: int64(c.copies()) * p.cfg.EntryBytes, Plan: plan}
	p.stats.add(st, time.Since(start))
	p.publishStats()
	return st, nil
}

// forget marks every slot of the batch's requests in layer as holding
// nothing after a failed step, so the next step copies again.
func (ep *enginePlanner) forget(reqs []int, layer int) {
	l := ep.layout
	none := make([]byte, 4*(l.Slots+1))
	for i := range none {
		none[i] = 0xff
	}
	for _, r := range reqs {
		ep.p.eng.Upload(ep.state, ep.regionOffset(r, layer)+4*int64(l.Slots+1), none)
	}
}

func (ep *enginePlanner) tables(req, layer int, _ *seq) (tokens, lru, loaded []int32, err error) {
	S := ep.layout.Slots
	all := make([]int32, 3*S+2)
	if err := ep.p.eng.Download(kernels.AsBytes(all), ep.state, ep.regionOffset(req, layer)); err != nil {
		return nil, nil, nil, err
	}
	return all[:S+1], all[2*S+2:], all[S+1 : 2*S+2], nil
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
	return p.pl.tables(req, layer, s)
}
