package topk

import (
	"errors"
	"testing"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// TestPoolAfterRegionClose: a pool used after its Region closed (a
// deferred Close in the wrong order) reports ErrClosed instead of
// faulting on the unmapped extents and stats record.
func TestPoolAfterRegionClose(t *testing.T) {
	r, c := testTier(t, 1)
	eng := kernels.NewCPU(1)
	defer eng.Close()
	p, err := New(c, eng, nil, Config{Layers: 2, EntryBytes: 64, Slots: 16, TopK: 4, MaxRequests: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Register(0, Sequence{Layers: 2, EntryBytes: 64, Capacity: 64}); err != nil {
		t.Fatal(err)
	}
	appendTokens(t, p, 0, 0, 8)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	out := make([]int32, 4)
	_, resolveErr := p.Resolve(0, []int{0}, []int64{8}, []int32{0, 1, 2, 3}, out)
	for name, err := range map[string]error{
		"append":   p.Append(0, 0, make([]byte, 64)),
		"resolve":  resolveErr,
		"register": p.Register(1, Sequence{Layers: 2, EntryBytes: 64, Capacity: 8}),
		"free":     p.Free(0),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after the region closed: %v", name, err)
		}
	}
	if err := p.Close(); err != nil && !errors.Is(err, tier.ErrClosed) {
		t.Errorf("close after the region closed: %v", err)
	}
}
