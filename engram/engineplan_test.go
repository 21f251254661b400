package engram

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cxltier/cxltier/internal/tokentrace"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// planEngines are the engines the planner tests run on: the CPU engine's
// Go twin, which plans rows one at a time in order and so must give
// exactly the host's slots, and (with -tags cuda) the CUDA kernel, whose
// threads race for ways, so that its slots may differ but every slot
// must hold its row.
var planEngines = []struct {
	name  string
	exact bool
	make  func(t testing.TB) kernels.Engine
}{{"cpu", true, func(t testing.TB) kernels.Engine {
	e := kernels.NewCPU(1)
	t.Cleanup(func() { e.Close() })
	return e
}}}

// planPair is a host-planned prefetcher on a CPU engine and an
// engine-planned one on the engine under test, over the same tables.
type planPair struct {
	h         *Hasher
	host, dev *Prefetcher
	hEng      *kernels.CPU
	dEng      kernels.Engine
	exact     bool
}

func newPlanPair(t testing.TB, r *tier.Region, c *tier.Client, opts PrefetchOptions) *planPair {
	return newPlanPairOn(t, r, c, opts, planEngines[0].make(t), true)
}

func newPlanPairOn(t testing.TB, r *tier.Region, c *tier.Client, opts PrefetchOptions, dEng kernels.Engine, exact bool) *planPair {
	t.Helper()
	return newPlanPairGeometry(t, r, c, tinyGeometry(), opts, dEng, exact)
}

func newPlanPairGeometry(t testing.TB, r *tier.Region, c *tier.Client, g Geometry, opts PrefetchOptions, dEng kernels.Engine, exact bool) *planPair {
	t.Helper()
	h, err := NewHasher(g)
	if err != nil {
		t.Fatal(err)
	}
	var tables []*Table
	for _, l := range g.LayerIDs {
		tb, err := OpenTable(r, g, h, l, false)
		if errors.Is(err, tier.ErrNotFound) {
			tb, err = CreateTable(c, g, h, l, func(i int64, b []byte) error { SyntheticRow(l, i, b); return nil }, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		tables = append(tables, tb)
	}
	pp := &planPair{h: h, hEng: kernels.NewCPU(1), dEng: dEng, exact: exact}
	t.Cleanup(func() { pp.hEng.Close(); pp.dEng.Close() })
	opts.Planner = PlanHost
	if pp.host, err = NewPrefetcher(pp.hEng, c, h, tables, opts); err != nil {
		t.Fatal(err)
	}
	opts.Planner = PlanEngine
	if pp.dev, err = NewPrefetcher(pp.dEng, c, h, tables, opts); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pp.host.Close(); pp.dev.Close() })
	return pp
}

// call runs one prefetch on both and requires every slot to hold its row,
// and the same slots where the engine plans exactly like the host.
func (pp *planPair) call(t testing.TB, layer int, hists, seqs [][]int64) {
	t.Helper()
	var got [2][]int32
	for i, p := range []*Prefetcher{pp.host, pp.dev} {
		pd, err := p.Prefetch(layer, hists, seqs)
		if err != nil {
			t.Fatalf("%v planner: %v", p.opts.Planner, err)
		}
		if _, err := pd.Wait(); err != nil {
			t.Fatalf("%v planner: wait: %v", p.opts.Planner, err)
		}
		checkRowsAfter(t, p, pp.h, layer, hists, seqs, pd.Slots)
		checkOneWayPerRow(t, p, layer)
		got[i] = pd.Slots
	}
	if pp.exact && !slices.Equal(got[0], got[1]) {
		for i := range got[0] {
			if got[0][i] != got[1][i] {
				t.Fatalf("layer %d row %d of %d: host planning gave slot %d, engine planning %d", layer, i, len(got[0]), got[0][i], got[1][i])
			}
		}
	}
}

