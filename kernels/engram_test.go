package kernels

import (
	"errors"
	"testing"
)

// engramFixture is a one-range "tier" of rows r at r*rowBytes (each row
// filled with its own index) and a layout over it: max n-gram 3, 2 heads.
type engramFixture struct {
	e      *CPU
	layout EngramLayout
	params Buffer
	tags   Buffer
	cache  Buffer
	out    Buffer
}

func newEngramFixture(t *testing.T, sets, spill int) *engramFixture {
	t.Helper()
	const rowBytes, rows = 16, 1000
	mem := make([]byte, rows*rowBytes)
	for r := range rows {
		for i := range rowBytes {
			mem[r*rowBytes+i] = byte(r >> (8 * (i % 2)))
		}
	}
	e := NewCPU(1)
	t.Cleanup(func() { e.Close() })
	id, err := e.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	f := &engramFixture{e: e, layout: EngramLayout{MaxN: 3, Heads: 2, Multipliers: []int64{3, 5, 7},
		Moduli: []int64{211, 223, 227, 229}, Offsets: []int64{0, 211, 434, 661}, Rows: rows,
		Table: TableMap{RowBytes: rowBytes, Base: At(id, 0), First: rows, PerStripe: 1, Stripe: rowBytes, Devices: []RangeID{id}},
		Sets:  sets, SpillSlots: spill, Protect: 2}}
	alloc := func(n int64) Buffer {
		b, err := e.Alloc(max(n, 8))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	f.params, f.tags = alloc(f.layout.ParamBytes()), alloc(f.layout.TagBytes())
	f.cache, f.out = alloc(int64(max(f.layout.CacheSlots(), 64))*rowBytes), alloc(EngramOutBytes(64))
	if err := e.Upload(f.params, 0, AsBytes(f.layout.Params())); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *engramFixture) step(windows []int64, epoch uint64) EngramStep {
	return EngramStep{Layout: &f.layout, Params: f.params, Tags: f.tags, Cache: f.cache, Windows: windows, Epoch: epoch,
		Out: Span{Buf: f.out}}
}

// run plans a step and returns its slots and counts.
func (f *engramFixture) run(t *testing.T, s EngramStep) ([]int32, EngramCounts, error) {
	t.Helper()
	h, err := f.e.PlanEngram(s)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	n := len(s.Windows) / s.Layout.MaxN * s.Layout.RowsPerToken()
	b := make([]byte, EngramOutBytes(n))
	if err := f.e.Download(b, f.out, 0); err != nil {
		t.Fatal(err)
	}
	slots := make([]int32, n)
	c, err := ReadEngramOut(b, slots)
	return slots, c, err
}

// TestEngramTwinHashesAndFetches: the twin's rows follow the layout's
// hash (order-major, offsets added), each slot receives its row's bytes,
// a repeated call hits, and a call beyond the cache's room reports
// ErrNoRoom with slot -1 for the rows left out.
func TestEngramTwinHashesAndFetches(t *testing.T) {
	f := newEngramFixture(t, 4, 4)
	windows := []int64{10, 2, 2, 11, 10, 2}
	want := func(w []int64, r int) int64 { // rows 0, 1: bigram heads; 2, 3: trigram heads
		mix := w[0]*3 ^ w[1]*5
		if r >= 2 {
			mix ^= w[2] * 7
		}
		return mix%f.layout.Moduli[r] + f.layout.Offsets[r]
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
	if c.Hits+c.Fetched != 8 || c.NoRoom != 0 {
		t.Errorf("first call: %+v", c)
	}
	again, c, err := f.run(t, f.step(windows, 2))
	if err != nil || c.Hits != 8 || c.Fetched != 0 {
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
	if !errors.Is(err, ErrNoRoom) || c.NoRoom == 0 || c.Spilled != 2 {
		t.Fatalf("crowded call: %+v, %v", c, err)
	}
	none := 0
	for _, s := range slots {
		if s < 0 {
			none++
		}
	}
	if none != c.NoRoom {
		t.Errorf("%d slots of -1, %d rows counted without room", none, c.NoRoom)
	}
}

// TestEngramStepRefusals: malformed layouts and steps are errors before
// anything runs, including a table reaching outside registered memory.
func TestEngramStepRefusals(t *testing.T) {
	f := newEngramFixture(t, 4, 4)
	ok := []int64{1, 2, 3}
	for _, tc := range []struct {
		name string
		edit func(s *EngramStep, l *EngramLayout)
		want error
	}{
		{"max n-gram 1", func(s *EngramStep, l *EngramLayout) { l.MaxN = 1 }, ErrBadRequest},
		{"missing multiplier", func(s *EngramStep, l *EngramLayout) { l.Multipliers = l.Multipliers[:2] }, ErrBadRequest},
		{"modulus past the table", func(s *EngramStep, l *EngramLayout) { l.Offsets[3] = 900 }, ErrBadRequest},
		{"sets not a power of two", func(s *EngramStep, l *EngramLayout) { l.Sets = 3 }, ErrBadRequest},
		{"rows of 6 bytes", func(s *EngramStep, l *EngramLayout) { l.Table.RowBytes = 6 }, ErrBadRequest},
		{"table beyond its range", func(s *EngramStep, l *EngramLayout) { l.Rows, l.Table.First = 2000, 2000 }, ErrOutOfBounds},
		{"unregistered range", func(s *EngramStep, l *EngramLayout) { l.Table.Base = At(9, 0) }, ErrNoRange},
		{"ragged windows", func(s *EngramStep, l *EngramLayout) { s.Windows = ok[:2] }, ErrBadRequest},
		{"epoch 0", func(s *EngramStep, l *EngramLayout) { s.Epoch = 0 }, ErrBadRequest},
		{"no tags", func(s *EngramStep, l *EngramLayout) { s.Tags = nil }, ErrBadRequest},
		{"output past its buffer", func(s *EngramStep, l *EngramLayout) { s.Out.Offset = f.out.Len() - 8 }, ErrOutOfBounds},
		{"cache too small", func(s *EngramStep, l *EngramLayout) { l.Sets = 64 }, ErrOutOfBounds},
	} {
		l := f.layout
		l.Multipliers = append([]int64(nil), l.Multipliers...)
		l.Offsets = append([]int64(nil), l.Offsets...)
		s := f.step(ok, 1)
		s.Layout = &l
		tc.edit(&s, &l)
		if _, err := f.e.PlanEngram(s); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if _, err := ReadEngramOut(make([]byte, 8), make([]int32, 1)); !errors.Is(err, ErrBadRequest) {
		t.Errorf("short output: %v", err)
	}
}

// TestTableMapStripes: rows after the first stripe boundary go round the
// devices stripe by stripe, as package tier lays stripes out.
func TestTableMapStripes(t *testing.T) {
	m := TableMap{RowBytes: 100, Base: At(0, 4096+250), First: 2, PerStripe: 3, Stripe: 400, Stripe0: 1, Control: 4096,
		Devices: []RangeID{5, 6, 7}}
	for _, tc := range []struct {
		row  int64
		want Addr
	}{
		{0, At(0, 4096+250)}, {1, At(0, 4096+350)},
		{2, At(6, 4096)}, {4, At(6, 4096+200)}, // stripe 1: device 1, first stripe there
		{5, At(7, 4096)},     // stripe 2: device 2
		{8, At(5, 4096+400)}, // stripe 3: device 0, its second stripe
		{11, At(6, 4096+400)},
	} {
		if got := m.Addr(tc.row); got != tc.want {
			t.Errorf("row %d at %v, want %v", tc.row, got, tc.want)
		}
	}
}
