package topk

import (
	"encoding/binary"
	"slices"
	"testing"

	"github.com/cxltier/cxltier/kernels"
)

// FuzzResolve feeds arbitrary steps (lengths and positions, as they arrive
// from the SGLang side) to a pool: each is refused or served, never a
// panic, and a served step leaves every selection's bytes in its slot.
func FuzzResolve(f *testing.F) {
	f.Add(int64(40), []byte{1, 0, 0, 0, 2, 0, 0, 0, 39, 0, 0, 0, 255, 255, 255, 255})
	f.Add(int64(5), []byte{4, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0})
	f.Add(int64(0), []byte{})
	_, c := testTier(f, 1)
	p, eng := testPool(f, c, Config{Layers: 1, EntryBytes: 32, Slots: 6, TopK: 4, MaxRequests: 1})
	if err := p.Register(0, Sequence{Layers: 1, EntryBytes: 32, Capacity: 64}); err != nil {
		f.Fatal(err)
	}
	appendTokens(f, p, 0, 0, 64)
	f.Fuzz(func(t *testing.T, seqLen int64, raw []byte) {
		sel := make([]int32, 0, 4)
		for i := 0; i+4 <= len(raw) && len(sel) < 4; i += 4 {
			sel = append(sel, int32(binary.LittleEndian.Uint32(raw[i:])))
		}
		out := make([]int32, len(sel))
		if _, err := p.Resolve(0, []int{0}, []int64{seqLen}, sel, out); err != nil {
			return
		}
		checkSlots(t, p, eng, 0, []int{0}, sel, out)
	})
}

// FuzzEnginePlan feeds arbitrary steps to an engine-planned pool through
// ResolveIn (selections in engine memory, checked by the engine alone) and
// to a host-planned one: both refuse the same steps, and served steps give
// the same slots, tables and bytes.
func FuzzEnginePlan(f *testing.F) {
	f.Add(int64(40), []byte{1, 0, 0, 0, 2, 0, 0, 0, 39, 0, 0, 0, 255, 255, 255, 255})
	f.Add(int64(5), []byte{4, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0})
	f.Add(int64(64), []byte{63, 0, 0, 0, 7, 0, 0, 0, 7, 0, 0, 0, 254, 255, 255, 255})
	ep := newEnginePair(f, planEngines[0].make, Config{Layers: 1, EntryBytes: 32, Slots: 6, TopK: 4, MaxRequests: 1})
	ep.add(f, 0, 64)
	selBuf, outBuf := mustAlloc(f, ep.e, 16), mustAlloc(f, ep.e, 16)
	f.Fuzz(func(t *testing.T, seqLen int64, raw []byte) {
		sel := make([]int32, 4)
		for i := range sel {
			if 4*i+4 <= len(raw) {
				sel[i] = int32(binary.LittleEndian.Uint32(raw[4*i:]))
			} else {
				sel[i] = -1
			}
		}
		want, got := make([]int32, 4), make([]int32, 4)
		_, werr := ep.ref.Resolve(0, []int{0}, []int64{seqLen}, sel, want)
		if err := ep.e.Upload(selBuf, 0, kernels.AsBytes(sel)); err != nil {
			t.Fatal(err)
		}
		_, gerr := ep.eng.ResolveIn(0, []int{0}, []int64{seqLen}, kernels.Span{Buf: selBuf}, kernels.Span{Buf: outBuf})
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("len %d sel %v: host planner %v, engine %v", seqLen, sel, werr, gerr)
		}
		if werr != nil {
			return
		}
		if err := ep.e.Download(kernels.AsBytes(got), outBuf, 0); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("len %d sel %v: engine slots %v, host %v", seqLen, sel, got, want)
		}
		wt, wl, wd, _ := ep.ref.tables(0, 0)
		gt, gl, gd, _ := ep.eng.tables(0, 0)
		if !slices.Equal(gt, wt) || !slices.Equal(gl, wl) || !slices.Equal(gd, wd) {
			t.Fatalf("len %d sel %v: tables differ", seqLen, sel)
		}
		ep.checkBytes(t, 0, []int{0}, sel, got)
	})
}