// TestEnginePlanMatchesHost holds the engine's planner (on the CPU engine,
// the Go twin of engram.cu) to the host cache: over random calls of skewed
// ids with histories, on tiers of one to three striped devices, with and
// without the cache and at sizes that spill, every row gets the slot the
// host gives it, the slot holds the row's bytes, and the counters agree.
func TestEnginePlanMatchesHost(t *testing.T) {
	for _, tc := range []struct {
		devices, slots, protect, maxTokens int
		cache                              bool
	}{
		{devices: 1, slots: 512, protect: 2, maxTokens: 12, cache: true},
		{devices: 2, slots: 512, protect: 2, maxTokens: 12, cache: true},
		{devices: 3, slots: 1000, protect: 3, maxTokens: 10, cache: true},
		{devices: 2, slots: 300, protect: 1, maxTokens: 16, cache: true},
		{devices: 2, slots: 130, protect: 2, maxTokens: 3, cache: true}, // 8 sets: spills
		{devices: 2, slots: 512, protect: 2, maxTokens: 40, cache: false},
	} {
		for _, pe := range planEngines {
			name := fmt.Sprintf("%s-dev%d-slots%d-protect%d-cache%v", pe.name, tc.devices, tc.slots, tc.protect, tc.cache)
			t.Run(name, func(t *testing.T) {
				r, c := testTier(t, tc.devices)
				pp := newPlanPairOn(t, r, c, PrefetchOptions{Slots: tc.slots, Protect: tc.protect, Cache: tc.cache}, pe.make(t), pe.exact)
				g := pp.h.Geometry()
				rng := rand.New(rand.NewPCG(uint64(tc.slots), uint64(tc.devices)))
				zipf := rand.NewZipf(rng, 1.2, 1, uint64(g.Vocab-1))
				hists := make([][]int64, 8)
				for call := range 80 {
					batch := 1 + rng.IntN(min(len(hists), tc.maxTokens))
					seqs := make([][]int64, batch)
					for b := range seqs {
						for range 1 + rng.IntN(max(1, tc.maxTokens/batch)) {
							seqs[b] = append(seqs[b], int64(zipf.Uint64()))
						}
					}
					pp.call(t, g.LayerIDs[call%2], hists[:batch], seqs)
					for b := range seqs {
						hists[b] = append(hists[b], seqs[b]...)
					}
				}
				hm, dm := pp.host.Metrics(), pp.dev.Metrics()
				for _, c := range []struct {
					what string
					h, d uint64
				}{{"calls", hm.Calls.Load(), dm.Calls.Load()}, {"rows", hm.Rows.Load(), dm.Rows.Load()},
					{"hits", hm.Hits.Load(), dm.Hits.Load()}, {"fetched", hm.Fetched.Load(), dm.Fetched.Load()}} {
					if c.h != c.d && (pp.exact || c.what == "calls" || c.what == "rows") {
						t.Errorf("%s: host %d, engine %d", c.what, c.h, c.d)
					}
				}
				if dm.Hits.Load()+dm.Fetched.Load() != dm.Rows.Load() {
					t.Errorf("engine: %d hits + %d fetched != %d rows", dm.Hits.Load(), dm.Fetched.Load(), dm.Rows.Load())
				}
				if tc.cache && (hm.Hits.Load() == 0 || dm.Hits.Load() == 0) {
					t.Errorf("skewed ids never hit the cache (host %d, engine %d hits): the comparison proves little", hm.Hits.Load(), dm.Hits.Load())
				}
			})
		}
	}
}

// TestEnginePlanRefusals: bad ids, unknown layers and calls larger than
// the cache are refused before the engine runs anything, as on the host.
func TestEnginePlanRefusals(t *testing.T) {
	r, c := testTier(t, 1)
	pp := newPlanPair(t, r, c, PrefetchOptions{Slots: 20, Cache: true})
	for _, tc := range []struct {
		layer int
		seqs  [][]int64
		want  error
	}{
		{1, [][]int64{{1, 2, 3}}, ErrCacheTooSmall}, // 24 rows, 20 slots
		{3 + 1, [][]int64{{1}}, ErrInput},
		{1, [][]int64{{1}, {500}}, ErrInput},
		{1, [][]int64{{-1}}, ErrInput},
	} {
		if _, err := pp.dev.Prefetch(tc.layer, nil, tc.seqs); !errors.Is(err, tc.want) {
			t.Errorf("layer %d ids %v: %v, want %v", tc.layer, tc.seqs, err, tc.want)
		}
	}
	if m := pp.dev.Metrics(); m.Calls.Load() != 0 {
		t.Errorf("%d refused calls counted", m.Calls.Load())
	}
	// The engine keeps working after refusals.
	pp.call(t, 1, nil, [][]int64{{4, 5}})
	if _, err := ParsePlanner("gpu"); !errors.Is(err, ErrInput) {
		t.Errorf("planner gpu: %v", err)
	}
}

