package topk

import (
	"errors"
	"testing"
	"time"

	"github.com/cxltier/cxltier/tier/link"
)

// A pool with a link claims each Resolve's deadline on the node's link
// table until its entries are in, and says which steps missed it: what
// the bulk movers of other processes wait on and what /metrics shows. A
// step refused for bad input claims nothing.
func TestResolveClaimsTheLink(t *testing.T) {
	r, c := testTier(t, 1)
	lk, err := link.Open(c, link.Config{Name: "topk"})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	if _, err := New(c, nil, nil, Config{Layers: 1, EntryBytes: 64, Slots: 32, TopK: 4, MaxRequests: 1, Deadline: -time.Second}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("a negative deadline: %v, want ErrBadConfig", err)
	}
	for _, tc := range []struct {
		deadline time.Duration
		missed   uint64
	}{{time.Hour, 0}, {time.Nanosecond, 3}} {
		p, _ := testPool(t, c, Config{Layers: 2, EntryBytes: 64, Slots: 32, TopK: 4, MaxRequests: 2, Link: lk, Deadline: tc.deadline})
		if err := p.Register(0, Sequence{Layers: 2, EntryBytes: 64, Capacity: 64}); err != nil {
			t.Fatal(err)
		}
		appendTokens(t, p, 0, 0, 64)
		before, _ := link.ReadStats(r, "topk")
		out := make([]int32, 4)
		for k := range 3 {
			sel := []int32{int32(k), int32(10 + k), int32(20 + k), -1}
			if _, err := p.Resolve(k%2, []int{0}, []int64{64}, sel, out); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := p.Resolve(0, []int{1}, []int64{64}, []int32{1, 2, 3, 4}, out); !errors.Is(err, ErrUnknown) {
			t.Fatalf("an unknown request: %v", err)
		}
		st, err := link.ReadStats(r, "topk")
		if err != nil {
			t.Fatal(err)
		}
		if st.Claims-before.Claims != 3 || st.Misses-before.Misses != tc.missed {
			t.Fatalf("deadline %v: %d claims, %d missed; want 3 and %d", tc.deadline, st.Claims-before.Claims, st.Misses-before.Misses, tc.missed)
		}
	}
}
