package topk

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cxltier/cxltier/kernels"
)

// Step is what one Resolve call did.
type Step struct {
	Hits   int           // selections found in the buffer (distinct tokens)
	Misses int           // selections that took an evicted slot
	Fills  int           // entries the table counted as resident but the slot lacked (first use of a slot)
	Newest int           // copies of the newest token into the reserved slot
	Bytes  int64         // bytes copied from the tier
	Plan   time.Duration // validating and planning on the CPU, before the gather
}

// Resolve resolves one decode step of one layer for a batch: reqs[b] with
// sequence length seqLens[b] selected topk[b*TopK : (b+1)*TopK] (token
// positions, -1 padded). It writes each selection's slot to out (same
// shape; -1 for padding): request reqs[b]'s slot s is row Row(reqs[b], s)
// of Buffer(layer). When it returns, every selected entry is in its slot;
// all copies of the batch went to the engine as one gather.
//
// Bad input — an unknown request, a request twice in the batch, a length
// beyond what was appended, a position ≥ the length or < -1 — is reported
// before anything changes.
func (p *Pool) Resolve(layer int, reqs []int, seqLens []int64, topk, out []int32) (Step, error) {
	held, herr := p.holdFenced("resolve")
	if herr != nil {
		return Step{}, herr
	}
	defer held.Done()
	start := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	seqs, err := p.checkStep(layer, reqs, seqLens, topk, out)
	if err != nil {
		return Step{}, err
	}
	done := p.claim(start)
	st, err := p.pl.resolve(start, layer, reqs, seqLens, seqs, topk, out)
	done(err)
	return st, err
}

// claim tells the pool's link of a step that started at start, when it has
// one and a deadline; the function it returns ends the claim once the
// step's entries are in (or it failed).
func (p *Pool) claim(start time.Time) func(error) {
	lk, d := p.cfg.Link, p.cfg.Deadline
	if lk == nil || d <= 0 {
		return func(error) {}
	}
	lk.Claim(start.Add(d))
	return func(err error) { lk.Done(err == nil && time.Since(start) > d) }
}

// hostPlanner keeps each request's tables in Go (table.go) and plans a
// step on the host; only the copies run on the engine.
type hostPlanner struct{ p *Pool }

func (h *hostPlanner) kind() Planner     { return PlanHost }
func (h *hostPlanner) maxContext() int64 { return 1<<31 - 1 }
func (h *hostPlanner) free() error       { return nil }

func (h *hostPlanner) register(_ int, s *seq) error {
	for l := range s.layers {
		s.layers[l].table = newTable(h.p.cfg.Slots)
	}
	return nil
}

func (h *hostPlanner) grown(int, int, *layerSeq, int) error { return nil }

func (h *hostPlanner) resolveIn(time.Time, int, []int, []int64, kernels.Span, kernels.Span) (Step, error) {
	return Step{}, fmt.Errorf("%w: ResolveIn needs engine planning (planner %v)", ErrBadConfig, PlanHost)
}

func (h *hostPlanner) tables(_, layer int, s *seq) (tokens, lru, loaded []int32, err error) {
	t := &s.layers[layer].table
	lru = make([]int32, len(t.lru))
	for i, v := range t.lru {
		lru[i] = int32(v)
	}
	return append([]int32(nil), t.tokens...), lru, append([]int32(nil), t.loaded...), nil
}

// resolve plans every request on its table and gathers the batch's copies.
func (h *hostPlanner) resolve(start time.Time, layer int, reqs []int, seqLens []int64, seqs []*seq, topk, out []int32) (Step, error) {
	p := h.p
	plans := p.plan(layer, seqs, seqLens, topk, out)
	var st Step
	rows := kernels.Rows{RowBytes: p.cfg.EntryBytes, Buf: p.bufs[layer], SlotStride: p.cfg.EntryBytes,
		Tier: p.rowTier[:0], Slots: p.rowSlots[:0]}
	defer func() { p.rowTier, p.rowSlots = rows.Tier, rows.Slots }() // reused by the next step
	for b, s := range seqs {
		ls, n := &s.layers[layer], plans[b].n
		st.Hits, st.Misses, st.Fills, st.Newest = st.Hits+n.hits, st.Misses+n.misses, st.Fills+n.fills, st.Newest+n.newest
		for _, c := range plans[b].copies {
			_, a := p.entryAt(ls, int64(c.token))
			rows.Tier = append(rows.Tier, a)
			rows.Slots = append(rows.Slots, p.Row(reqs[b], int(c.slot)))
		}
	}
	st.Bytes = int64(len(rows.Tier)) * p.cfg.EntryBytes
	st.Plan = time.Since(start)
	if len(rows.Tier) > 0 {
		h, err := p.eng.Gather(rows)
		if err == nil {
			err = h.Wait()
		}
		if err != nil {
			p.forget(seqs, layer, reqs, rows.Slots)
			return Step{}, fmt.Errorf("topk: layer %d: gather %d entries: %w", layer, len(rows.Tier), err)
		}
	}
	p.stats.add(st, time.Since(start))
	p.publishStats()
	return st, nil
}

// plan is one request's part of a step.
type plan struct {
	copies []copyOp
	n      stepCounts
}

