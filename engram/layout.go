package engram

import (
	"fmt"
	"unsafe"

	"github.com/cxltier/cxltier/kernels"
)

// engineLayout is one Engram layer as an engine planner sees it: the hash
// rule, the table's place in the tier and the cache's shape. Sets == 0
// means no cache: row i of a call goes to slot i and every row is fetched.
// engram.cu reads it as the words of params().
type engineLayout struct {
	hash       hashRule
	rows       int64 // rows in the table
	table      tableMap
	sets       int // a power of two, or 0
	spillSlots int // after the sets' slots, split into protect banks
	protect    int // calls whose rows may not be evicted
}

func (l *engineLayout) maxN() int { return len(l.hash.mult) }

// rowsPerToken is how many rows one token hashes to.
func (l *engineLayout) rowsPerToken() int { return (l.maxN() - 1) * l.hash.heads }

// cacheSlots is the number of slots the cache uses (0 without sets).
func (l *engineLayout) cacheSlots() int { return l.sets*ways + l.spillSlots }

// tagBytes is the tag array (one word per way) and the set locks after it.
func (l *engineLayout) tagBytes() int64 {
	return int64(l.sets)*ways*8 + (int64(l.sets)*4+7)&^7
}

// check reports a layout the engine planners cannot serve.
func (l *engineLayout) check() error {
	r := l.rowsPerToken()
	switch {
	case l.maxN() < 2 || l.maxN() > 16 || l.hash.heads < 1 || r > 1<<10:
		return fmt.Errorf("%w: engine planning of max n-gram %d, %d heads", ErrGeometry, l.maxN(), l.hash.heads)
	case len(l.hash.moduli) != r || len(l.hash.offsets) != r:
		return fmt.Errorf("%w: %d moduli, %d offsets for max n-gram %d, %d heads",
			ErrGeometry, len(l.hash.moduli), len(l.hash.offsets), l.maxN(), l.hash.heads)
	case l.rows < 1 || l.rows > maxCachedRow:
		return fmt.Errorf("%w: table of %d rows (at most %d)", ErrGeometry, l.rows, int64(maxCachedRow))
	case l.sets < 0 || l.sets&(l.sets-1) != 0 || l.spillSlots < 0 || (l.sets > 0 && l.protect < 1):
		return fmt.Errorf("%w: cache of %d sets, %d spill slots, protect %d", ErrGeometry, l.sets, l.spillSlots, l.protect)
	case l.cacheSlots() > 1<<31-1:
		return fmt.Errorf("%w: cache of %d slots", ErrGeometry, l.cacheSlots())
	}
	for i, p := range l.hash.moduli {
		if p < 1 || l.hash.offsets[i] < 0 || l.hash.offsets[i] > l.rows-p {
			return fmt.Errorf("%w: head %d: modulus %d at offset %d in %d rows", ErrGeometry, i, p, l.hash.offsets[i], l.rows)
		}
	}
	return l.table.check()
}

// tableMap says where the rows of a table lie on a tier whose devices are
// striped: rows [0, first) follow base contiguously (they fill the stripe
// base is in), then every whole stripe holds perStripe rows. Tier-wide
// stripe g lies on device g mod n at device offset control + (g/n)*stripe
// (package tier's layout; tables pack rows so that none straddles a
// stripe).
type tableMap struct {
	rowBytes  int64
	base      kernels.Addr
	first     int64
	perStripe int64
	stripe    int64
	stripe0   int64 // tier-wide index of the stripe row first starts
	control   int64
	devices   []kernels.RangeID // each tier device's range, in device order
}

// addr is the address of row.
func (m *tableMap) addr(row int64) kernels.Addr {
	if row < m.first {
		return m.base + kernels.Addr(row*m.rowBytes)
	}
	j := row - m.first
	g, n := m.stripe0+j/m.perStripe, int64(len(m.devices))
	return kernels.At(m.devices[g%n], m.control+(g/n)*m.stripe+(j%m.perStripe)*m.rowBytes)
}

