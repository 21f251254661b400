package engram

import (
	"errors"
	"math/bits"
	"testing"

	"github.com/cxltier/cxltier/internal/ptxcheck"
	"github.com/cxltier/cxltier/kernels"
)

// twinFixture is a one-range "tier" of rows r at r*rowBytes (each row
// filled with its own index) and a layout over it: max n-gram 3, 2 heads.
type twinFixture struct {
	e      *kernels.CPU
	st     *twinStepper
	layout engineLayout
	params kernels.Buffer
	tags   kernels.Buffer
	cache  kernels.Buffer
	out    kernels.Buffer
}

func newTwinFixture(t *testing.T, sets, spill int) *twinFixture {
	t.Helper()
	const rowBytes, rows = 16, 1000
	mem := make([]byte, rows*rowBytes)
	for r := range rows {
		for i := range rowBytes {
			mem[r*rowBytes+i] = byte(r >> (8 * (i % 2)))
		}
	}
	e := kernels.NewCPU(1)
	t.Cleanup(func() { e.Close() })
	id, err := e.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	f := &twinFixture{e: e, st: &twinStepper{e: e}, layout: engineLayout{
		hash: hashRule{mult: []int64{3, 5, 7}, heads: 2, moduli: []int64{211, 223, 227, 229}, offsets: []int64{0, 211, 434, 661}},
		rows: rows,
		table: tableMap{rowBytes: rowBytes, base: kernels.At(id, 0), first: rows, perStripe: 1, stripe: rowBytes,
			devices: []kernels.RangeID{id}},
		sets: sets, spillSlots: spill, protect: 2}}
	alloc := func(n int64) kernels.Buffer {
		b, err := e.Alloc(max(n, 8))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	f.params, f.tags = alloc(f.layout.paramBytes()), alloc(f.layout.tagBytes())
	f.cache, f.out = alloc(int64(max(f.layout.cacheSlots(), 64))*rowBytes), alloc(outBytes(64))
	if err := e.Upload(f.params, 0, kernels.AsBytes(f.layout.params())); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *twinFixture) step(windows []int64, epoch uint64) *engineStep {
	return &engineStep{layout: &f.layout, params: f.params, tags: f.tags, cache: f.cache, windows: windows, epoch: epoch,
		out: kernels.Span{Buf: f.out}}
}

// run plans a step and returns its slots and counts.
func (f *twinFixture) run(t *testing.T, s *engineStep) ([]int32, engineCounts, error) {
	t.Helper()
	h, err := f.st.plan(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	n := len(s.windows) / s.layout.maxN() * s.layout.rowsPerToken()
	b := make([]byte, outBytes(n))
	if err := f.e.Download(b, f.out, 0); err != nil {
		t.Fatal(err)
	}
	slots := make([]int32, n)
	c, err := readOut(b, slots)
	return slots, c, err
}

// TestTwinHashesAndFetches: the twin's rows follow the layout's hash
// (order-major, offsets added), each slot receives its row's bytes, a
// repeated call hits, and a call beyond the cache's room reports
// ErrCacheTooSmall with slot -1 for the rows left out.
func TestTwinHashesAndFetches(t *testing.T) {
	f := newTwinFixture(t, 4, 4)
	windows := []int64{10, 2, 2, 11, 10, 2}
	want := func(w []int64, r int) int64 { // rows 0, 1: bigram heads; 2, 3: trigram heads
		mix := w[0]*3 ^ w[1]*5
		if r >= 2 {
			mix ^= w[2] * 7
		}
		return mix%f.layout.hash.moduli[r] + f.layout.hash.offsets[r]
	}
	slots, c, err := f.run(t, f.step(windows, 1))
	if err != nil {
		t.Fatal(err)
	}
	mem, _ := f.e.Bytes(f.cache)
	for i, s := range slots {
		row := want(windows[i/4*3:], i%4)
		got := mem[int64(s)*16:]
		if int64(got[0])|int64(got[1])<<8 != row {
			t.Errorf("row %d: slot %d holds row %d, want %d", i, s, int64(got[0])|int64(got[1])<<8, row)
		}
	}
	if c.hits+c.fetched != 8 || c.noRoom != 0 {
		t.Errorf("first call: %+v", c)
	}
	again, c, err := f.run(t, f.step(windows, 2))
	if err != nil || c.hits != 8 || c.fetched != 0 {
		t.Errorf("repeated call: %+v, %v", c, err)
	}
	for i := range again {
		if again[i] != slots[i] {
			t.Errorf("row %d moved from slot %d to %d", i, slots[i], again[i])
		}
	}
	// 16 tokens of distinct ids: 64 rows for 32 ways and banks of 2.
	var many []int64
	for i := range int64(16) {
		many = append(many, 100+i, 200+i, 300+i)
	}
	slots, c, err = f.run(t, f.step(many, 3))
	if !errors.Is(err, ErrCacheTooSmall) || c.noRoom == 0 || c.spilled != 2 {
		t.Fatalf("crowded call: %+v, %v", c, err)
	}
	none := 0
	for _, s := range slots {
		if s < 0 {
			none++
		}
	}
	if none != c.noRoom {
		t.Errorf("%d slots of -1, %d rows counted without room", none, c.noRoom)
	}
}

// TestEngineStepRefusals: malformed layouts and steps are errors before
// anything runs, including a table reaching outside registered memory.
func TestEngineStepRefusals(t *testing.T) {
	f := newTwinFixture(t, 4, 4)
	ok := []int64{1, 2, 3}
	for _, tc := range []struct {
		name string
		edit func(s *engineStep, l *engineLayout)
		want error
	}{
		{"max n-gram 1", func(s *engineStep, l *engineLayout) { l.hash.mult = l.hash.mult[:1] }, ErrGeometry},
		{"missing modulus", func(s *engineStep, l *engineLayout) { l.hash.moduli = l.hash.moduli[:2] }, ErrGeometry},
		{"modulus past the table", func(s *engineStep, l *engineLayout) { l.hash.offsets[3] = 900 }, ErrGeometry},
		{"sets not a power of two", func(s *engineStep, l *engineLayout) { l.sets = 3 }, ErrGeometry},
		{"rows of 6 bytes", func(s *engineStep, l *engineLayout) { l.table.rowBytes = 6 }, ErrGeometry},
		{"table beyond its range", func(s *engineStep, l *engineLayout) { l.rows, l.table.first = 2000, 2000 }, kernels.ErrOutOfBounds},
		{"unregistered range", func(s *engineStep, l *engineLayout) { l.table.base = kernels.At(9, 0) }, kernels.ErrNoRange},
		{"ragged windows", func(s *engineStep, l *engineLayout) { s.windows = ok[:2] }, ErrInput},
		{"epoch 0", func(s *engineStep, l *engineLayout) { s.epoch = 0 }, ErrInput},
		{"no tags", func(s *engineStep, l *engineLayout) { s.tags = nil }, ErrInput},
		{"output past its buffer", func(s *engineStep, l *engineLayout) { s.out.Offset = f.out.Len() - 8 }, ErrInput},
		{"cache too small", func(s *engineStep, l *engineLayout) { l.spillSlots = 100 }, ErrCacheTooSmall},
		{"tags too small", func(s *engineStep, l *engineLayout) { l.sets = 64 }, ErrInput},
	} {
		l := f.layout
		l.hash.mult = append([]int64(nil), l.hash.mult...)
		l.hash.offsets = append([]int64(nil), l.hash.offsets...)
		s := f.step(ok, 1)
		s.layout = &l
		tc.edit(s, &l)
		if _, err := f.st.plan(s); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := readOut(make([]byte, 8), make([]int32, 1)); !errors.Is(err, ErrInput) {
		t.Errorf("short output: %v", err)
	}
}

// TestTableMapStripes: rows after the first stripe boundary go round the
// devices stripe by stripe, as package tier lays stripes out.
func TestTableMapStripes(t *testing.T) {
	m := tableMap{rowBytes: 100, base: kernels.At(0, 4096+250), first: 2, perStripe: 3, stripe: 400, stripe0: 1, control: 4096,
		devices: []kernels.RangeID{5, 6, 7}}
	for _, tc := range []struct {
		row  int64
		want kernels.Addr
	}{
		{0, kernels.At(0, 4096+250)}, {1, kernels.At(0, 4096+350)},
		{2, kernels.At(6, 4096)}, {4, kernels.At(6, 4096+200)}, // stripe 1: device 1, first stripe there
		{5, kernels.At(7, 4096)},     // stripe 2: device 2
		{8, kernels.At(5, 4096+400)}, // stripe 3: device 0, its second stripe
		{11, kernels.At(6, 4096+400)},
	} {
		if got := m.addr(tc.row); got != tc.want {
			t.Errorf("row %d at %v, want %v", tc.row, got, tc.want)
		}
	}
}

func TestPTXMatchesSource(t *testing.T) {
	if err := ptxcheck.Check("engram.cu", engramPTX, "cxl_engram_rows"); err != nil {
		t.Error(err)
	}
	rangeShift := uint64(bits.Len64(uint64(kernels.MaxRangeBytes)) - 1)
	if err := ptxcheck.Agree("engram.cu", map[string]uint64{"WAYS": ways, "STAMP_BITS": stampBits, "GOLDEN": setGolden,
		"ADDR_RANGE_SHIFT": rangeShift}); err != nil {
		t.Error(err)
	}
}
