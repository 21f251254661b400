package topk

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/kernels"
)

// planEngines are the engines whose planner is held to the host planner:
// the CPU engine's Go twin always, the CUDA kernels in cuda builds
// (engineplan_cuda_test.go).
var planEngines = []struct {
	name string
	make func(t testing.TB) kernels.Engine
}{{"cpu", func(testing.TB) kernels.Engine { return kernels.NewCPU(2) }}}

// enginePair is the same sequences in two pools on one tier: ref planned
// on the host (the reference), eng planned by the engine under test.
type enginePair struct {
	ref, eng *Pool
	e        kernels.Engine
}

func newEnginePair(t testing.TB, make func(testing.TB) kernels.Engine, cfg Config) enginePair {
	_, c := tiertest.FormatAnon(t, 2, 32<<20, 256<<10)
	ref, _ := testPool(t, c, Config{Layers: cfg.Layers, EntryBytes: cfg.EntryBytes, Slots: cfg.Slots, TopK: cfg.TopK,
		MaxRequests: cfg.MaxRequests, Planner: PlanHost})
	e := make(t)
	cfg.Planner = PlanEngine
	p, err := New(c, e, nil, cfg)
	if err != nil {
		e.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
		e.Close()
	})
	if p.Planner() != PlanEngine || ref.Planner() != PlanHost {
		t.Fatalf("planners %v and %v", ref.Planner(), p.Planner())
	}
	return enginePair{ref: ref, eng: p, e: e}
}

func (ep enginePair) add(t testing.TB, req int, n int64) {
	cfg := ep.ref.Config()
	for _, p := range []*Pool{ep.ref, ep.eng} {
		if err := p.Register(req, Sequence{Layers: cfg.Layers, EntryBytes: cfg.EntryBytes, Capacity: 10}); err != nil {
			t.Fatal(err)
		}
		appendTokens(t, p, req, 0, n) // grows past the capacity: extents pushed to the engine's tables
	}
}

// step resolves one step in both pools and compares everything.
func (ep enginePair) step(t testing.TB, layer int, reqs []int, lens []int64, sel []int32) {
	t.Helper()
	want, got := make([]int32, len(sel)), make([]int32, len(sel))
	ws, werr := ep.ref.Resolve(layer, reqs, lens, sel, want)
	gs, gerr := ep.eng.Resolve(layer, reqs, lens, sel, got)
	if werr != nil || gerr != nil {
		t.Fatalf("reference: %v; engine: %v", werr, gerr)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("layer %d lens %v: engine slots %v, reference %v\nselections %v", layer, lens, got, want, sel)
	}
	ws.Plan, gs.Plan = 0, 0
	if gs != ws {
		t.Fatalf("engine step %+v, reference %+v", gs, ws)
	}
	for _, req := range reqs {
		wt, wl, wd, _ := ep.ref.tables(req, layer)
		gt, gl, gd, err := ep.eng.tables(req, layer)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(gt, wt) || !slices.Equal(gl, wl) || !slices.Equal(gd, wd) {
			t.Fatalf("request %d layer %d tables differ:\ntokens %v\n   ref %v\nlru %v\nref %v\nloaded %v\n   ref %v", req, layer, gt, wt, gl, wl, gd, wd)
		}
	}
	ep.checkBytes(t, layer, reqs, sel, got)
}

func (ep enginePair) checkBytes(t testing.TB, layer int, reqs []int, sel, out []int32) {
	t.Helper()
	e, k := ep.eng.Config().EntryBytes, ep.eng.Config().TopK
	got := make([]byte, e)
	for b, req := range reqs {
		for i := range k {
			if sel[b*k+i] < 0 {
				continue
			}
			if err := ep.e.Download(got, ep.eng.Buffer(layer), ep.eng.Row(req, int(out[b*k+i]))*e); err != nil {
				t.Fatal(err)
			}
			if want := entry(req, layer, int64(sel[b*k+i]), e); !bytes.Equal(got, want) {
				t.Fatalf("request %d layer %d: slot %d should hold position %d", req, layer, out[b*k+i], sel[b*k+i])
			}
		}
	}
}

