package engram

import (
	"math/rand/v2"
	"testing"
)

// simulated is a hotSet with the memory it manages: content[slot] is the
// row a slot's bytes are, updated only by fetches.
type simulated struct {
	h       *hotSet
	content []int64
}

// call looks up rows as one call, fetching what it is told to. It returns
// the slot of each row, or ok=false when the call did not fit; a failed
// call drops its fetches as Prefetch does.
func (s *simulated) call(t *testing.T, rows []int64) ([]int32, bool) {
	t.Helper()
	s.h.begin()
	slots := make([]int32, len(rows))
	var fetched []int32
	for i, r := range rows {
		slot, fetch, ok := s.h.lookup(r)
		if !ok {
			s.h.abort(fetched)
			for _, f := range fetched {
				s.content[f] = -2 // whatever a failed fetch left
			}
			return nil, false
		}
		if fetch {
			fetched = append(fetched, slot)
			s.content[slot] = r
		} else if s.content[slot] != r {
			t.Fatalf("row %d: a hit in slot %d, which holds row %d", r, slot, s.content[slot])
		}
		slots[i] = slot
	}
	return slots, true
}

// TestHotSetKeepsRecentCallsIntact: over random calls with skewed rows,
// every hit's slot holds its row, and the rows of the last `protect` calls
// stay in their slots (the model may still be reading them), whatever the
// later calls evict, including after calls that do not fit.
func TestHotSetKeepsRecentCallsIntact(t *testing.T) {
	for _, tc := range []struct {
		slots, protect, rowsPerCall int
		universe                    uint64
	}{
		{slots: 1024, protect: 2, rowsPerCall: 200, universe: 5000},
		{slots: 64, protect: 2, rowsPerCall: 20, universe: 100},
		{slots: 10, protect: 3, rowsPerCall: 4, universe: 30},
		{slots: 4096, protect: 1, rowsPerCall: 1500, universe: 1 << 40},
		{slots: 72, protect: 2, rowsPerCall: 30, universe: 1 << 30}, // 32 ways, 40 spill slots: spills every call
	} {
		h, err := newHotSet(tc.slots, uint64(tc.protect))
		if err != nil {
			t.Fatal(err)
		}
		if h.slots() != tc.slots {
			t.Fatalf("%d slots laid out as %d", tc.slots, h.slots())
		}
		s := &simulated{h: h, content: make([]int64, tc.slots)}
		rng := rand.New(rand.NewPCG(uint64(tc.slots), 1))
		zipf := rand.NewZipf(rng, 1.2, 1, tc.universe)
		type placed struct {
			rows  []int64
			slots []int32
		}
		var recent []placed
		hits, failed := 0, 0
		for range 3000 {
			rows := make([]int64, 1+rng.IntN(tc.rowsPerCall))
			for i := range rows {
				rows[i] = int64(zipf.Uint64())
			}
			slots, ok := s.call(t, rows)
			if !ok {
				failed++
				continue
			}
			recent = append(recent, placed{rows, slots})
			if len(recent) > tc.protect {
				recent = recent[1:]
			}
			for _, c := range recent {
				for i, r := range c.rows {
					if s.content[c.slots[i]] != r {
						t.Fatalf("%d slots: row %d of a recent call was overwritten in slot %d", tc.slots, r, c.slots[i])
					}
				}
			}
			for i, r := range rows {
				for j := range i {
					if rows[j] == r && slots[j] != slots[i] && int(slots[i]) < len(h.tags) {
						t.Fatalf("row %d cached twice in one call: slots %d and %d", r, slots[j], slots[i])
					}
				}
			}
			hits++
		}
		if hits == 0 {
			t.Fatalf("%d slots: no call fitted", tc.slots)
		}
		t.Logf("%d slots: %d calls fitted, %d did not", tc.slots, hits, failed)
	}
}

func TestHotSetRefusesWhatDoesNotFit(t *testing.T) {
	h, _ := newHotSet(10, 2)
	h.begin()
	n := 0
	for r := range int64(100) {
		if _, _, ok := h.lookup(r); !ok {
			break
		}
		n++
	}
	if n > 10 {
		t.Fatalf("%d rows placed in 10 slots", n)
	}
	if _, err := newHotSet(0, 2); err == nil {
		t.Fatal("a cache of 0 slots was made")
	}
}

// BenchmarkHotSetAssign is the host-side bookkeeping of one batch-256 V4.1
// decode step (6,144 rows drawn from 4.8 M) against a 2^17-slot cache: the
// part of a cached prefetch that runs on the CPU before any copy. Between
// calls (untimed) it streams 64 MiB, as the gathers and the model do, so
// that the cache's tables start cold as they do in service: alone in a
// loop they would sit in the CPU's last-level cache.
func BenchmarkHotSetAssign(b *testing.B) {
	flush := make([]byte, 64<<20)
	hl, err := newHostLayer(1<<17, 2)
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(5, 5))
	zipf := rand.NewZipf(rng, 1.1, 1, 4_800_000)
	calls := make([][]int64, 64)
	for c := range calls {
		calls[c] = make([]int64, 6144)
		for i := range calls[c] {
			calls[c][i] = int64(zipf.Uint64())
		}
	}
	i := 0
	for b.Loop() {
		b.StopTimer()
		for j := 0; j < len(flush); j += 64 {
			flush[j]++
		}
		b.StartTimer()
		if _, _, err := hl.assign(calls[i%len(calls)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/6144, "ns/row")
}
