//go:build cuda

package topk

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/kernels"
)

// newTestStepper starts a CUDA engine (or skips) and its top-k stepper.
func newTestStepper(t *testing.T) (kernels.Launcher, *kernelStepper) {
	e := tiertest.CUDA(t).(kernels.Launcher)
	t.Cleanup(func() { e.Close() })
	st := &kernelStepper{e: e}
	if err := st.load(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.close() })
	return e, st
}

// TestKernelStepTimes times one engine-planned step on the GPU for batches
// of 1 and 16 and plan blocks of 256 to 1024 threads (DSA: k 2048, 4096
// slots, 656-byte entries, 64K context, 10% of the selections new each
// step, or none). It asserts nothing about speed; it reports the median
// whole call (go test -v). bench/topk measures against the bandwidth bound.
func TestKernelStepTimes(t *testing.T) {
	e, st := newTestStepper(t)
	most := st.threads
	for _, th := range []int{256, 512, 1024} {
		if th > most {
			continue
		}
		st.threads = th
		for _, batch := range []int{1, 16} {
			for _, newFrac := range []float64{0.1, 0} {
				t.Run(fmt.Sprintf("threads=%d/batch=%d/new=%.1f", th, batch, newFrac), func(t *testing.T) { stepTimes(t, e, st, batch, newFrac) })
			}
		}
	}
}

// TestKernelBadSelection: a bad selection in the last request, found by the
// plan blocks themselves (small batches) or by the check kernel, is
// reported with its place and leaves the tables and outputs untouched.
func TestKernelBadSelection(t *testing.T) {
	c, st := newTestStepper(t)
	l := engineLayout{Slots: 8, TopK: 4, Layers: 1, MaxExtents: 1, ExtentEntries: 64, EntryBytes: 16}
	mem := make([]byte, 3*64*16)
	id, err := c.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Unregister(id)
	state, _ := c.Alloc(3 * l.regionBytes())
	data, _ := c.Alloc(3 * 9 * 16)
	sel, _ := c.Alloc(3 * 4 * 4)
	out, _ := c.Alloc(3 * 4 * 4)
	for _, b := range []kernels.Buffer{state, data, sel, out} {
		defer b.Free()
	}
	for r := range 3 {
		if err := c.Upload(state, int64(r)*l.regionBytes(), l.initialRegion([]kernels.Addr{kernels.At(id, int64(r)*64*16)})); err != nil {
			t.Fatal(err)
		}
	}
	v := []int32{0, 1, 2, 63, 5, 6, -1, 63, 9, 10, 11, 40}
	if err := c.Upload(sel, 0, kernels.AsBytes(v)); err != nil {
		t.Fatal(err)
	}
	s := &engineStep{layout: l, state: state, data: data, reqs: []int32{0, 1, 2}, lens: []int32{64, 64, 40},
		sel: kernels.Span{Buf: sel}, out: kernels.Span{Buf: out}}
	before := make([]byte, state.Len())
	c.Download(before, state, 0)
	for _, checkAll := range []int{1 << 16, 0} {
		st.checkAllMax = checkAll
		_, err := st.plan(s)
		var bad *badSelection
		if !errors.As(err, &bad) || bad.row != 2 || bad.index != 3 || bad.pos != 40 || bad.len != 40 {
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
	st.epoch = 1<<24 - 2
	for range 3 {
		var bad *badSelection
		if _, err := st.plan(s); !errors.As(err, &bad) {
			t.Fatalf("epoch %d: %v", st.epoch, err)
		}
	}
	s.lens[2] = 41
	if _, err := st.plan(s); err != nil {
		t.Fatalf("the same step with a longer sequence: %v", err)
	}
}

func stepTimes(t *testing.T, e kernels.Launcher, st *kernelStepper, batch int, newFrac float64) {
	const ctx, slots, k, entry = 65536, 4096, 2048, 656
	l := engineLayout{Slots: slots, TopK: k, Layers: 1, MaxExtents: 1, ExtentEntries: ctx + 1000, EntryBytes: entry}
	tierBytes := int64(batch) * l.ExtentEntries * entry
	mem := make([]byte, tierBytes)
	id, err := e.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Unregister(id)
	state, _ := e.Alloc(int64(batch) * l.regionBytes())
	data, _ := e.Alloc(int64(batch) * (slots + 1) * entry)
	sel, _ := e.Alloc(int64(batch) * k * 4)
	out, _ := e.Alloc(int64(batch) * k * 4)
	for _, b := range []kernels.Buffer{state, data, sel, out} {
		defer b.Free()
	}
	reqs, lens := make([]int32, batch), make([]int32, batch)
	for b := range batch {
		reqs[b], lens[b] = int32(b), ctx
		reg := l.initialRegion([]kernels.Addr{kernels.At(id, int64(b)*l.ExtentEntries*entry)})
		if err := e.Upload(state, int64(b)*l.regionBytes(), reg); err != nil {
			t.Fatal(err)
		}
	}
	rng := rand.New(rand.NewPCG(1, uint64(batch)))
	prev := make([][]int32, batch)
	next := func() []int32 {
		var all []int32
		for b := range batch {
			sel := []int32{ctx - 1}
			seen := map[int32]bool{ctx - 1: true}
			keep := int(float64(k) * (1 - newFrac))
			for _, p := range prev[b] {
				if len(sel) < keep && !seen[p] {
					sel, seen[p] = append(sel, p), true
				}
			}
			for len(sel) < k {
				if p := int32(rng.IntN(ctx - 1)); !seen[p] {
					sel, seen[p] = append(sel, p), true
				}
			}
			prev[b] = sel
			all = append(all, sel...)
		}
		return all
	}
	s := &engineStep{layout: l, state: state, data: data, reqs: reqs, lens: lens, sel: kernels.Span{Buf: sel}, out: kernels.Span{Buf: out}}
	var host []float64
	for i := range 60 {
		if err := e.Upload(sel, 0, kernels.AsBytes(next())); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if _, err := st.plan(s); err != nil {
			t.Fatal(err)
		}
		if i >= 10 {
			host = append(host, float64(time.Since(start).Microseconds()))
		}
	}
	slices.Sort(host)
	t.Logf("p50 whole call %.0f µs", host[len(host)/2])
}
