package kernels

import (
	"errors"
	"fmt"
	"math/bits"
	"unsafe"
)

// Engram row planning on the engine (engram.cu, and its Go twin here):
// package engram's hashing and hot-row cache run where the rows go, so a
// call costs the host one pass over the token ids and one launch. The
// semantics (hash, set choice, victim rule, spill banks) are package
// engram's; the layout is defined here so the engines can share it.

// EngramWays is the Engram cache's associativity: the tags of a set are
// one 64-byte line.
const EngramWays = 8

// A tag is (row+1)<<16 | stamp, 0 for an empty way; stamp is the low 16
// bits of the call (epoch) that last used the row.
const (
	engramStampBits = 16
	engramStampMask = 1<<engramStampBits - 1
	// MaxEngramRow keeps row+1 within a tag's 48 bits.
	MaxEngramRow = 1<<(64-engramStampBits) - 2
	engramGolden = 0x9E3779B97F4A7C15
)

// EngramSet is the cache set of row among sets (a power of two).
func EngramSet(row int64, sets int) uint64 {
	return (uint64(row) * engramGolden >> 32) & (uint64(sets) - 1)
}

// ErrNoRoom is returned (wrapped) when a call's rows found neither a way
// of their set nor a spill slot: those rows got slot -1 and were not fetched.
var ErrNoRoom = errors.New("kernels: no cache slot left for a row")

// TableMap says where the rows of a table lie on a tier whose devices are
// striped: rows [0, First) follow Base contiguously (they fill the stripe
// Base is in), then every whole stripe holds PerStripe rows. Tier-wide
// stripe g lies on device g mod n at device offset Control + (g/n)*Stripe
// (package tier's layout; package engram's tables pack rows so that none
// straddles a stripe).
type TableMap struct {
	RowBytes  int64
	Base      Addr
	First     int64
	PerStripe int64
	Stripe    int64
	Stripe0   int64 // tier-wide index of the stripe row First starts
	Control   int64
	Devices   []RangeID // each tier device's range, in device order
}

// Addr is the address of row.
func (m *TableMap) Addr(row int64) Addr {
	if row < m.First {
		return m.Base + Addr(row*m.RowBytes)
	}
	j := row - m.First
	g, n := m.Stripe0+j/m.PerStripe, int64(len(m.Devices))
	return At(m.Devices[g%n], m.Control+(g/n)*m.Stripe+(j%m.PerStripe)*m.RowBytes)
}

// EngramLayout is one Engram layer as an engine plans it: the hash
// constants (package engram's Hasher), the table's place in the tier and
// the cache's shape. Sets == 0 means no cache: row i of a call goes to
// slot i and every row is fetched.
type EngramLayout struct {
	MaxN, Heads     int
	Multipliers     []int64 // MaxN of them
	Moduli, Offsets []int64 // (MaxN-1)*Heads, order-major
	Rows            int64   // rows in the table
	Table           TableMap
	Sets            int // a power of two, or 0
	SpillSlots      int // after the sets' slots, split into Protect banks
	Protect         int // calls whose rows may not be evicted
}

// RowsPerToken is how many rows one token hashes to.
func (l *EngramLayout) RowsPerToken() int { return (l.MaxN - 1) * l.Heads }

// CacheSlots is the number of slots the cache uses (0 without sets).
func (l *EngramLayout) CacheSlots() int { return l.Sets*EngramWays + l.SpillSlots }

// TagBytes is the tag array (one word per way) and the set locks after it.
func (l *EngramLayout) TagBytes() int64 {
	return int64(l.Sets)*EngramWays*8 + (int64(l.Sets)*4+7)&^7
}

// Check reports a layout the planners cannot serve.
func (l *EngramLayout) Check() error {
	r := l.RowsPerToken()
	switch {
	case l.MaxN < 2 || l.MaxN > 16 || l.Heads < 1 || r > 1<<10:
		return fmt.Errorf("%w: Engram layout of max n-gram %d, %d heads", ErrBadRequest, l.MaxN, l.Heads)
	case len(l.Multipliers) != l.MaxN || len(l.Moduli) != r || len(l.Offsets) != r:
		return fmt.Errorf("%w: Engram layout with %d multipliers, %d moduli, %d offsets for max n-gram %d, %d heads",
			ErrBadRequest, len(l.Multipliers), len(l.Moduli), len(l.Offsets), l.MaxN, l.Heads)
	case l.Rows < 1 || l.Rows > MaxEngramRow:
		return fmt.Errorf("%w: Engram table of %d rows (at most %d)", ErrBadRequest, l.Rows, int64(MaxEngramRow))
	case l.Sets < 0 || l.Sets&(l.Sets-1) != 0 || l.SpillSlots < 0 || (l.Sets > 0 && l.Protect < 1):
		return fmt.Errorf("%w: Engram cache of %d sets, %d spill slots, protect %d", ErrBadRequest, l.Sets, l.SpillSlots, l.Protect)
	case l.CacheSlots() > 1<<31-1:
		return fmt.Errorf("%w: Engram cache of %d slots", ErrBadRequest, l.CacheSlots())
	}
	for i, p := range l.Moduli {
		if p < 1 || l.Offsets[i] < 0 || l.Offsets[i] > l.Rows-p {
			return fmt.Errorf("%w: Engram head %d: modulus %d at offset %d in %d rows", ErrBadRequest, i, p, l.Offsets[i], l.Rows)
		}
	}
	return l.Table.check()
}

