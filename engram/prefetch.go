package engram

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cxltier/cxltier/internal/errkind"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// ErrCacheTooSmall: one call needs more distinct rows than the cache holds.
var ErrCacheTooSmall = errkind.New(errkind.NoSpace, "engram: more distinct rows in one call than cache slots")

// PrefetchOptions configures a Prefetcher.
type PrefetchOptions struct {
	// Slots is the number of rows the device cache holds per layer. Hot
	// rows stay there across calls; every call's rows get a slot.
	Slots int
	// Deadline is the time allowed from a call to its rows being ready
	// (the Engram paper's per-layer budget is ~56 µs).
	Deadline time.Duration
	// Protect is how many recent calls' rows may not be evicted (default 2:
	// the call being consumed and the one prefetched ahead of it).
	Protect int
	// Cache keeps hot rows across calls: a row already in the buffer is
	// not fetched again. Planned on the host (hotset.go), that bookkeeping
	// measured costlier on a GPU than the fetches it saved (README,
	// "Engram"), so it is off by default. Without it every call fetches all of its
	// rows into slots 0..n-1, which a call may then overwrite: rows must be
	// consumed before the next call for the same layer (in stream order on
	// a GPU, as the forward-pass hook does).
	Cache bool
	// Planner says who hashes the ids and keeps the cache's tags: the host
	// (the default) or the engine (PlanEngine: one engine call per
	// prefetch, and at most Slots rows per call).
	Planner Planner
	// Ranges are the engine ranges of the tier's devices when the caller
	// registered them already (an engine maps a tier once, however many
	// pools and prefetchers use it); nil registers them here, and Close
	// unregisters them.
	Ranges []kernels.RangeID
	// Link, when set, is told each call's deadline (Deadline after the
	// call) and when its rows are in: tier/link's arbiter, which makes the
	// bulk copies of every process on the node wait while a call is due.
	Link Claimer
}

// Claimer is told of transfers with a deadline: Claim when one starts,
// Done when it ends (missed: ready past the deadline), in that order.
type Claimer interface {
	Claim(deadline time.Time)
	Done(missed bool)
}

// Prefetcher gathers Engram rows from tier tables into a per-layer cache
// buffer of the engine. Each call maps every row a batch needs to a cache
// slot, fetches the rows not already cached in one engine call, and returns
// the slot of every row for the model's embedding lookup.
type Prefetcher struct {
	h      *Hasher
	eng    kernels.Engine
	devIDs []kernels.RangeID // engine range of each tier device
	// ownRanges: NewPrefetcher registered devIDs, and Close unregisters them.
	ownRanges bool
	c         *tier.Client
	r         *tier.Region
	// unregister takes the prefetcher off its client's closers.
	unregister func() bool
	closed     atomic.Bool
	opts       PrefetchOptions
	layers     map[int]*layerCache
	metrics    Metrics
}

// Metrics are cumulative counters, safe to read at any time.
type Metrics struct {
	Calls, Rows, Hits, Fetched, DeadlineMisses atomic.Uint64
	ReadyNanos                                 atomic.Uint64 // sum of call → ready times
}

type layerCache struct {
	mu    sync.Mutex
	table *Table
	buf   kernels.Buffer
	pl    layerPlanner
}

// layerPlanner is how a layer's calls get their rows and slots, chosen
// once by NewPrefetcher: hostLayer (hashing and tags on the host) or
// enginePlan (both on the engine, engineplan.go).
type layerPlanner interface {
	// prefetch checks and queues one call; lc.mu is not held.
	prefetch(p *Prefetcher, lc *layerCache, histories, seqs [][]int64, start time.Time) (*Pending, error)
	// forget empties slots whose rows a failed call may not have
	// fetched; lc.mu is held.
	forget(slots []int32)
	free() error
}

