package engram

import (
	"testing"
	"time"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier/link"
)

// A prefetcher with a link claims each call's deadline on the node's link
// table until its rows are in, and tells it which calls missed: what the
// bulk movers of other processes wait on and what /metrics shows.
func TestPrefetchClaimsTheLink(t *testing.T) {
	r, c := testTier(t, 1)
	g := tinyGeometry()
	h, err := NewHasher(g)
	if err != nil {
		t.Fatal(err)
	}
	l := g.LayerIDs[0]
	tb, err := CreateTable(c, g, h, l, func(i int64, b []byte) error { SyntheticRow(l, i, b); return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	lk, err := link.Open(c, link.Config{Name: "engram"})
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	eng := kernels.NewCPU(1)
	defer eng.Close()
	for _, tc := range []struct {
		deadline time.Duration
		missed   bool
	}{{time.Hour, false}, {time.Nanosecond, true}} {
		p, err := NewPrefetcher(eng, c, h, []*Table{tb}, PrefetchOptions{Slots: 64, Deadline: tc.deadline, Link: lk})
		if err != nil {
			t.Fatal(err)
		}
		before, _ := link.ReadStats(r, "engram")
		for k := range 3 {
			pd, err := p.Prefetch(l, nil, [][]int64{{1, 2, 3}})
			if err != nil {
				t.Fatal(err)
			}
			if st, _ := link.ReadStats(r, "engram"); st.Claims != before.Claims+uint64(k) {
				t.Fatal("a call's claim ended before its Wait")
			}
			if _, err := pd.Wait(); err != nil {
				t.Fatal(err)
			}
			pd.Wait() // a second Wait ends nothing more
		}
		st, err := link.ReadStats(r, "engram")
		if err != nil {
			t.Fatal(err)
		}
		misses := map[bool]uint64{false: 0, true: 3}[tc.missed]
		if st.Claims-before.Claims != 3 || st.Misses-before.Misses != misses || p.Metrics().DeadlineMisses.Load() != misses {
			t.Fatalf("deadline %v: claims %d, misses %d (prefetcher %d), want 3 and %d", tc.deadline, st.Claims-before.Claims, st.Misses-before.Misses, p.Metrics().DeadlineMisses.Load(), misses)
		}
		p.Close()
	}
}
