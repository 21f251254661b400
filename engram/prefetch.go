package engram

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// ErrCacheTooSmall: one call needs more distinct rows than the cache holds.
var ErrCacheTooSmall = errors.New("engram: more distinct rows in one call than cache slots")

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
	// Bypass turns the cache off: every call fetches all of its rows into
	// slots 0..n-1 (the baseline the cache is measured against).
	Bypass bool
}

// Prefetcher gathers Engram rows from tier tables into a per-layer cache
// buffer of the engine. Each call maps every row a batch needs to a cache
// slot, fetches the rows not already cached in one engine call, and returns
// the slot of every row for the model's embedding lookup.
type Prefetcher struct {
	h       *Hasher
	eng     kernels.Engine
	devIDs  []kernels.RangeID // engine range of each tier device
	r       *tier.Region
	opts    PrefetchOptions
	layers  map[int]*layerCache
	metrics Metrics
}

// Metrics are cumulative counters, safe to read at any time.
type Metrics struct {
	Calls, Rows, Hits, Fetched, DeadlineMisses atomic.Uint64
	ReadyNanos                                 atomic.Uint64 // sum of call → ready times
}

// slotMeta is what the cache knows of one slot, kept together so an
// eviction touches one cache line.
type slotMeta struct {
	row   int64  // -1 if empty
	stamp uint64 // last call that used the slot
	ref   bool   // used since the CLOCK hand last passed
}

type layerCache struct {
	mu    sync.Mutex
	table *Table
	buf   kernels.Buffer
	slot  *rowMap    // row → slot
	meta  []slotMeta // per slot
	hand  int        // CLOCK hand
	epoch uint64
}

// NewPrefetcher registers every tier device with the engine and allocates a
// cache of opts.Slots rows for each table's layer.
func NewPrefetcher(eng kernels.Engine, r *tier.Region, h *Hasher, tables []*Table, opts PrefetchOptions) (*Prefetcher, error) {
	if opts.Slots <= 0 {
		return nil, fmt.Errorf("%w: %d cache slots", ErrGeometry, opts.Slots)
	}
	if opts.Protect <= 0 {
		opts.Protect = 2
	}
	p := &Prefetcher{h: h, eng: eng, r: r, opts: opts, layers: map[int]*layerCache{}}
	for d := range r.NumDevices() {
		id, err := eng.Register(r.Device(d))
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("engram: register tier device %d: %w", d, err)
		}
		p.devIDs = append(p.devIDs, id)
	}
	for _, t := range tables {
		buf, err := eng.Alloc(int64(opts.Slots) * t.RowBytes)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("engram: cache for layer %d: %w", t.Layer, err)
		}
		lc := &layerCache{table: t, buf: buf, slot: newRowMap(opts.Slots), meta: make([]slotMeta, opts.Slots)}
		for i := range lc.meta {
			lc.meta[i].row = -1
		}
		p.layers[t.Layer] = lc
	}
	return p, nil
}

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
	// of that row in the layer's CacheBuffer.
	Slots  []int32
	h      kernels.Handle
	start  time.Time
	p      *Prefetcher
	waited bool
	ready  time.Duration
}

// Wait blocks until the rows are in the cache and returns the time from
// the call to readiness; a time past the deadline is counted as a miss.
func (pd *Pending) Wait() (time.Duration, error) {
	if pd.waited {
		return pd.ready, nil
	}
	if err := pd.h.Wait(); err != nil {
		return 0, err
	}
	pd.waited, pd.ready = true, time.Since(pd.start)
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
	lc, ok := p.layers[layer]
	if !ok {
		return nil, fmt.Errorf("%w: no table for layer %d", ErrInput, layer)
	}
	if histories != nil && len(histories) != len(seqs) {
		return nil, fmt.Errorf("%w: %d histories for %d sequences", ErrInput, len(histories), len(seqs))
	}
	var rows []int64
	for b, ids := range seqs {
		var hist []int64
		if histories != nil {
			hist = histories[b]
		}
		var err error
		if rows, err = p.h.Hash(rows, layer, hist, ids); err != nil {
			return nil, fmt.Errorf("sequence %d: %w", b, err)
		}
	}
	lc.mu.Lock()
	defer lc.mu.Unlock()
	var slots, miss []int32
	var err error
	if p.opts.Bypass {
		slots, miss, err = lc.bypass(rows)
	} else {
		slots, miss, err = lc.assign(rows, uint64(p.opts.Protect))
	}
	if err != nil {
		return nil, err
	}
	req := kernels.Rows{RowBytes: lc.table.RowBytes, Buf: lc.buf, Tier: make([]kernels.Addr, len(miss)), Slots: make([]int64, len(miss))}
	for i, s := range miss {
		a, err := p.addr(lc.table, lc.meta[s].row)
		if err != nil {
			return nil, err
		}
		req.Tier[i], req.Slots[i] = a, int64(s)
	}
	h, err := p.eng.Gather(req)
	if err != nil {
		return nil, err
	}
	m := &p.metrics
	m.Calls.Add(1)
	m.Rows.Add(uint64(len(rows)))
	m.Fetched.Add(uint64(len(miss)))
	m.Hits.Add(uint64(len(rows) - len(miss)))
	return &Pending{Slots: slots, h: h, start: start, p: p}, nil
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

// assign gives every row a slot: cached rows keep theirs, others take a
// slot whose row no recent call used (CLOCK over the stamps). It returns
// the slot per row and the slots to fetch.
func (lc *layerCache) assign(rows []int64, protect uint64) ([]int32, []int32, error) {
	lc.epoch++
	slots := make([]int32, len(rows))
	var miss []int32
	for i, r := range rows {
		s, ok := lc.slot.get(r)
		if !ok {
			var err error
			if s, err = lc.evict(protect); err != nil {
				return nil, nil, err
			}
			if old := lc.meta[s].row; old >= 0 {
				lc.slot.delete(old)
			}
			lc.meta[s].row = r
			lc.slot.put(r, s)
			miss = append(miss, s)
		}
		lc.meta[s].stamp, lc.meta[s].ref = lc.epoch, true
		slots[i] = s
	}
	return slots, miss, nil
}

// bypass places row i in slot i and fetches them all.
func (lc *layerCache) bypass(rows []int64) ([]int32, []int32, error) {
	if len(rows) > len(lc.meta) {
		return nil, nil, fmt.Errorf("%w: %d rows (%d slots)", ErrCacheTooSmall, len(rows), len(lc.meta))
	}
	slots := make([]int32, len(rows))
	for i, r := range rows {
		slots[i], lc.meta[i].row = int32(i), r
	}
	return slots, slots, nil
}

func (lc *layerCache) evict(protect uint64) (int32, error) {
	// Second chance: a slot used since the hand last passed is spared once.
	for range 3 * len(lc.meta) {
		s := lc.hand
		lc.hand = (lc.hand + 1) % len(lc.meta)
		m := &lc.meta[s]
		switch {
		case m.row < 0:
			return int32(s), nil
		case m.stamp+protect > lc.epoch:
			// in use by a recent call
		case m.ref:
			m.ref = false
		default:
			return int32(s), nil
		}
	}
	return 0, fmt.Errorf("%w (%d slots)", ErrCacheTooSmall, len(lc.meta))
}

// Close frees the caches and unregisters the tier.
func (p *Prefetcher) Close() error {
	first := p.eng.Sync()
	for _, lc := range p.layers {
		if err := lc.buf.Free(); err != nil && first == nil {
			first = err
		}
	}
	for _, id := range p.devIDs {
		if err := p.eng.Unregister(id); err != nil && first == nil {
			first = err
		}
	}
	return first
}
