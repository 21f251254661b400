package topk

import (
	"encoding/binary"
	"testing"
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
