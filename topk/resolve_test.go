package topk

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cxltier/cxltier/kernels"
)

// checkSlots verifies that every selection's slot holds that token's bytes.
func checkSlots(t *testing.T, p *Pool, eng *kernels.CPU, layer int, reqs []int, sel, out []int32) {
	t.Helper()
	buf, _ := eng.Bytes(p.Buffer(layer))
	e := p.Config().EntryBytes
	k := p.Config().TopK
	for b, req := range reqs {
		for i := range k {
			pos, slot := sel[b*k+i], out[b*k+i]
			if pos < 0 {
				continue
			}
			row := p.Row(req, int(slot))
			if got := buf[row*e : (row+1)*e]; !bytes.Equal(got, entry(req, layer, int64(pos), e)) {
				t.Fatalf("request %d layer %d: slot %d should hold position %d", req, layer, slot, pos)
			}
		}
	}
}

func TestResolveHandWorked(t *testing.T) {
	_, c := testTier(t, 1)
	p, eng := testPool(t, c, Config{Layers: 1, EntryBytes: 64, Slots: 4, TopK: 2, MaxRequests: 2})
	if err := p.Register(1, Sequence{Layers: 1, EntryBytes: 64, Capacity: 8}); err != nil {
		t.Fatal(err)
	}
	appendTokens(t, p, 1, 0, 8)
	for _, step := range []struct {
		seqLen   int64
		sel      []int32
		wantOut  []int32
		wantLRU  []int16
		hits, ms int
	}{
		// short: slot = position
		{3, []int32{2, 0}, []int32{2, 0}, []int16{0, 1, 2, 3}, 2, 0},
		// newest → reserved slot 4; 2 hits in slot 2
		{6, []int32{5, 2}, []int32{4, 2}, []int16{0, 1, 3, 2}, 1, 0},
		// 4 misses into the LRU evictable slot 1; 0 hits
		{7, []int32{4, 0}, []int32{1, 0}, []int16{3, 2, 1, 0}, 1, 1},
		// 1 is gone (slot 1 holds 4): miss into slot 3
		{8, []int32{1, 2}, []int32{3, 2}, []int16{1, 0, 3, 2}, 1, 1},
	} {
		out := make([]int32, 2)
		st, err := p.Resolve(0, []int{1}, []int64{step.seqLen}, step.sel, out)
		if err != nil {
			t.Fatal(err)
		}
		lru := p.seqs[1].layers[0].table.lru
		if !slices.Equal(out, step.wantOut) || !slices.Equal(lru, step.wantLRU) || st.Hits != step.hits || st.Misses != step.ms {
			t.Fatalf("len %d sel %v: out %v lru %v %+v; want %v %v hits %d misses %d",
				step.seqLen, step.sel, out, lru, st, step.wantOut, step.wantLRU, step.hits, step.ms)
		}
		checkSlots(t, p, eng, 0, []int{1}, step.sel, out)
	}
}

// model is SGLang's swap-in written the plain way, with maps, to check the
// table's fast path against.
type model struct {
	tokens []int32
	lru    []int
}

func newModel(slots int) *model {
	m := &model{tokens: make([]int32, slots), lru: make([]int, slots)}
	for s := range slots {
		m.tokens[s], m.lru[s] = int32(s), s
	}
	return m
}

func (m *model) step(seqLen int64, sel []int32) []int32 {
	slots := len(m.lru)
	out := make([]int32, len(sel))
	if seqLen <= int64(slots) {
		for i, p := range sel {
			out[i] = max(p, -1)
		}
		return out
	}
	newest := int32(seqLen - 1)
	want := map[int32]bool{}
	for _, p := range sel {
		if p >= 0 && p != newest {
			want[p] = true
		}
	}
	slotOf := map[int32]int{}
	var hit, evict []int
	for _, s := range m.lru {
		if tok := m.tokens[s]; tok >= 0 && want[tok] {
			if _, dup := slotOf[tok]; !dup {
				slotOf[tok] = s
				hit = append(hit, s)
				continue
			}
		}
		evict = append(evict, s)
	}
	misses := 0
	for _, p := range sel {
		if _, ok := slotOf[p]; !ok && want[p] {
			slotOf[p] = evict[misses]
			m.tokens[evict[misses]] = p
			misses++
		}
	}
	for i, p := range sel {
		switch {
		case p < 0:
			out[i] = -1
		case p == newest:
			out[i] = int32(slots)
		default:
			out[i] = int32(slotOf[p])
		}
	}
	m.lru = slices.Concat(evict[misses:], evict[:misses], hit)
	return out
}

