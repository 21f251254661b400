package engram

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/cxltier/cxltier/internal/errkind"

	"github.com/cxltier/cxltier/kernels"
)

// Planner says where a call's rows are hashed and given cache slots.
type Planner = kernels.Planner

const (
	// PlanAuto is PlanHost for now: the engine planner's CUDA kernel
	// (engram.cu) has not yet been measured on a GPU, and auto will
	// choose it only once it has been shown faster.
	PlanAuto = kernels.PlanAuto
	// PlanHost hashes and keeps the cache's tags on the host (hotset.go);
	// the engine only copies the rows to fetch.
	PlanHost = kernels.PlanHost
	// PlanEngine sends the ids to the engine, which hashes them, probes a
	// cache whose tags live in its own memory and fetches the misses in one
	// call (on a GPU one launch of engram.cu, on the CPU engine its Go
	// twin). With the cache, slots are known only when the call is done:
	// Pending.Slots is filled by Wait.
	PlanEngine = kernels.PlanEngine
)

// ParsePlanner reads "auto", "host" or "engine".
func ParsePlanner(s string) (Planner, error) {
	p, err := kernels.ParsePlanner(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrInput, err)
	}
	return p, nil
}

// enginePlan is one layer's state when the engine plans: the layout and
// hash constants in engine memory, the cache's tags, and an output area
// per protected call (counts and slots, read back by Wait).
type enginePlan struct {
	st             stepper
	layout, bypass engineLayout // with the cache, and without (sets 0)
	params, tags   kernels.Buffer
	out            kernels.Buffer
	outStride      int64 // bytes per output area
	epoch          uint64
}

// startEnginePlan prepares layer lc for engine planning.
func (p *Prefetcher) startEnginePlan(lc *layerCache) (*enginePlan, error) {
	st, ok := newStepper(p.eng)
	if !ok {
		return nil, fmt.Errorf("%w: engine %s cannot plan Engram rows", ErrInput, p.eng.Name())
	}
	t := lc.table
	tm, err := p.tableMap(t)
	if err != nil {
		return nil, err
	}
	lh, err := p.h.layer(t.Layer)
	if err != nil {
		return nil, err
	}
	slots := p.opts.Slots
	sets := cacheSets(slots)
	ep := &enginePlan{st: st, layout: engineLayout{hash: lh.hashRule, rows: t.Rows, table: tm,
		sets: sets, spillSlots: slots - sets*ways, protect: p.opts.Protect}}
	ep.bypass = ep.layout
	ep.bypass.sets, ep.bypass.spillSlots = 0, 0
	if err := ep.layout.check(); err != nil {
		return nil, fmt.Errorf("engram: layer %d: %w", t.Layer, err)
	}
	ep.outStride = (outBytes(slots) + 7) &^ 7
	// The kernel reads its layout from params: without a cache they must
	// be the bypass layout's (no sets), and there are no tags to probe.
	layout := &ep.layout
	if !p.opts.Cache {
		layout = &ep.bypass
	}
	if ep.params, err = p.upload(layout.paramBytes(), kernels.AsBytes(layout.params())); err == nil && p.opts.Cache {
		ep.tags, err = p.upload(ep.layout.tagBytes(), nil)
	}
	if err == nil {
		ep.out, err = p.eng.Alloc(int64(p.opts.Protect) * ep.outStride)
	}
	if err != nil {
		ep.free()
		return nil, err
	}
	return ep, nil
}

// forget needs nothing: a failed call's tags are in engine memory, and
// the call that fetched them was the engine's own.
func (ep *enginePlan) forget([]int32) {}

// upload allocates an engine buffer of n bytes holding b, then zeros.
func (p *Prefetcher) upload(n int64, b []byte) (kernels.Buffer, error) {
	buf, err := p.eng.Alloc(n)
	if err != nil {
		return nil, fmt.Errorf("engram: engine buffer of %d bytes: %w", n, err)
	}
	data := make([]byte, n)
	copy(data, b)
	if err := p.eng.Upload(buf, 0, data); err != nil {
		buf.Free()
		return nil, err
	}
	return buf, nil
}

