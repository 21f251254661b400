package topk

import (
	"testing"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// TestSharedStats: two clients' pools publish into the shared table, the
// sums (what the daemon exports) cover both, a closed pool leaves them, and
// a second pool of one client is not counted twice.
func TestSharedStats(t *testing.T) {
	r, c := testTier(t, 1)
	if st, err := ReadStats(r); err != nil || st != (Stats{}) {
		t.Fatalf("no table yet: %+v %v", st, err)
	}
	other, err := tier.Open(tier.Options{Devices: devicesOf(t, r)})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	c2, err := other.Attach(tier.ClientOptions{Name: "second"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	cfg := Config{Layers: 1, EntryBytes: 64, Slots: 4, TopK: 2, MaxRequests: 1}
	p1, _ := testPool(t, c, cfg)
	eng := kernels.NewCPU(1)
	defer eng.Close()
	p2, err := New(c2, eng, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*Pool{p1, p2} {
		p.Register(0, Sequence{Layers: 1, EntryBytes: 64, Capacity: 16})
		appendTokens(t, p, 0, 0, 16)
		if _, err := p.Resolve(0, []int{0}, []int64{16}, []int32{3, 9}, make([]int32, 2)); err != nil {
			t.Fatal(err)
		}
	}
	st, err := ReadStats(r)
	if err != nil || st.Steps != 2 || st.Hits != 2 || st.Misses != 2 || st.Fills != 2 || st.Sequences != 2 || st.BytesFetched != p1.Stats().BytesFetched*2 {
		t.Fatalf("sum of two pools: %+v %v", st, err)
	}
	dup, err := New(c2, eng, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	dup.Register(0, Sequence{Layers: 1, EntryBytes: 64, Capacity: 16})
	if st, _ := ReadStats(r); st.Sequences != 2 {
		t.Errorf("a second pool of one client counted: %+v", st)
	}
	dup.Close()
	if err := p2.Close(); err != nil {
		t.Fatal(err)
	}
	if st, _ := ReadStats(r); st.Steps != 1 || st.Sequences != 1 {
		t.Errorf("after one pool closed: %+v", st)
	}
}

func devicesOf(t *testing.T, r *tier.Region) []tier.Backing {
	var out []tier.Backing
	for _, d := range r.Info().Devices {
		b, err := tier.ParseBacking(d)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}