// NewPrefetcher registers every tier device with the engine and allocates a
// cache of opts.Slots rows for each table's layer.
//
// The prefetcher is registered with client c, so that closing the client
// closes it (after the copies in flight) before the tier goes.
func NewPrefetcher(eng kernels.Engine, c *tier.Client, h *Hasher, tables []*Table, opts PrefetchOptions) (*Prefetcher, error) {
	held, err := c.Hold()
	if err != nil {
		return nil, fmt.Errorf("engram: prefetcher: %w", err)
	}
	defer held.Done()
	r := c.Region()
	if opts.Slots <= 0 {
		return nil, fmt.Errorf("%w: %d cache slots", ErrGeometry, opts.Slots)
	}
	if opts.Protect <= 0 {
		opts.Protect = 2
	}
	switch opts.Planner {
	case PlanAuto:
		opts.Planner = PlanHost
	case PlanHost, PlanEngine:
	default:
		return nil, fmt.Errorf("%w: %v", ErrInput, opts.Planner)
	}
	p := &Prefetcher{h: h, eng: eng, c: c, r: r, opts: opts, layers: map[int]*layerCache{}, devIDs: opts.Ranges}
	switch {
	case opts.Ranges == nil:
		var err error
		if p.devIDs, err = kernels.RegisterAll(eng, r.NumDevices(), r.Device); err != nil {
			return nil, fmt.Errorf("engram: %w", err)
		}
		p.ownRanges = true
	case len(opts.Ranges) != r.NumDevices():
		return nil, fmt.Errorf("%w: %d engine ranges for %d tier devices", ErrInput, len(opts.Ranges), r.NumDevices())
	}
	for _, t := range tables {
		buf, err := eng.Alloc(int64(opts.Slots) * t.RowBytes)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("engram: cache for layer %d: %w", t.Layer, err)
		}
		if t.Rows > maxCachedRow {
			buf.Free()
			p.Close()
			return nil, fmt.Errorf("%w: layer %d has %d rows, the cache tags at most %d", ErrGeometry, t.Layer, t.Rows, int64(maxCachedRow))
		}
		lc := &layerCache{table: t, buf: buf}
		p.layers[t.Layer] = lc
		if opts.Planner == PlanEngine {
			lc.pl, err = p.startEnginePlan(lc)
		} else {
			lc.pl, err = newHostLayer(opts.Slots, uint64(opts.Protect))
		}
		if err != nil {
			p.Close()
			return nil, err
		}
	}
	p.unregister = c.OnClose(p.close)
	return p, nil
}

// Options are the prefetcher's options, defaults filled in.
func (p *Prefetcher) Options() PrefetchOptions { return p.opts }

// Metrics returns the prefetcher's counters.
func (p *Prefetcher) Metrics() *Metrics { return &p.metrics }

// Layers lists the layers the prefetcher has tables for, in order.
func (p *Prefetcher) Layers() []int {
	ls := make([]int, 0, len(p.layers))
	for l := range p.layers {
		ls = append(ls, l)
	}
	slices.Sort(ls)
	return ls
}

// CacheBuffer is layer's cache buffer: slot s holds a row at s × RowBytes.
func (p *Prefetcher) CacheBuffer(layer int) (kernels.Buffer, error) {
	lc, ok := p.layers[layer]
	if !ok {
		return nil, fmt.Errorf("%w: no table for layer %d", ErrInput, layer)
	}
	return lc.buf, nil
}

// Pending is a prefetch in flight.
type Pending struct {
	// Slots holds, per position and head (the Hash layout), the cache slot
	// of that row in the layer's CacheBuffer. With engine planning and the
	// cache it is filled by Wait; read it after Wait.
	Slots []int32
	h     kernels.Handle
	start time.Time
	// claimed: the call's deadline is claimed on the link until Wait.
	claimed bool
	p       *Prefetcher
	waited  bool
	ready   time.Duration
	// lc and fetched: the layer and the slots this call fetches into, to
	// drop from the cache if the fetch fails.
	lc      *layerCache
	fetched []int32
	// rows: the call's rows; out: an engine-planned call's output area,
	// read back by Wait (out.Buf nil: nothing to read back).
	rows int
	out  kernels.Span
	err  error // of the read back
}

// Rows is the number of rows the call hashed (len(Slots) once known).
func (pd *Pending) Rows() int { return pd.rows }