func (ep *enginePlan) free() error {
	var first error
	for _, b := range []kernels.Buffer{ep.params, ep.tags, ep.out} {
		if b != nil {
			if err := b.Free(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// errTableMap means the map of a table's rows disagrees with the tier: a
// bug, caught before any engine reads from a wrong address.
var errTableMap = errkind.New(errkind.Damaged, "engram: table map disagrees with the tier")

// tableMap describes where t's rows lie for the engine, and checks it
// against the tier's own placement at the rows where stripes change and
// at random ones.
func (p *Prefetcher) tableMap(t *Table) (tableMap, error) {
	base, err := p.addr(t, 0)
	if err != nil {
		return tableMap{}, err
	}
	start := int64(p.r.DataStart())
	tm := tableMap{rowBytes: t.RowBytes, base: base, first: t.first, perStripe: t.perStr, stripe: t.stripe,
		stripe0: (int64(t.boundary) - start) / t.stripe, control: start, devices: p.devIDs}
	check := []int64{0, t.first - 1, t.first, t.first + t.perStr - 1, t.first + t.perStr, t.Rows - 1}
	rng := rand.New(rand.NewPCG(uint64(t.Rows), 7))
	for range 64 {
		check = append(check, rng.Int64N(t.Rows))
	}
	for _, row := range check {
		if row < 0 || row >= t.Rows {
			continue
		}
		want, err := p.addr(t, row)
		if err != nil {
			return tableMap{}, err
		}
		if got := tm.addr(row); got != want {
			return tableMap{}, fmt.Errorf("%w: layer %d row %d at %v, the tier says %v", errTableMap, t.Layer, row, got, want)
		}
	}
	return tm, nil
}

// prefetch checks the ids, lays out their windows and queues the call on
// the engine.
func (ep *enginePlan) prefetch(p *Prefetcher, lc *layerCache, histories, seqs [][]int64, start time.Time) (*Pending, error) {
	var windows []int64
	for b, ids := range seqs {
		var err error
		if windows, err = p.h.Windows(windows, history(histories, b), ids); err != nil {
			return nil, fmt.Errorf("sequence %d: %w", b, err)
		}
	}
	n := len(windows) / ep.layout.maxN() * ep.layout.rowsPerToken()
	if n > p.opts.Slots {
		return nil, fmt.Errorf("%w: %d rows in one call (%d slots)", ErrCacheTooSmall, n, p.opts.Slots)
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	ep.epoch++
	out := kernels.Span{Buf: ep.out, Offset: int64(ep.epoch%uint64(p.opts.Protect)) * ep.outStride}
	step := &engineStep{layout: &ep.layout, params: ep.params, tags: ep.tags, cache: lc.buf, windows: windows,
		epoch: ep.epoch, out: out}
	if !p.opts.Cache {
		step.layout, step.tags = &ep.bypass, nil
	}
	h, err := ep.st.plan(step)
	if err != nil {
		ep.epoch--
		return nil, fmt.Errorf("engram: layer %d: %w", lc.table.Layer, err)
	}
	p.metrics.Calls.Add(1)
	p.metrics.Rows.Add(uint64(n))
	pd := &Pending{h: h, start: start, p: p, lc: lc, rows: n}
	if !p.opts.Cache { // row i is in slot i, all fetched: nothing to read back
		pd.Slots = firstSlots(n)
		p.metrics.Fetched.Add(uint64(n))
		return pd, nil
	}
	pd.out = out
	return pd, nil
}

// readBack fills pd.Slots and the counters from the call's output area
// once it is done.
func (pd *Pending) readBack() error {
	b := make([]byte, outBytes(pd.rows))
	if err := pd.p.eng.Download(b, pd.out.Buf, pd.out.Offset); err != nil {
		return err
	}
	pd.Slots = make([]int32, pd.rows)
	c, err := readOut(b, pd.Slots)
	m := &pd.p.metrics
	m.Hits.Add(uint64(c.hits))
	m.Fetched.Add(uint64(c.fetched))
	if err != nil {
		return fmt.Errorf("engram: layer %d: %w", pd.lc.table.Layer, err)
	}
	return nil
}