func (m *TableMap) check() error {
	switch {
	case m.RowBytes < 4 || m.RowBytes%4 != 0:
		return fmt.Errorf("%w: table rows of %d bytes (want a multiple of 4)", ErrBadRequest, m.RowBytes)
	case len(m.Devices) < 1 || m.First < 0 || m.PerStripe < 1 || m.Stripe < m.PerStripe*m.RowBytes || m.Stripe0 < 0 || m.Control < 0:
		return fmt.Errorf("%w: table map %+v", ErrBadRequest, *m)
	}
	return nil
}

// tableSpan is n bytes at a.
type tableSpan struct {
	a Addr
	n int64
}

// spans are the byte spans the table's rows reach furthest into, the
// leading rows and each device's last stripe: what must lie in
// registered memory.
func (m *TableMap) spans(rows int64) []tableSpan {
	out := []tableSpan{{m.Base, min(rows, m.First) * m.RowBytes}}
	if rows <= m.First {
		return out
	}
	n := int64(len(m.Devices))
	last := m.Stripe0 + (rows-1-m.First)/m.PerStripe
	for g := max(m.Stripe0, last-n+1); g <= last; g++ {
		out = append(out, tableSpan{At(m.Devices[g%n], m.Control+(g/n)*m.Stripe), m.PerStripe * m.RowBytes})
	}
	return out
}

// Engram params words (engram.cu reads them in this order).
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
	epHeader = 16 // then Devices, Multipliers, Moduli, Offsets
)

// Params encodes the layout as the words engram.cu reads; the caller
// uploads them to a buffer of ParamBytes once per layer.
func (l *EngramLayout) Params() []uint64 {
	m := &l.Table
	w := make([]uint64, epHeader, epHeader+len(m.Devices)+l.MaxN+2*l.RowsPerToken())
	for i, v := range []int64{int64(l.MaxN), int64(l.Heads), m.RowBytes, int64(l.Sets), int64(l.SpillSlots), int64(l.Protect), m.First, m.PerStripe,
		m.Stripe, m.Stripe0, m.Control, int64(len(m.Devices)), int64(m.Base)} {
		w[i] = uint64(v)
	}
	for _, d := range m.Devices {
		w = append(w, uint64(d))
	}
	for _, s := range [][]int64{l.Multipliers, l.Moduli, l.Offsets} {
		for _, v := range s {
			w = append(w, uint64(v))
		}
	}
	return w
}

// ParamBytes is the size of Params.
func (l *EngramLayout) ParamBytes() int64 {
	return 8 * int64(epHeader+len(l.Table.Devices)+l.MaxN+2*l.RowsPerToken())
}

// EngramStep is one prefetch call of one layer: Windows holds, per token,
// the MaxN ids ending at it (the token first, then the ids before it, the
// pad id before a sequence's start), checked by the caller to be in the
// vocabulary. The engine hashes every token to RowsPerToken rows, gives
// each row a cache slot (Sets > 0: a hit keeps its slot, a miss takes the
// least recently used way of its set that none of the last Protect calls
// used, else a slot of this call's spill bank; Sets == 0: row i takes slot
// i), fetches the rows that need it into Cache and writes EngramOutBytes
// to Out: the counts, then the slot of every row (-1: no room).
type EngramStep struct {
	Layout  *EngramLayout
	Params  Buffer // Layout.Params(), uploaded by the caller
	Tags    Buffer // Layout.TagBytes(), zeroed when the cache was made; nil without sets
	Cache   Buffer
	Windows []int64
	// Epoch numbers the layer's calls from 1; it stamps the rows this call
	// uses and picks its spill bank (Epoch mod Protect).
	Epoch uint64
	Out   Span
}