func (m *tableMap) check() error {
	switch {
	case m.rowBytes < 4 || m.rowBytes%4 != 0:
		return fmt.Errorf("%w: table rows of %d bytes (engine planning wants a multiple of 4)", ErrGeometry, m.rowBytes)
	case len(m.devices) < 1 || m.first < 0 || m.perStripe < 1 || m.stripe < m.perStripe*m.rowBytes || m.stripe0 < 0 || m.control < 0:
		return fmt.Errorf("%w: table map %+v", ErrGeometry, *m)
	}
	return nil
}

// tableSpan is n bytes at a.
type tableSpan struct {
	a kernels.Addr
	n int64
}

// spans are the byte spans the table's rows reach furthest into, the
// leading rows and each device's last stripe: what must lie in
// registered memory.
func (m *tableMap) spans(rows int64) []tableSpan {
	out := []tableSpan{{m.base, min(rows, m.first) * m.rowBytes}}
	if rows <= m.first {
		return out
	}
	n := int64(len(m.devices))
	last := m.stripe0 + (rows-1-m.first)/m.perStripe
	for g := max(m.stripe0, last-n+1); g <= last; g++ {
		out = append(out, tableSpan{kernels.At(m.devices[g%n], m.control+(g/n)*m.stripe), m.perStripe * m.rowBytes})
	}
	return out
}

// Params words (engram.cu reads them in this order).
const (
	epMaxN = iota
	epHeads
	epRowBytes
	epSets
	epSpill
	epProtect
	epFirst
	epPerStripe
	epStripe
	epStripe0
	epControl
	epDevices
	epBase
	epHeader = 16 // then devices, multipliers, moduli, offsets
)

// params encodes the layout as the words engram.cu reads; the prefetcher
// uploads them to a buffer of paramBytes once per layer.
func (l *engineLayout) params() []uint64 {
	m := &l.table
	w := make([]uint64, epHeader, epHeader+len(m.devices)+l.maxN()+2*l.rowsPerToken())
	for i, v := range []int64{int64(l.maxN()), int64(l.hash.heads), m.rowBytes, int64(l.sets), int64(l.spillSlots), int64(l.protect),
		m.first, m.perStripe, m.stripe, m.stripe0, m.control, int64(len(m.devices)), int64(m.base)} {
		w[i] = uint64(v)
	}
	for _, d := range m.devices {
		w = append(w, uint64(d))
	}
	for _, s := range [][]int64{l.hash.mult, l.hash.moduli, l.hash.offsets} {
		for _, v := range s {
			w = append(w, uint64(v))
		}
	}
	return w
}

// paramBytes is the size of params.
func (l *engineLayout) paramBytes() int64 {
	return 8 * int64(epHeader+len(l.table.devices)+l.maxN()+2*l.rowsPerToken())
}

// engineStep is one prefetch call of one layer: windows holds, per token,
// the MaxN ids ending at it (the token first, then the ids before it, the
// pad id before a sequence's start), checked to be in the vocabulary. The
// planner hashes every token to rowsPerToken rows, gives each row a cache
// slot (sets > 0: a hit keeps its slot, a miss takes a victim by the
// hotSet's rule, else a slot of this call's spill bank; sets == 0: row i
// takes slot i), fetches the rows that need it into cache and writes
// outBytes to out: the counts, then the slot of every row (-1: no room).
type engineStep struct {
	layout  *engineLayout
	params  kernels.Buffer // layout.params(), uploaded
	tags    kernels.Buffer // layout.tagBytes(), zeroed when the cache was made; nil without sets
	cache   kernels.Buffer
	windows []int64
	// epoch numbers the layer's calls from 1; it stamps the rows this call
	// uses and picks its spill bank (epoch mod protect).
	epoch uint64
	out   kernels.Span
}

// countWords lead out: hits, fetched, spilled, without room.
const countWords = 4

// outBytes is the size of a call's out for n rows.
func outBytes(n int) int64 { return 8*countWords + 4*int64(n) }

// engineCounts is what a call did.
type engineCounts struct {
	hits, fetched, spilled, noRoom int
}