// TestRandomTraces runs several requests through many steps of traces with
// varying overlap (duplicates and padding included) on a striped tier and
// checks after every step: the model agrees, each selected slot holds its
// token's bytes, slot tables hold no duplicate token and LRU orders are
// permutations.
func TestRandomTraces(t *testing.T) {
	_, c := testTier(t, 2)
	const layers, slots, k, reqs = 2, 64, 24, 3
	p, eng := testPool(t, c, Config{Layers: layers, EntryBytes: 144, Slots: slots, TopK: k, MaxRequests: 4})
	rng := rand.New(rand.NewPCG(1, 2))
	ids := []int{3, 0, 2}
	lens := make([]int64, reqs)
	models := make([][]*model, reqs)
	for b, req := range ids {
		if err := p.Register(req, Sequence{Layers: layers, EntryBytes: 144, Capacity: 100}); err != nil {
			t.Fatal(err)
		}
		lens[b] = int64(1 + rng.IntN(2*slots))
		appendTokens(t, p, req, 0, lens[b]+400)
		models[b] = []*model{newModel(slots), newModel(slots)}
	}
	prev := make([][]int32, reqs)
	for step := range 300 {
		overlap := []float64{0, 0.5, 0.9, 1}[step/75]
		sel := make([]int32, 0, reqs*k)
		for b := range ids {
			lens[b]++
			prev[b] = randomSelection(rng, prev[b], lens[b], k, overlap)
			sel = append(sel, prev[b]...)
		}
		for layer := range layers {
			out := make([]int32, len(sel))
			if _, err := p.Resolve(layer, ids, lens, sel, out); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			for b := range ids {
				want := models[b][layer].step(lens[b], sel[b*k:(b+1)*k])
				if !slices.Equal(out[b*k:(b+1)*k], want) {
					t.Fatalf("step %d request %d layer %d (len %d): slots %v, model %v\nselections %v",
						step, ids[b], layer, lens[b], out[b*k:(b+1)*k], want, sel[b*k:(b+1)*k])
				}
				checkTable(t, &p.seqs[ids[b]].layers[layer].table, models[b][layer])
			}
			checkSlots(t, p, eng, layer, ids, sel, out)
		}
	}
	st := p.Stats()
	if st.Hits == 0 || st.Misses == 0 || st.Fills == 0 || st.BytesFetched == 0 {
		t.Errorf("a trace that should exercise every path did not: %+v", st)
	}
}

func checkTable(t *testing.T, tb *table, m *model) {
	t.Helper()
	seen := map[int32]bool{}
	for s, tok := range tb.tokens[:len(tb.lru)] {
		if tok != m.tokens[s] {
			t.Fatalf("slot %d: token %d, model %d", s, tok, m.tokens[s])
		}
		if tok >= 0 && seen[tok] {
			t.Fatalf("token %d in two slots", tok)
		}
		seen[tok] = true
	}
	order := make([]int, len(tb.lru))
	for i, s := range tb.lru {
		order[i] = int(s)
		if order[i] != m.lru[i] {
			t.Fatalf("LRU %v, model %v", tb.lru, m.lru)
		}
	}
	slices.Sort(order)
	for i, s := range order {
		if i != s {
			t.Fatalf("LRU order is not a permutation: %v", tb.lru)
		}
	}
}

// randomSelection keeps about overlap of prev, fills up with random
// positions below n (with an occasional duplicate and -1 padding), and
// usually selects the newest token.
func randomSelection(rng *rand.Rand, prev []int32, n int64, k int, overlap float64) []int32 {
	sel := make([]int32, 0, k)
	if rng.IntN(4) != 0 {
		sel = append(sel, int32(n-1))
	}
	for _, p := range prev {
		if len(sel) < k && rng.Float64() < overlap && p >= 0 && !slices.Contains(sel, p) {
			sel = append(sel, p)
		}
	}
	for len(sel) < k {
		switch r := rng.IntN(40); {
		case r == 0 && len(sel) > 0:
			sel = append(sel, sel[rng.IntN(len(sel))]) // a duplicate
		case r == 1:
			sel = append(sel, -1)
		default:
			sel = append(sel, int32(rng.Int64N(n)))
		}
	}
	rng.Shuffle(len(sel), func(i, j int) { sel[i], sel[j] = sel[j], sel[i] })
	return sel
}