// engramCountWords leads Out: hits, fetched, spilled, without room.
const engramCountWords = 4

// EngramOutBytes is the size of a call's Out for n rows.
func EngramOutBytes(n int) int64 { return 8*engramCountWords + 4*int64(n) }

// EngramCounts is what a call did.
type EngramCounts struct {
	Hits, Fetched, Spilled, NoRoom int
}

// ReadEngramOut decodes a call's Out (downloaded to b): the counts, and
// the slots into slots (len = the call's rows). It returns an error
// wrapping ErrNoRoom when some row got no slot.
func ReadEngramOut(b []byte, slots []int32) (EngramCounts, error) {
	if int64(len(b)) < EngramOutBytes(len(slots)) {
		return EngramCounts{}, fmt.Errorf("%w: %d bytes of Engram output for %d rows", ErrBadRequest, len(b), len(slots))
	}
	w := unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), engramCountWords)
	c := EngramCounts{Hits: int(w[0]), Fetched: int(w[1]), Spilled: int(w[2]), NoRoom: int(w[3])}
	copy(slots, int32s(b[8*engramCountWords:], len(slots)))
	if c.NoRoom > 0 {
		return c, fmt.Errorf("%w: %d of %d rows", ErrNoRoom, c.NoRoom, len(slots))
	}
	return c, nil
}

// EngramPlanner is implemented by engines that hash and cache Engram rows
// in their own memory: the CUDA engine with engram.cu, the CPU engine with
// its Go twin. PlanEngram queues the call and returns when it is queued.
type EngramPlanner interface {
	CanPlanEngram(*EngramLayout) error
	PlanEngram(EngramStep) (Handle, error)
}

// checkEngramStep validates a step's shapes against its buffers and the
// engine's registered ranges, so that no kernel reads or writes outside them.
func checkEngramStep(s *EngramStep, ranges *rangeTable) (tokens, rows int, err error) {
	l := s.Layout
	if l == nil {
		return 0, 0, fmt.Errorf("%w: Engram step without a layout", ErrBadRequest)
	}
	if err := l.Check(); err != nil {
		return 0, 0, err
	}
	if len(s.Windows)%l.MaxN != 0 {
		return 0, 0, fmt.Errorf("%w: %d window ids, not a multiple of %d", ErrBadRequest, len(s.Windows), l.MaxN)
	}
	tokens = len(s.Windows) / l.MaxN
	rows = tokens * l.RowsPerToken()
	slots := int64(l.CacheSlots())
	if l.Sets == 0 {
		slots = int64(rows)
	}
	switch {
	case s.Params == nil || s.Cache == nil || s.Out.Buf == nil || (l.Sets > 0 && s.Tags == nil):
		return 0, 0, fmt.Errorf("%w: Engram step without its buffers", ErrBadRequest)
	case s.Params.Len() < l.ParamBytes():
		return 0, 0, fmt.Errorf("%w: Engram params of %d bytes, want %d", ErrOutOfBounds, s.Params.Len(), l.ParamBytes())
	case l.Sets > 0 && s.Tags.Len() < l.TagBytes():
		return 0, 0, fmt.Errorf("%w: Engram tags of %d bytes, want %d", ErrOutOfBounds, s.Tags.Len(), l.TagBytes())
	case s.Cache.Len()/l.Table.RowBytes < slots:
		return 0, 0, fmt.Errorf("%w: Engram cache of %d bytes for %d slots of %d bytes", ErrOutOfBounds, s.Cache.Len(), slots, l.Table.RowBytes)
	case s.Out.Offset < 0 || s.Out.Offset%8 != 0 || s.Out.Offset > s.Out.Buf.Len()-EngramOutBytes(rows):
		return 0, 0, fmt.Errorf("%w: Engram output of %d bytes at %d in a buffer of %d", ErrOutOfBounds, EngramOutBytes(rows), s.Out.Offset, s.Out.Buf.Len())
	case l.Sets > 0 && s.Epoch == 0:
		return 0, 0, fmt.Errorf("%w: Engram epoch 0 (calls count from 1)", ErrBadRequest)
	}
	for _, sp := range l.Table.spans(l.Rows) {
		if err := ranges.checkOne(sp.a, sp.n, "Engram table"); err != nil {
			return 0, 0, err
		}
	}
	return tokens, rows, nil
}

// CanPlanEngram implements EngramPlanner.
func (e *CPU) CanPlanEngram(l *EngramLayout) error { return l.Check() }