// FuzzEnginePlan feeds arbitrary ids (the bytes, two per id, some outside
// the vocabulary) to a host-planned and an engine-planned prefetcher that
// live across inputs: both refuse the same inputs, and give every row the
// same slot holding the same bytes. The cache is large enough that no call
// runs out of room (there the planners differ on purpose: see
// TestEnginePlanOutOfRoom).
func FuzzEnginePlan(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 0, 3}, uint8(1))
	f.Add([]byte{1, 244, 0, 0}, uint8(3))
	f.Add([]byte{7, 7, 7, 7, 7, 7, 7, 7}, uint8(2))
	r, c := testTier(f, 2)
	// 128 sets and spill banks of 488 slots: a call has at most 192 rows.
	pp := newPlanPair(f, r, c, PrefetchOptions{Slots: 2000, Cache: true})
	f.Fuzz(func(t *testing.T, b []byte, split uint8) {
		var ids []int64
		for i := 0; i+1 < len(b) && len(ids) < 24; i += 2 {
			ids = append(ids, int64(b[i])<<8|int64(b[i+1]))
		}
		cut := min(int(split), len(ids))
		seqs := [][]int64{ids[:cut], ids[cut:]}
		_, errH := pp.host.Prefetch(1, nil, seqs)
		_, errD := pp.dev.Prefetch(1, nil, seqs)
		if (errH == nil) != (errD == nil) {
			t.Fatalf("ids %v: host %v, engine %v", ids, errH, errD)
		}
		if errH != nil {
			return
		}
		// The calls above are done with; check that the planners agree on a
		// fresh call too (waiting on the ones above happened inside).
		pp.call(t, 1, nil, seqs)
	})
}

// TestEnginePlanOutOfRoom: a call whose rows crowd one set beyond its ways
// and the spill bank is refused by the host planner before anything
// changes, and reported by Wait on the engine planner, which gives the
// rows without room slot -1 and leaves every placed row in its slot.
func TestEnginePlanOutOfRoom(t *testing.T) {
	for _, pe := range planEngines {
		t.Run(pe.name, func(t *testing.T) { testOutOfRoom(t, pe.make(t), pe.exact) })
	}
}

func testOutOfRoom(t *testing.T, eng kernels.Engine, exact bool) {
	r, c := testTier(t, 1)
	pp := newPlanPairOn(t, r, c, PrefetchOptions{Slots: 20, Cache: true}, eng, exact) // 2 sets of 8, banks of 2
	rng := rand.New(rand.NewPCG(5, 5))
	var seqs [][]int64
	for seqs == nil {
		ids := []int64{rng.Int64N(500), rng.Int64N(500)}
		rows, err := pp.h.Hash(nil, 1, nil, ids)
		if err != nil {
			t.Fatal(err)
		}
		perSet := map[uint64]int{}
		for _, row := range rows {
			perSet[setOf(row, 2)]++
		}
		if perSet[0] > 10 || perSet[1] > 10 {
			seqs = [][]int64{ids}
		}
	}
	if _, err := pp.host.Prefetch(1, nil, seqs); !errors.Is(err, ErrCacheTooSmall) {
		t.Fatalf("host planner: %v", err)
	}
	pd, err := pp.dev.Prefetch(1, nil, seqs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pd.Wait(); !errors.Is(err, ErrCacheTooSmall) {
		t.Fatalf("engine planner: %v", err)
	}
	rows, _ := pp.h.Hash(nil, 1, nil, seqs[0])
	buf, _ := pp.dev.CacheBuffer(1)
	mem := make([]byte, buf.Len())
	if err := pp.dEng.Download(mem, buf, 0); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, pp.h.Geometry().RowBytes)
	rb := int64(len(want))
	without := 0
	for i, s := range pd.Slots {
		if s < 0 {
			without++
			continue
		}
		SyntheticRow(1, rows[i], want)
		if string(mem[int64(s)*rb:int64(s+1)*rb]) != string(want) {
			t.Fatalf("row %d placed in slot %d does not hold its bytes", i, s)
		}
	}
	if without == 0 {
		t.Fatal("no row was left without room")
	}
	// The next call that fits works on both.
	pp.dev.Prefetch(1, nil, [][]int64{{3}})
	pd, err = pp.dev.Prefetch(1, nil, [][]int64{{4}})
	if err == nil {
		_, err = pd.Wait()
	}
	if err != nil {
		t.Fatalf("a call that fits, after one that did not: %v", err)
	}
}