// plan resolves every request of a step on its table. Requests are
// independent (each has its own table), so a batch is spread over up to
// GOMAXPROCS goroutines, each with its own scratch; p.mu is held.
func (p *Pool) plan(layer int, seqs []*seq, seqLens []int64, topk, out []int32) []plan {
	k := p.cfg.TopK
	if cap(p.plans) < len(seqs) {
		p.plans = make([]plan, len(seqs))
	}
	plans := p.plans[:len(seqs)]
	one := func(b int, sc *scratch) {
		pl := &plans[b]
		pl.copies, pl.n = seqs[b].layers[layer].table.resolve(seqLens[b], topk[b*k:(b+1)*k], out[b*k:(b+1)*k], sc, pl.copies[:0])
	}
	workers := min(runtime.GOMAXPROCS(0), len(seqs))
	if workers <= 1 {
		for b := range seqs {
			one(b, &p.sc)
		}
		return plans
	}
	for len(p.scs) < workers {
		p.scs = append(p.scs, &scratch{})
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func(sc *scratch) {
			defer wg.Done()
			for b := int(next.Add(1) - 1); b < len(seqs); b = int(next.Add(1) - 1) {
				one(b, sc)
			}
		}(p.scs[w])
	}
	wg.Wait()
	return plans
}

// forget marks the slots of a failed gather as holding nothing, so the
// next step copies them again.
func (p *Pool) forget(seqs []*seq, layer int, reqs []int, rows []int64) {
	per := int64(p.cfg.Slots + 1)
	for _, row := range rows {
		req, slot := int(row/per), row%per
		for b, s := range seqs {
			if reqs[b] == req {
				s.layers[layer].table.loaded[slot] = -1
			}
		}
	}
}

// checkStep validates a whole step before any of it is applied.
func (p *Pool) checkStep(layer int, reqs []int, seqLens []int64, topk, out []int32) ([]*seq, error) {
	k := p.cfg.TopK
	if len(topk) != len(reqs)*k || len(out) != len(topk) {
		return nil, fmt.Errorf("%w: %d requests need %d selections and outputs (top-k %d); got %d and %d",
			ErrBadInput, len(reqs), len(reqs)*k, k, len(topk), len(out))
	}
	seqs, err := p.checkRequests(layer, reqs, seqLens)
	if err != nil {
		return nil, err
	}
	for b, req := range reqs {
		for i, pos := range topk[b*k : (b+1)*k] {
			if pos < -1 || int64(pos) >= seqLens[b] {
				return nil, fmt.Errorf("%w: request %d: selection %d is position %d, length %d", ErrBadPosition, req, i, pos, seqLens[b])
			}
		}
	}
	return seqs, nil
}

// checkRequests validates a step's layer, requests and lengths.
func (p *Pool) checkRequests(layer int, reqs []int, seqLens []int64) ([]*seq, error) {
	switch {
	case layer < 0 || layer >= p.cfg.Layers:
		return nil, fmt.Errorf("%w: layer %d of %d", ErrBadInput, layer, p.cfg.Layers)
	case len(seqLens) != len(reqs):
		return nil, fmt.Errorf("%w: %d requests but %d lengths", ErrBadInput, len(reqs), len(seqLens))
	}
	seqs := make([]*seq, len(reqs))
	seen := make(map[int]bool, len(reqs))
	for b, req := range reqs {
		s, err := p.lookup(req)
		if err != nil {
			return nil, fmt.Errorf("batch row %d: %w", b, err)
		}
		if seen[req] {
			return nil, fmt.Errorf("%w: request %d twice in one batch", ErrBadInput, req)
		}
		seen[req] = true
		n, have := seqLens[b], s.layers[layer].length
		if n < 1 || n > have {
			return nil, fmt.Errorf("%w: request %d layer %d: length %d, %d entries appended", ErrNotAppended, req, layer, n, have)
		}
		seqs[b] = s
	}
	return seqs, nil
}

// SelectionRows is the gather that moves every valid selection of a step
// straight into slot i (selection i) of its request, with no slot table:
// what fetching without a buffer costs. Benchmarks use it as a baseline.
func (p *Pool) SelectionRows(layer int, reqs []int, topk []int32) (kernels.Rows, error) {
	held, herr := p.hold("selection")
	if herr != nil {
		return kernels.Rows{}, herr
	}
	defer held.Done()
	p.mu.Lock()
	defer p.mu.Unlock()
	k := p.cfg.TopK
	rows := kernels.Rows{RowBytes: p.cfg.EntryBytes, Buf: p.bufs[layer], SlotStride: p.cfg.EntryBytes}
	if layer < 0 || layer >= p.cfg.Layers || len(topk) != len(reqs)*k {
		return rows, fmt.Errorf("%w: layer %d, %d selections for %d requests", ErrBadInput, layer, len(topk), len(reqs))
	}
	for b, req := range reqs {
		s, err := p.lookup(req)
		if err != nil {
			return rows, err
		}
		ls := &s.layers[layer]
		for i, pos := range topk[b*k : (b+1)*k] {
			if pos < 0 {
				continue
			}
			if int64(pos) >= ls.length {
				return rows, fmt.Errorf("%w: request %d: position %d of %d", ErrBadPosition, req, pos, ls.length)
			}
			_, a := p.entryAt(ls, int64(pos))
			rows.Tier = append(rows.Tier, a)
			rows.Slots = append(rows.Slots, p.Row(req, i))
		}
	}
	return rows, nil
}