// readOut decodes a call's out (downloaded to b): the counts, and the
// slots into slots (len = the call's rows). Some row without a slot is
// ErrCacheTooSmall.
func readOut(b []byte, slots []int32) (engineCounts, error) {
	if int64(len(b)) < outBytes(len(slots)) {
		return engineCounts{}, fmt.Errorf("%w: %d bytes of engine output for %d rows", ErrInput, len(b), len(slots))
	}
	w := unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), countWords)
	c := engineCounts{hits: int(w[0]), fetched: int(w[1]), spilled: int(w[2]), noRoom: int(w[3])}
	copy(slots, kernels.Int32s(b[8*countWords:], len(slots)))
	if c.noRoom > 0 {
		return c, fmt.Errorf("%w: %d of %d rows found no way and no spill slot", ErrCacheTooSmall, c.noRoom, len(slots))
	}
	return c, nil
}

// checkShapes validates a step's shapes against its buffers and returns
// its tokens and rows, so that no planner reads or writes outside them.
// checkSpan checks what the table reaches against the registered ranges.
func (s *engineStep) checkShapes(checkSpan func(kernels.Addr, int64) error) (tokens, rows int, err error) {
	l := s.layout
	if err := l.check(); err != nil {
		return 0, 0, err
	}
	if len(s.windows)%l.maxN() != 0 {
		return 0, 0, fmt.Errorf("%w: %d window ids, not a multiple of %d", ErrInput, len(s.windows), l.maxN())
	}
	tokens = len(s.windows) / l.maxN()
	rows = tokens * l.rowsPerToken()
	slots := int64(l.cacheSlots())
	if l.sets == 0 {
		slots = int64(rows)
	}
	switch {
	case s.params == nil || s.cache == nil || s.out.Buf == nil || (l.sets > 0 && s.tags == nil):
		return 0, 0, fmt.Errorf("%w: engine step without its buffers", ErrInput)
	case s.params.Len() < l.paramBytes():
		return 0, 0, fmt.Errorf("%w: params of %d bytes, want %d", ErrInput, s.params.Len(), l.paramBytes())
	case l.sets > 0 && s.tags.Len() < l.tagBytes():
		return 0, 0, fmt.Errorf("%w: tags of %d bytes, want %d", ErrInput, s.tags.Len(), l.tagBytes())
	case s.cache.Len()/l.table.rowBytes < slots:
		return 0, 0, fmt.Errorf("%w: cache of %d bytes for %d slots of %d bytes", ErrCacheTooSmall, s.cache.Len(), slots, l.table.rowBytes)
	case s.out.Offset < 0 || s.out.Offset%8 != 0 || s.out.Offset > s.out.Buf.Len()-outBytes(rows):
		return 0, 0, fmt.Errorf("%w: output of %d bytes at %d in a buffer of %d", ErrInput, outBytes(rows), s.out.Offset, s.out.Buf.Len())
	case l.sets > 0 && s.epoch == 0:
		return 0, 0, fmt.Errorf("%w: epoch 0 (calls count from 1)", ErrInput)
	}
	for _, sp := range l.table.spans(l.rows) {
		if err := checkSpan(sp.a, sp.n); err != nil {
			return 0, 0, fmt.Errorf("engram: table: %w", err)
		}
	}
	return tokens, rows, nil
}

// stepper plans engine steps: engram.cu on an engine that launches
// kernels (kernelStepper), or its Go twin on the CPU engine (twinStepper).
type stepper interface {
	// plan queues a step; the Handle says when its rows and out are there.
	plan(*engineStep) (kernels.Handle, error)
}

// newStepper is the engine's stepper, or false when the engine can plan
// no Engram call.
func newStepper(eng kernels.Engine) (stepper, bool) {
	switch e := eng.(type) {
	case *kernels.CPU:
		return &twinStepper{e: e}, true
	case kernels.Launcher:
		return &kernelStepper{e: e}, true
	}
	return nil, false
}

// asWords views int64s as the uint64 words kernels read (same size and
// bits, two's complement); the view aliases v.
func asWords(v []int64) []uint64 {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&v[0])), len(v))
}