// Wait blocks until the rows are in the cache and returns the time from
// the call to readiness; a time past the deadline is counted as a miss.
func (pd *Pending) Wait() (time.Duration, error) {
	if pd.waited {
		return pd.ready, pd.err
	}
	err := pd.h.Wait()
	if pd.claimed {
		pd.claimed = false
		pd.p.opts.Link.Done(err == nil && time.Since(pd.start) > pd.p.opts.Deadline)
	}
	if err != nil {
		pd.lc.mu.Lock()
		pd.lc.pl.forget(pd.fetched) // the slots may not hold their rows
		pd.lc.mu.Unlock()
		return 0, err
	}
	// Rows are ready here; reading an engine-planned call's slots back to
	// the host comes after (a GPU consumer would read them where they are).
	pd.waited, pd.ready = true, time.Since(pd.start)
	if pd.out.Buf != nil {
		if pd.err = pd.readBack(); pd.err != nil {
			return pd.ready, pd.err
		}
	}
	m := &pd.p.metrics
	m.ReadyNanos.Add(uint64(pd.ready))
	if pd.p.opts.Deadline > 0 && pd.ready > pd.p.opts.Deadline {
		m.DeadlineMisses.Add(1)
	}
	return pd.ready, nil
}

// Prefetch hashes a batch for layer (seqs[b] are new ids of sequence b,
// histories[b] the ids before them; histories may be nil for prefill) and
// starts fetching the rows that are not cached.
func (p *Prefetcher) Prefetch(layer int, histories, seqs [][]int64) (*Pending, error) {
	start := time.Now()
	held, err := p.c.Hold()
	if err != nil { // the tables go with the mapping: a copy would fault
		return nil, fmt.Errorf("engram: prefetch: %w", err)
	}
	defer held.Done()
	if p.closed.Load() {
		return nil, fmt.Errorf("engram: prefetch: the prefetcher is closed: %w", tier.ErrClosed)
	}
	lc, ok := p.layers[layer]
	if !ok {
		return nil, fmt.Errorf("%w: no table for layer %d", ErrInput, layer)
	}
	if histories != nil && len(histories) != len(seqs) {
		return nil, fmt.Errorf("%w: %d histories for %d sequences", ErrInput, len(histories), len(seqs))
	}
	link := p.opts.Link
	if link == nil || p.opts.Deadline <= 0 {
		return lc.pl.prefetch(p, lc, histories, seqs, start)
	}
	link.Claim(start.Add(p.opts.Deadline))
	pd, err := lc.pl.prefetch(p, lc, histories, seqs, start)
	if err != nil {
		link.Done(false)
		return nil, err
	}
	pd.claimed = true
	return pd, nil
}

// hostLayer hashes a call's rows and keeps the cache's tags on the host
// (hotSet); the engine only copies the rows to fetch.
type hostLayer struct {
	hot  *hotSet
	miss []int64 // rows fetched by the current call, in the order of its fetched slots
}

func newHostLayer(slots int, protect uint64) (*hostLayer, error) {
	hot, err := newHotSet(slots, protect)
	if err != nil {
		return nil, err
	}
	return &hostLayer{hot: hot}, nil
}

func (hl *hostLayer) free() error { return nil }

// forget drops the slots from the cache, so that no later call takes
// them for hits.
func (hl *hostLayer) forget(slots []int32) {
	for _, s := range slots {
		hl.hot.drop(s)
	}
}