// TestEnginePlanMatchesHostOnText replays real text (the head of the
// pydocs trace, testdata/README.md) as 8 concurrent requests through both
// planners with the cache on: n-grams of text repeat, so calls hit, evict
// and spill as they do in service, and the engine's planner must give
// every row the host's slot and bytes, call for call.
func TestEnginePlanMatchesHostOnText(t *testing.T) {
	tr, err := tokentrace.Read("testdata/pydocs-head.u32")
	if err != nil {
		t.Fatal(err)
	}
	g := Geometry{Name: "text", LayerIDs: []int{1}, MaxNgram: 3, Heads: 4, BaseSizes: []int64{2000, 2400},
		Seed: 11, Vocab: 99092, PadID: 2, RowBytes: 64, DType: "float32"}
	for _, pe := range planEngines {
		t.Run(pe.name, func(t *testing.T) {
			r, c := testTier(t, 2)
			pp := newPlanPairGeometry(t, r, c, g, PrefetchOptions{Slots: 4000, Protect: 2, Cache: true}, pe.make(t), pe.exact)
			rp, err := tokentrace.NewReplay(tr, 8, g.MaxNgram-1)
			if err != nil {
				t.Fatal(err)
			}
			steps := 0
			for ; steps < 600; steps++ {
				hist, ids, ok := rp.Step()
				if !ok {
					break
				}
				pp.call(t, 1, hist, ids)
			}
			hm, dm := pp.host.Metrics(), pp.dev.Metrics()
			if steps < 600 || hm.Hits.Load() == 0 || hm.Fetched.Load() == 0 {
				t.Fatalf("%d steps, %d hits, %d fetched: the replay did not exercise the cache", steps, hm.Hits.Load(), hm.Fetched.Load())
			}
			if pe.exact && (hm.Hits.Load() != dm.Hits.Load() || hm.Fetched.Load() != dm.Fetched.Load()) {
				t.Fatalf("hits %d vs %d, fetched %d vs %d", hm.Hits.Load(), dm.Hits.Load(), hm.Fetched.Load(), dm.Fetched.Load())
			}
			t.Logf("%d steps of 8 tokens: %.0f%% of rows hit", steps, 100*float64(hm.Hits.Load())/float64(hm.Rows.Load()))
		})
	}
}

// checkOneWayPerRow requires that no set of an engine-planned cache holds
// a row in two ways. Kernel lanes that want one row at once take the set's
// lock in turn and the second finds the first's way; a row in two ways
// wastes a way and fetches the row twice.
func checkOneWayPerRow(t testing.TB, p *Prefetcher, layer int) {
	t.Helper()
	ep, ok := p.layers[layer].pl.(*enginePlan)
	if !ok || ep.tags == nil {
		return
	}
	sets := ep.layout.sets
	b := make([]byte, sets*ways*8)
	if err := p.eng.Download(b, ep.tags, 0); err != nil {
		t.Fatal(err)
	}
	for set := range sets {
		seen := map[uint64]int{}
		for w := range ways {
			tag := binary.LittleEndian.Uint64(b[(set*ways+w)*8:])
			if tag == 0 {
				continue
			}
			if w0, dup := seen[tag>>16]; dup {
				t.Fatalf("layer %d set %d holds row %d in ways %d and %d", layer, set, tag>>16-1, w0, w)
			}
			seen[tag>>16] = w
		}
	}
}