// PlanEngram implements EngramPlanner: the Go twin of cxl_engram_rows. It
// plans on the host at once, in row order (one of the orders the kernel's
// threads may take), and queues one gather of the rows to fetch.
func (e *CPU) PlanEngram(s EngramStep) (Handle, error) {
	_, n, err := checkEngramStep(&s, &e.ranges)
	if err != nil {
		return nil, err
	}
	outBuf, err := e.own(s.Out.Buf)
	if err != nil {
		return nil, err
	}
	l := s.Layout
	out := outBuf.b[s.Out.Offset : s.Out.Offset+EngramOutBytes(n)]
	counts := unsafe.Slice((*uint64)(unsafe.Pointer(&out[0])), engramCountWords)
	slots := int32s(out[8*engramCountWords:], n)
	clear(counts)
	c := engramTwin{l: l}
	if l.Sets > 0 {
		tags, err := e.own(s.Tags)
		if err != nil {
			return nil, err
		}
		c.tags = unsafe.Slice((*uint64)(unsafe.Pointer(&tags.b[0])), l.Sets*EngramWays)
		c.begin(s.Epoch)
	}
	rows := Rows{RowBytes: l.Table.RowBytes, Buf: s.Cache}
	perTok := l.RowsPerToken()
	for i := range n {
		row := l.hash(s.Windows[i/perTok*l.MaxN:][:l.MaxN], i%perTok)
		slot, fetch := int32(i), true
		if l.Sets > 0 {
			slot, fetch = c.probe(row, counts)
		}
		slots[i] = slot
		if fetch {
			rows.Tier = append(rows.Tier, l.Table.Addr(row))
			rows.Slots = append(rows.Slots, int64(slot))
		}
	}
	counts[1] = uint64(len(rows.Tier))
	counts[0] = uint64(n) - counts[1] - counts[3]
	if len(rows.Tier) == 0 {
		return doneHandle(), nil
	}
	return e.Gather(rows)
}

// hash is row r (order-major: order r/Heads+2, head r%Heads) of the token
// whose window is w. The modulus is taken unsigned, so that ids outside the
// vocabulary (which callers reject) could not index outside the table.
func (l *EngramLayout) hash(w []int64, r int) int64 {
	o := r / l.Heads
	mix := w[0] * l.Multipliers[0]
	for k := 1; k <= o+1; k++ {
		mix ^= w[k] * l.Multipliers[k]
	}
	return int64(uint64(mix)%uint64(l.Moduli[r])) + l.Offsets[r]
}

// engramTwin is cxl_engram_rows's cache probe, run one row at a time.
type engramTwin struct {
	l        *EngramLayout
	tags     []uint64
	now      uint64
	bankLo   int
	bankSize int
}

func (c *engramTwin) begin(epoch uint64) {
	l := c.l
	c.now = epoch & engramStampMask
	b := int(epoch % uint64(l.Protect))
	lo, hi := l.SpillSlots*b/l.Protect, l.SpillSlots*(b+1)/l.Protect
	c.bankLo, c.bankSize = l.Sets*EngramWays+lo, hi-lo
}

// probe returns row's slot and whether to fetch it, counting spills and
// rows without room in counts[2] and counts[3] (slot -1).
func (c *engramTwin) probe(row int64, counts []uint64) (int32, bool) {
	set := EngramSet(row, c.l.Sets)
	line := c.tags[set*EngramWays : set*EngramWays+EngramWays]
	want := uint64(row + 1)
	victim, oldest := -1, uint64(0)
	for w, tag := range line {
		if tag>>engramStampBits == want {
			line[w] = want<<engramStampBits | c.now
			return int32(set*EngramWays) + int32(w), false
		}
		age := (c.now - tag) & engramStampMask
		switch {
		case tag == 0:
			age = engramStampMask + 1 // empty ways first
		case age < uint64(c.l.Protect):
			continue // used by a call that may still be read
		}
		if age > oldest {
			victim, oldest = w, age
		}
	}
	if victim >= 0 {
		line[victim] = want<<engramStampBits | c.now
		return int32(set*EngramWays) + int32(victim), true
	}
	if counts[2] < uint64(c.bankSize) {
		counts[2]++
		return int32(c.bankLo) + int32(counts[2]-1), true
	}
	counts[3]++
	return -1, false
}

// EngramSets is how many sets of EngramWays a cache of slots slots has:
// the largest power of two that leaves at least an eighth of the slots for
// spill banks, 0 when not even one set fits (package engram's host cache
// splits its slots the same way).
func EngramSets(slots int) int {
	q := (slots - slots/8) / EngramWays
	if q < 1 {
		return 0
	}
	return 1 << (bits.Len(uint(q)) - 1)
}