func (hl *hostLayer) prefetch(p *Prefetcher, lc *layerCache, histories, seqs [][]int64, start time.Time) (*Pending, error) {
	layer := lc.table.Layer
	var rows []int64
	for b, ids := range seqs {
		var err error
		if rows, err = p.h.Hash(rows, layer, history(histories, b), ids); err != nil {
			return nil, fmt.Errorf("sequence %d: %w", b, err)
		}
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	var slots, miss []int32
	var err error
	if !p.opts.Cache {
		slots, miss, err = hl.bypass(rows, p.opts.Slots)
	} else {
		slots, miss, err = hl.assign(rows)
	}
	if err != nil {
		return nil, err
	}
	req := kernels.Rows{RowBytes: lc.table.RowBytes, Buf: lc.buf, Tier: make([]kernels.Addr, len(miss)), Slots: make([]int64, len(miss))}
	for i, s := range miss {
		a, err := p.addr(lc.table, hl.miss[i])
		if err != nil {
			hl.hot.abort(miss)
			return nil, err
		}
		req.Tier[i], req.Slots[i] = a, int64(s)
	}
	h, err := p.eng.Gather(req)
	if err != nil {
		hl.hot.abort(miss)
		return nil, err
	}
	m := &p.metrics
	m.Calls.Add(1)
	m.Rows.Add(uint64(len(rows)))
	m.Fetched.Add(uint64(len(miss)))
	m.Hits.Add(uint64(len(rows) - len(miss)))
	return &Pending{Slots: slots, h: h, start: start, p: p, lc: lc, fetched: miss, rows: len(rows)}, nil
}

// history is sequence b's history, nil when there are none.
func history(histories [][]int64, b int) []int64 {
	if histories == nil {
		return nil
	}
	return histories[b]
}

// addr is the engine address of a table row. On a one-device tier the
// device offset is the tier offset (no striping to undo).
func (p *Prefetcher) addr(t *Table, row int64) (kernels.Addr, error) {
	off := t.RowOffset(row)
	if len(p.devIDs) == 1 {
		return kernels.At(p.devIDs[0], int64(off)), nil
	}
	dev, devOff, _, err := p.r.Locate(off)
	if err != nil {
		return 0, err
	}
	return kernels.At(p.devIDs[dev], devOff), nil
}

// assign gives every row a slot: cached rows keep theirs, others take one
// (hotSet). It returns the slot per row and the slots to fetch, whose rows
// it leaves in hl.miss.
func (hl *hostLayer) assign(rows []int64) ([]int32, []int32, error) {
	hl.hot.begin()
	slots := make([]int32, len(rows))
	var miss []int32
	hl.miss = hl.miss[:0]
	const ahead = 16 // rows whose tag lines are on their way
	for i := range min(ahead, len(rows)) {
		hl.hot.prefetch(rows[i])
	}
	for i, r := range rows {
		if i+ahead < len(rows) {
			hl.hot.prefetch(rows[i+ahead])
		}
		s, fetch, ok := hl.hot.lookup(r)
		if !ok {
			hl.hot.abort(miss)
			return nil, nil, fmt.Errorf("%w: row %d of %d found no free way and no spill slot (%d slots)", ErrCacheTooSmall, i, len(rows), hl.hot.slots())
		}
		if fetch {
			miss = append(miss, s)
			hl.miss = append(hl.miss, r)
		}
		slots[i] = s
	}
	return slots, miss, nil
}

// bypass places row i in slot i and fetches them all.
func (hl *hostLayer) bypass(rows []int64, slots int) ([]int32, []int32, error) {
	if len(rows) > slots {
		return nil, nil, fmt.Errorf("%w: %d rows (%d slots)", ErrCacheTooSmall, len(rows), slots)
	}
	hl.miss = append(hl.miss[:0], rows...)
	in := firstSlots(len(rows))
	return in, in, nil
}

// firstSlots is slots 0..n-1, where a call without the cache puts its rows.
func firstSlots(n int) []int32 {
	s := make([]int32, n)
	for i := range s {
		s[i] = int32(i)
	}
	return s
}

// Close waits for the copies in flight, frees the caches and unregisters
// the tier. Closing it first takes it off its client's closers.
func (p *Prefetcher) Close() error {
	if p.unregister != nil {
		p.unregister()
	}
	return p.close()
}

func (p *Prefetcher) close() error {
	if !p.closed.CompareAndSwap(false, true) {
		return nil
	}
	// Engine memory only: no hold, so that a prefetcher outliving its tier
	// still gives its caches back.
	first := p.eng.Sync()
	for _, lc := range p.layers {
		if err := lc.buf.Free(); err != nil && first == nil {
			first = err
		}
		if lc.pl != nil {
			if err := lc.pl.free(); err != nil && first == nil {
				first = err
			}
		}
	}
	if p.ownRanges {
		if err := kernels.UnregisterAll(p.eng, p.devIDs); err != nil && first == nil {
			first = err
		}
	}
	return first
}