func TestBadInputChangesNothing(t *testing.T) {
	_, c := testTier(t, 1)
	if _, err := New(c, kernels.NewCPU(1), nil, Config{Layers: 1, EntryBytes: 64, Slots: 8, TopK: 9, MaxRequests: 1}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("k > S: %v", err)
	}
	if _, err := New(c, kernels.NewCPU(1), nil, Config{Layers: 1, EntryBytes: 650, MaxRequests: 1}); !errors.Is(err, ErrBadConfig) {
		t.Errorf("entry size not a multiple of 16: %v", err)
	}
	p, _ := testPool(t, c, Config{Layers: 2, EntryBytes: 64, Slots: 8, TopK: 4, MaxRequests: 3})
	if err := p.Register(0, Sequence{Layers: 2, EntryBytes: 48, Capacity: 10}); !errors.Is(err, ErrBadEntry) {
		t.Errorf("wrong entry size: %v", err)
	}
	if err := p.Register(0, Sequence{Layers: 3, EntryBytes: 64, Capacity: 10}); !errors.Is(err, ErrBadEntry) {
		t.Errorf("wrong layer count: %v", err)
	}
	for _, req := range []int{0, 1} {
		if err := p.Register(req, Sequence{Layers: 2, EntryBytes: 64, Capacity: 10}); err != nil {
			t.Fatal(err)
		}
		appendTokens(t, p, req, 0, 20)
	}
	if err := p.Register(1, Sequence{Layers: 2, EntryBytes: 64}); !errors.Is(err, ErrRegistered) {
		t.Errorf("second register: %v", err)
	}
	if err := p.Append(0, 0, make([]byte, 65)); !errors.Is(err, ErrBadEntry) {
		t.Errorf("partial entry: %v", err)
	}
	out := make([]int32, 8)
	good := []int32{1, 2, 3, 19, 4, 5, 6, 19}
	if _, err := p.Resolve(0, []int{0, 1}, []int64{20, 20}, good, out); err != nil {
		t.Fatal(err)
	}
	before := snapshotTables(p)
	statsBefore := p.Stats()
	for _, tc := range []struct {
		name  string
		layer int
		reqs  []int
		lens  []int64
		sel   []int32
		want  error
		says  string
	}{
		{"position ≥ length", 0, []int{0, 1}, []int64{20, 20}, []int32{1, 2, 3, 4, 5, 6, 7, 20}, ErrBadPosition, "request 1: selection 3 is position 20"},
		{"position < -1", 0, []int{0, 1}, []int64{20, 20}, []int32{-2, 2, 3, 4, 5, 6, 7, 8}, ErrBadPosition, "request 0: selection 0"},
		{"unknown request", 0, []int{0, 2}, []int64{20, 20}, good, ErrUnknown, "request 2"},
		{"request out of range", 0, []int{0, 7}, []int64{20, 20}, good, ErrBadInput, "request 7"},
		{"request twice", 0, []int{1, 1}, []int64{20, 20}, good, ErrBadInput, "twice"},
		{"not appended", 1, []int{0, 1}, []int64{21, 20}, good, ErrNotAppended, "length 21, 20 entries"},
		{"length 0", 1, []int{0, 1}, []int64{0, 20}, good, ErrNotAppended, "length 0"},
		{"short selections", 0, []int{0, 1}, []int64{20, 20}, good[:7], ErrBadInput, "need 8"},
		{"lengths mismatch", 0, []int{0, 1}, []int64{20}, good, ErrBadInput, "2 requests but 1 lengths"},
		{"layer", 2, []int{0, 1}, []int64{20, 20}, good, ErrBadInput, "layer 2 of 2"},
	} {
		_, err := p.Resolve(tc.layer, tc.reqs, tc.lens, tc.sel, make([]int32, len(tc.sel)))
		if !errors.Is(err, tc.want) || !bytes.Contains([]byte(err.Error()), []byte(tc.says)) {
			t.Errorf("%s: %v; want %v saying %q", tc.name, err, tc.want, tc.says)
		}
	}
	if after := snapshotTables(p); after != before || p.Stats() != statsBefore {
		t.Error("a refused step changed the tables or counters")
	}
}

