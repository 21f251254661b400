//go:build cuda

package kernels

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"gorgonia.org/cu"
)

// TestTopKStepBreakdown times the parts of one engine-planned step on the
// GPU with CUDA events — the check kernel, the plan kernel, and the whole
// call on the host — for batches of 1 and 16 (DSA: k 2048, 4096 slots,
// 656-byte entries, 64K context, 10% of the selections new each step). It
// asserts nothing about speed; it reports where the time goes (go test -v).
func TestTopKStepBreakdown(t *testing.T) {
	c := newTestCUDA(t)
	defer c.Close()
	threads := c.topk.threads
	defer func() { c.topk.threads = threads }()
	for _, th := range []int{256, 512, 1024} {
		if th > threads {
			continue
		}
		c.topk.threads = th
		for _, batch := range []int{1, 16} {
			for _, newFrac := range []float64{0.1, 0} {
				t.Run(fmt.Sprintf("threads=%d/batch=%d/new=%.1f", th, batch, newFrac), func(t *testing.T) { stepBreakdown(t, c, batch, newFrac) })
			}
		}
	}
}

// TestTopKBadSelection: a bad selection in the last request, found by the
// plan blocks themselves (small batches) or by the check kernel, is
// reported with its place and leaves the tables and outputs untouched.
func TestTopKBadSelection(t *testing.T) {
	c := newTestCUDA(t)
	defer c.Close()
	l := TopKLayout{Slots: 8, TopK: 4, Layers: 1, MaxExtents: 1, ExtentEntries: 64, EntryBytes: 16}
	mem := make([]byte, 3*64*16)
	id, err := c.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Unregister(id)
	state, _ := c.Alloc(3 * l.RegionBytes())
	data, _ := c.Alloc(3 * 9 * 16)
	sel, _ := c.Alloc(3 * 4 * 4)
	out, _ := c.Alloc(3 * 4 * 4)
	for _, b := range []Buffer{state, data, sel, out} {
		defer b.Free()
	}
	for r := range 3 {
		if err := c.Upload(state, int64(r)*l.RegionBytes(), l.InitialRegion([]Addr{At(id, int64(r)*64*16)})); err != nil {
			t.Fatal(err)
		}
	}
	v := []int32{0, 1, 2, 63, 5, 6, -1, 63, 9, 10, 11, 40}
	if err := c.Upload(sel, 0, AsBytes(v)); err != nil {
		t.Fatal(err)
	}
	s := TopKStep{Layout: l, State: state, Data: data, Reqs: []int32{0, 1, 2}, Lens: []int32{64, 64, 40}, Sel: Span{Buf: sel}, Out: Span{Buf: out}}
	before := make([]byte, state.Len())
	c.Download(before, state, 0)
	for _, checkAll := range []int{1 << 16, 0} {
		c.topk.checkAllMax = checkAll
		_, err := c.PlanTopK(s)
		var bad *BadSelection
		if !errors.As(err, &bad) || bad.Row != 2 || bad.Index != 3 || bad.Pos != 40 || bad.Len != 40 {
			t.Fatalf("check-all limit %d: %v", checkAll, err)
		}
		after := make([]byte, state.Len())
		c.Download(after, state, 0)
		if !slices.Equal(after, before) {
			t.Fatalf("check-all limit %d: a refused step changed the tables", checkAll)
		}
	}
	// Across the epoch counter's wrap, an old verdict must not reject a
	// good step, and a new one must still reject a bad step.
	c.topk.epoch = 1<<24 - 2
	for range 3 {
		var bad *BadSelection
		if _, err := c.PlanTopK(s); !errors.As(err, &bad) {
			t.Fatalf("epoch %d: %v", c.topk.epoch, err)
		}
	}
	s.Lens[2] = 41
	if _, err := c.PlanTopK(s); err != nil {
		t.Fatalf("the same step with a longer sequence: %v", err)
	}
}

func stepBreakdown(t *testing.T, e *CUDA, batch int, newFrac float64) {
	const ctx, slots, k, entry = 65536, 4096, 2048, 656
	l := TopKLayout{Slots: slots, TopK: k, Layers: 1, MaxExtents: 1, ExtentEntries: ctx + 1000, EntryBytes: entry}
	tierBytes := int64(batch) * l.ExtentEntries * entry
	mem := make([]byte, tierBytes)
	id, err := e.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Unregister(id)
	state, _ := e.Alloc(int64(batch) * l.RegionBytes())
	data, _ := e.Alloc(int64(batch) * (slots + 1) * entry)
	sel, _ := e.Alloc(int64(batch) * k * 4)
	out, _ := e.Alloc(int64(batch) * k * 4)
	for _, b := range []Buffer{state, data, sel, out} {
		defer b.Free()
	}
	reqs, lens := make([]int32, batch), make([]int32, batch)
	for b := range batch {
		reqs[b], lens[b] = int32(b), ctx
		reg := l.InitialRegion([]Addr{At(id, int64(b)*l.ExtentEntries*entry)})
		if err := e.Upload(state, int64(b)*l.RegionBytes(), reg); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, uint64(batch)))
	prev := make([][]int32, batch)
	step := func() []int32 {
		var all []int32
		for b := range batch {
			next := []int32{ctx - 1}
			seen := map[int32]bool{ctx - 1: true}
			keep := int(float64(k) * (1 - newFrac))
			for _, p := range prev[b] {
				if len(next) < keep && !seen[p] {
					next, seen[p] = append(next, p), true
				}
			}
			for len(next) < k {
				if p := int32(rng.IntN(ctx - 1)); !seen[p] {
					next, seen[p] = append(next, p), true
				}
			}
			prev[b] = next
			all = append(all, next...)
		}
		return all
	}
	s := TopKStep{Layout: l, State: state, Data: data, Reqs: reqs, Lens: lens, Sel: Span{Buf: sel}, Out: Span{Buf: out}}
	var host, checkMs, planMs []float64
	evs := make([]cu.Event, 3)
	for i := range evs {
		if evs[i], err = cu.MakeEvent(cu.DefaultEvent); err != nil {
			t.Fatal(err)
		}
		defer cu.DestroyEvent(&evs[i])
	}
	for i := range 60 {
		v := step()
		if err := e.Upload(sel, 0, AsBytes(v)); err != nil {
			t.Fatal(err)
		}
		e.topk.events = evs
		start := time.Now()
		if _, err := e.PlanTopK(s); err != nil {
			t.Fatal(err)
		}
		d := time.Since(start)
		e.topk.events = nil
		a, _ := evs[0].Elapsed(evs[1])
		b, _ := evs[1].Elapsed(evs[2])
		if i >= 10 {
			host, checkMs, planMs = append(host, float64(d.Microseconds())), append(checkMs, a*1e3), append(planMs, b*1e3)
		}
	}
	med := func(v []float64) float64 { slices.Sort(v); return v[len(v)/2] }
	t.Logf("p50: whole call %.0f µs, check kernel %.1f µs, plan+fetch kernel %.1f µs (GPU time by events)", med(host), med(checkMs), med(planMs))
}
