package prefix

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cxltier/cxltier/tier"
)

// TestConcurrentPins: goroutines of one process look up, read and release
// while another inserts and so evicts. Pins are claimed with no lock, so
// the test is about races (run with -race): every read payload must be the
// key's own, and when all is done no pin is held and the index checks.
func TestConcurrentPins(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 64, 256)
	keys := keysN(256)
	if _, err := s.Set(keys[:64], payloadsFor(keys[:64], 256)); err != nil {
		t.Fatal(err)
	}
	var stop atomic.Bool
	var served atomic.Int64
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			dst := make([][]byte, 8)
			for i := range dst {
				dst[i] = make([]byte, 256)
			}
			for !stop.Load() {
				at := rng.IntN(len(keys) - 8)
				n, err := s.Get(keys[at:at+8], dst)
				if err != nil {
					t.Errorf("get: %v", err)
					return
				}
				for i := range n {
					if !bytes.Equal(dst[i], payloadFor(keys[at+i], 256)) {
						t.Errorf("key %d: a payload not its own", at+i)
						return
					}
				}
				served.Add(int64(n))
			}
		}()
	}
	rng := rand.New(rand.NewPCG(9, 9))
	for range 2000 {
		at := rng.IntN(len(keys) - 4)
		if _, err := s.Set(keys[at:at+4], payloadsFor(keys[at:at+4], 256)); err != nil && !errors.Is(err, ErrNoSpace) {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if st := s.Stats(); st.PinsHeld != 0 || st.Evictions == 0 || served.Load() == 0 {
		t.Fatalf("after the run: %d pins held, %d evictions, %d payloads served", st.PinsHeld, st.Evictions, served.Load())
	}
	mustCheck(t, s)
}

// TestPinTableFull: a client holds at most PinsPerClient pins; the next
// lookup fails with ErrPinsFull, and a release makes room again.
func TestPinTableFull(t *testing.T) {
	_, c := testTier(t, 1)
	s, err := Create(c, Config{Name: "m", Blocks: 16, BlockBytes: 64, PinsPerClient: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	keys := keysN(9)
	if _, err := s.Set(keys, payloadsFor(keys, 64)); err != nil {
		t.Fatal(err)
	}
	held, err := s.Lookup(keys[:8])
	if err != nil || len(held) != 8 {
		t.Fatalf("lookup of 8: %d hits, %v", len(held), err)
	}
	if _, err := s.Lookup(keys[8:]); !errors.Is(err, ErrPinsFull) {
		t.Fatalf("ninth pin: %v, want ErrPinsFull", err)
	}
	s.Release(held[3:4])
	if h, err := s.Lookup(keys[8:]); err != nil || len(h) != 1 {
		t.Fatalf("after a release: %d hits, %v", len(h), err)
	} else {
		s.Release(h)
	}
	s.Release(held[:3])
	s.Release(held[4:])
	if hw := s.pinHighWater(); hw != 8 {
		t.Errorf("high-water mark %d, want 8", hw)
	}
	if st := s.Stats(); st.PinsHeld != 0 {
		t.Errorf("%d pins held after every release", st.PinsHeld)
	}
	s.Close()
	if _, err := s.Lookup(keys[:1]); !errors.Is(err, tier.ErrClosed) {
		t.Errorf("lookup after close: %v", err)
	}
}

// TestClaimBelowTheHint: a record freed below the hint is found once the
// table is used to its end (the hint may have moved past it: claims look
// below it only then), and a full table still says so.
func TestClaimBelowTheHint(t *testing.T) {
	_, c := testTier(t, 1)
	s, err := Create(c, Config{Name: "m", Blocks: 16, BlockBytes: 64, PinsPerClient: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for j := int32(0); j < 8; j++ {
		if got, err := s.claimPin(uint64(j+1) << 32); err != nil || got != j {
			t.Fatalf("claim %d: record %d, %v", j, got, err)
		}
	}
	s.unpin(5)
	s.pinHint.Store(7) // a racing claim moved it past the free record
	if got, err := s.claimPin(9 << 32); err != nil || got != 5 {
		t.Fatalf("claim with a free record below the hint: record %d, %v", got, err)
	}
	if _, err := s.claimPin(10 << 32); !errors.Is(err, ErrPinsFull) {
		t.Fatalf("claim in a full table: %v", err)
	}
}

// TestCountersPerClient: a version-3 index counts lookups and inserts in
// each client's pin table; Stats sums them with the header's, and the
// counts outlive a client. A version-2 index keeps counting in its header.
func TestCountersPerClient(t *testing.T) {
	r, c := testTier(t, 1)
	a := testStore(t, c, 16, 64)
	other, err := r.Attach(tier.ClientOptions{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := Open(other, "m")
	if err != nil {
		t.Fatal(err)
	}
	keys := []Key{keyN(1), keyN(2), keyN(3)}
	if _, err := a.Set(keys[:2], payloadsFor(keys[:2], 64)); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Store{a, b, b} {
		hits, err := s.Lookup(keys) // two hits, one miss
		if err != nil {
			t.Fatal(err)
		}
		s.Release(hits)
	}
	want := func(s *Store, hits, misses, inserts uint64) {
		t.Helper()
		if st := s.Stats(); st.Hits != hits || st.Misses != misses || st.Inserts != inserts || st.BytesIn != 64*inserts {
			t.Errorf("stats %+v, want %d hits, %d misses, %d inserts", st, hits, misses, inserts)
		}
	}
	want(a, 6, 3, 2)
	want(b, 6, 3, 2)
	if got := atomic.LoadUint64(u64At(a.hdr, hdrCounters+8*ctrHits)); got != 0 {
		t.Errorf("the index header counted %d hits of a version-3 index", got)
	}
	b.Close()
	other.Close()
	want(a, 6, 3, 2)

	// A version 2 index keeps counting in its header.
	v2, err := create(c, Config{Name: "v2", Blocks: 16, BlockBytes: 64, PinsPerClient: 256}, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer v2.Close()
	if _, err := v2.Set(keys[:1], payloadsFor(keys[:1], 64)); err != nil {
		t.Fatal(err)
	}
	hits, _ := v2.Lookup(keys[:1])
	v2.Release(hits)
	if got := atomic.LoadUint64(u64At(v2.hdr, hdrCounters+8*ctrHits)); got != 1 {
		t.Errorf("version 2: the header counted %d hits, want 1", got)
	}
	if st := v2.Stats(); st.Hits != 1 || st.Inserts != 1 || st.Shards != 1 {
		t.Errorf("version 2: stats %+v, want 1 hit, 1 insert, 1 shard", st)
	}
}

// TestLookupAllocatesNothing: a server's lookup, reusing its hits slice,
// and the release after it allocate nothing, hit or miss, one key or many.
func TestLookupAllocatesNothing(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 64, 64)
	keys := keysN(40)
	if _, err := s.Set(keys[:32], payloadsFor(keys[:32], 64)); err != nil {
		t.Fatal(err)
	}
	hits := make([]Hit, 0, len(keys))
	for _, batch := range [][]Key{keys[:1], keys[:32], keys} {
		allocs := testing.AllocsPerRun(100, func() {
			var err error
			if hits, err = s.LookupAppend(hits[:0], batch); err != nil || len(hits) != min(len(batch), 32) {
				t.Fatalf("lookup: %d hits, %v", len(hits), err)
			}
			s.Release(hits)
		})
		if allocs != 0 {
			t.Errorf("lookup of %d keys: %.1f allocations per call", len(batch), allocs)
		}
	}
}

// TestExistsAllocatesNothing: the bare probe of a batch done in one run
// allocates nothing (HiCache asks it for every request).
func TestExistsAllocatesNothing(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 64, 64)
	keys := []Key{keyN(1), keyN(2)}
	if _, err := s.Set(keys, payloadsFor(keys, 64)); err != nil {
		t.Fatal(err)
	}
	for _, batch := range [][]Key{keys[:1], keys} {
		if allocs := testing.AllocsPerRun(100, func() { s.Exists(batch) }); allocs != 0 {
			t.Errorf("exists of %d keys: %.1f allocations per call", len(batch), allocs)
		}
	}
}