func snapshotTables(p *Pool) string {
	var b bytes.Buffer
	for _, s := range p.seqs {
		if s != nil {
			for _, l := range s.layers {
				fmt.Fprint(&b, l.table.tokens, l.table.lru, l.table.loaded, l.length)
			}
		}
	}
	return b.String()
}

func TestDuplicatesCountOnce(t *testing.T) {
	_, c := testTier(t, 1)
	p, eng := testPool(t, c, Config{Layers: 1, EntryBytes: 32, Slots: 8, TopK: 6, MaxRequests: 1})
	p.Register(0, Sequence{Layers: 1, EntryBytes: 32, Capacity: 50})
	appendTokens(t, p, 0, 0, 50)
	sel := []int32{30, 12, 30, 49, 49, -1}
	out := make([]int32, 6)
	st, err := p.Resolve(0, []int{0}, []int64{50}, sel, out)
	if err != nil {
		t.Fatal(err)
	}
	if out[0] != out[2] || out[3] != 8 || out[4] != 8 || out[5] != -1 || st.Misses != 2 || st.Newest != 1 || st.Bytes != 3*32 {
		t.Errorf("out %v, %+v", out, st)
	}
	checkSlots(t, p, eng, 0, []int{0}, sel, out)
}

func TestAppendFromEngineAndFree(t *testing.T) {
	r, c := testTier(t, 2)
	p, eng := testPool(t, c, Config{Layers: 1, EntryBytes: 4096, Slots: 4, TopK: 2, MaxRequests: 1})
	free := r.Snapshot().Chunks.Free
	if err := p.Register(0, Sequence{Layers: 1, EntryBytes: 4096, Capacity: 10}); err != nil {
		t.Fatal(err)
	}
	// 200 entries of 4 KiB span several 256 KiB extents on both devices.
	src, _ := eng.Alloc(200 * 4096)
	defer src.Free()
	host, _ := eng.Bytes(src)
	for pos := range int64(200) {
		copy(host[pos*4096:], entry(0, 0, pos, 4096))
	}
	if err := p.AppendFrom(0, 0, src, 0, 120); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendFrom(0, 0, src, 120, 80); err != nil {
		t.Fatal(err)
	}
	if n, _ := p.Len(0, 0); n != 200 {
		t.Fatalf("length %d", n)
	}
	sel := []int32{150, 3}
	out := make([]int32, 2)
	if _, err := p.Resolve(0, []int{0}, []int64{200}, sel, out); err != nil {
		t.Fatal(err)
	}
	checkSlots(t, p, eng, 0, []int{0}, sel, out)
	if st := p.Stats(); st.Extents < 4 || st.Sequences != 1 {
		t.Errorf("stats %+v", st)
	}
	if err := p.Free(0); err != nil {
		t.Fatal(err)
	}
	if got := r.Snapshot().Chunks.Free; got != free {
		t.Errorf("free chunks %d after Free, %d before", got, free)
	}
	if _, err := p.Resolve(0, []int{0}, []int64{200}, sel, out); !errors.Is(err, ErrUnknown) {
		t.Errorf("resolve after free: %v", err)
	}
}

// TestAppendAcrossExtents appends from host memory in calls that start and
// end inside extents and cross several, for two requests whose extents
// interleave in the tier, then checks entries on both sides of each
// boundary.
func TestAppendAcrossExtents(t *testing.T) {
	_, c := testTier(t, 2)
	p, eng := testPool(t, c, Config{Layers: 1, EntryBytes: 4096, Slots: 8, TopK: 4, MaxRequests: 2})
	for req := range 2 {
		p.Register(req, Sequence{Layers: 1, EntryBytes: 4096})
	}
	for _, r := range [][2]int64{{0, 30}, {30, 100}, {100, 200}} {
		for req := range 2 {
			appendTokens(t, p, req, r[0], r[1])
		}
	}
	for _, sel := range [][]int32{{63, 64, 127, 128}, {29, 30, 191, 199}} {
		for req := range 2 {
			out := make([]int32, 4)
			if _, err := p.Resolve(0, []int{req}, []int64{200}, sel, out); err != nil {
				t.Fatal(err)
			}
			checkSlots(t, p, eng, 0, []int{req}, sel, out)
		}
	}
}