// TestEnginePlanMatchesHost drives random traces through both planners:
// short and long sequences, overlaps from none to full, duplicates, -1
// padding, the newest token selected or not, lengths that grow and jump.
func TestEnginePlanMatchesHost(t *testing.T) {
	for _, pe := range planEngines {
		t.Run(pe.name, func(t *testing.T) {
			const layers, slots, k = 2, 64, 24
			ep := newEnginePair(t, pe.make, Config{Layers: layers, EntryBytes: 144, Slots: slots, TopK: k, MaxRequests: 5})
			rng := rand.New(rand.NewPCG(7, 8))
			reqs := []int{4, 0, 2}
			lens := make([]int64, len(reqs))
			for b, req := range reqs {
				lens[b] = int64(1 + rng.IntN(2*slots))
				ep.add(t, req, lens[b]+500)
			}
			prev := make([][]int32, len(reqs))
			for step := range 200 {
				overlap := []float64{0, 0.5, 0.9, 1}[step/50]
				sel := make([]int32, 0, len(reqs)*k)
				for b := range reqs {
					lens[b] += int64(1 + rng.IntN(2))
					prev[b] = randomSelection(rng, prev[b], lens[b], k, overlap)
					sel = append(sel, prev[b]...)
				}
				ep.step(t, step%layers, reqs, lens, sel)
				if step%37 == 0 { // a batch of one, in another order
					b := rng.IntN(len(reqs))
					ep.step(t, 1, reqs[b:b+1], lens[b:b+1], sel[b*k:(b+1)*k])
				}
			}
			if st := ep.eng.Stats(); st.Hits == 0 || st.Misses == 0 || st.Fills == 0 {
				t.Errorf("the trace did not exercise every path: %+v", st)
			}
		})
	}
}

// TestEnginePlanBadSelectionChangesNothing: a bad position in any request
// of a batch, found by the engine in engine memory, leaves every table as
// it was and names the request.
func TestEnginePlanBadSelectionChangesNothing(t *testing.T) {
	for _, pe := range planEngines {
		t.Run(pe.name, func(t *testing.T) {
			ep := newEnginePair(t, pe.make, Config{Layers: 1, EntryBytes: 32, Slots: 8, TopK: 4, MaxRequests: 3})
			ep.add(t, 1, 40)
			ep.add(t, 2, 40)
			p, e := ep.eng, ep.e
			sel, out := mustAlloc(t, e, 32), mustAlloc(t, e, 32)
			upload := func(v []int32) {
				if err := e.Upload(sel, 0, kernels.AsBytes(v)); err != nil {
					t.Fatal(err)
				}
			}
			upload([]int32{0, 1, 2, 39, 5, 6, 7, 39})
			if _, err := p.ResolveIn(0, []int{1, 2}, []int64{40, 40}, kernels.Span{Buf: sel}, kernels.Span{Buf: out}); err != nil {
				t.Fatal(err)
			}
			before := engineTables(t, p, 1, 2)
			for _, bad := range []int32{40, -2, 1 << 30} {
				upload([]int32{9, 10, 11, 12, 13, bad, 15, 16})
				_, err := p.ResolveIn(0, []int{1, 2}, []int64{40, 40}, kernels.Span{Buf: sel}, kernels.Span{Buf: out})
				if !errors.Is(err, ErrBadPosition) || !bytes.Contains([]byte(err.Error()), []byte("request 2: selection 1")) {
					t.Fatalf("position %d: %v", bad, err)
				}
				if after := engineTables(t, p, 1, 2); !slices.Equal(after, before) {
					t.Fatalf("position %d: a refused step changed the tables", bad)
				}
			}
			if _, err := ep.ref.ResolveIn(0, []int{1}, []int64{40}, kernels.Span{Buf: sel}, kernels.Span{Buf: out}); !errors.Is(err, ErrBadConfig) {
				t.Errorf("host-planned pool took engine selections: %v", err)
			}
		})
	}
}

func mustAlloc(t testing.TB, e kernels.Engine, n int64) kernels.Buffer {
	b, err := e.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Free() })
	return b
}

func engineTables(t testing.TB, p *Pool, reqs ...int) []int32 {
	var all []int32
	for _, r := range reqs {
		tok, lru, loaded, err := p.tables(r, 0)
		if err != nil {
			t.Fatal(err)
		}
		all = append(append(append(all, tok...), lru...), loaded...)
	}
	return all
}

// TestEnginePlanAcrossWarps: slots and selections spread over several
// warps of a planning block, so that the thread that gives a miss its
// slot (by the slot's place in the LRU order) and the thread that writes
// the miss's output (by its place in the selection) are in different
// warps. The kernel once had no barrier between the two: under shuffled
// schedules a miss came back as slot 65535.
func TestEnginePlanAcrossWarps(t *testing.T) {
	for _, pe := range planEngines {
		t.Run(pe.name, func(t *testing.T) {
			const slots, k = 96, 64
			ep := newEnginePair(t, pe.make, Config{Layers: 1, EntryBytes: 32, Slots: slots, TopK: k, MaxRequests: 2})
			rng := rand.New(rand.NewPCG(11, 12))
			reqs, lens := []int{0, 1}, []int64{300, 500}
			for b, req := range reqs {
				ep.add(t, req, lens[b]+200)
			}
			prev := make([][]int32, len(reqs))
			for range 60 {
				sel := make([]int32, 0, len(reqs)*k)
				for b := range reqs {
					lens[b]++
					prev[b] = randomSelection(rng, prev[b], lens[b], k, 0.6)
					sel = append(sel, prev[b]...)
				}
				ep.step(t, 0, reqs, lens, sel)
			}
		})
	}
}
