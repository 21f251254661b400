package prefix

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/tier"
)

func benchKeys(n int) []Key {
	keys := make([]Key, n)
	for i := range keys {
		binary.LittleEndian.PutUint64(keys[i][:], uint64(i)*0x9e3779b97f4a7c15)
		keys[i][8] = 1
	}
	return keys
}

// filledStore is an index holding n keys (benchKeys) of size-byte
// payloads, with twice as many blocks, so that no shard evicts any.
func filledStore(tb testing.TB, c *tier.Client, n int, size int64) (*Store, []Key) {
	tb.Helper()
	s := testStore(tb, c, 2*int64(n), size)
	keys := benchKeys(n)
	ps := make([][]byte, 1024)
	for i := range ps {
		ps[i] = make([]byte, size)
	}
	for i := 0; i < n; i += len(ps) {
		m := min(len(ps), n-i)
		if st, err := s.Set(keys[i:i+m], ps[:m]); err != nil || st[m-1] != Reserved {
			tb.Fatalf("fill: %v", err)
		}
	}
	return s, keys
}

// BenchmarkLookup is one pinned lookup and its release per op, on a full
// index (the lock-free read path), reusing the hits slice as a server
// does (LookupAppend).
func BenchmarkLookup(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run(fmt.Sprintf("batch%d", batch), func(b *testing.B) {
			_, c := testTier(b, 1)
			s, keys := filledStore(b, c, 4096, 512)
			benchLookups(b, s, keys, batch)
		})
	}
}

// BenchmarkLookupRandom draws keys at random from a larger index (8192
// ready entries, a 4 MiB table: beyond the core's own caches), as
// bench/prefix does; touchAhead is for this case.
func BenchmarkLookupRandom(b *testing.B) {
	const n = 8192
	for _, batch := range []int{1, 32} {
		b.Run(fmt.Sprintf("batch%d", batch), func(b *testing.B) {
			s, draws := randomDraws(b, n)
			benchLookups(b, s, draws, batch)
		})
	}
}

// randomDraws is an index of n ready entries of 64 bytes and 64Ki keys
// drawn from them at random.
func randomDraws(b *testing.B, n int) (*Store, []Key) {
	_, c := testTier(b, 1)
	s, keys := filledStore(b, c, n, 64)
	draws := make([]Key, 1<<16)
	rng := rand.New(rand.NewPCG(1, 1))
	for i := range draws {
		draws[i] = keys[rng.IntN(n)]
	}
	return s, draws
}

// BenchmarkLookupParts splits a pinned lookup's cost, on BenchmarkLookupRandom's
// index and draws, three ways in turn: the bare probe (Exists), the hits
// read without their pins (probeHit, what a lookup does before it pins),
// with the hold and read-ahead LookupAppend takes, and the pinned lookup
// with its release. Each reports ns/key; their
// ratios bound what any pin design can reach: pins cost the gap between
// the last two.
func BenchmarkLookupParts(b *testing.B) {
	const n = 8192
	for _, batch := range []int{1, 32} {
		s, draws := randomDraws(b, n)
		window := func(i int) []Key { at := (i * batch) % (len(draws) - batch); return draws[at : at+batch] }
		perKey := func(b *testing.B) {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/key")
		}
		hits := make([]Hit, batch)
		for range 3 { // in turn, so that a noisy moment hits each part alike
			b.Run(fmt.Sprintf("batch%d/probe", batch), func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					if got := s.Exists(window(i)); got != batch {
						b.Fatalf("probe: %d of %d", got, batch)
					}
				}
				perKey(b)
			})
			b.Run(fmt.Sprintf("batch%d/unpinned", batch), func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					keys := window(i)
					held, err := s.hold("lookup") // as LookupAppend
					if err != nil {
						b.Fatal(err)
					}
					for j := range keys {
						if j%touchAhead == 0 && batch > 1 {
							s.touchHomes(keys[j:min(j+touchAhead, batch)])
						}
						if _, ok := s.probeHit(&hits[j], &keys[j]); !ok {
							b.Fatalf("key %d: no hit", j)
						}
					}
					held.Done()
				}
				perKey(b)
			})
			b.Run(fmt.Sprintf("batch%d/pinned", batch), func(b *testing.B) {
				benchLookups(b, s, draws, batch)
				perKey(b)
			})
		}
	}
}

// benchLookups looks up windows of keys, batch at a time, and releases
// them, reporting keys per second.
func benchLookups(b *testing.B, s *Store, keys []Key, batch int) {
	var hits []Hit
	for i := 0; b.Loop(); i++ {
		at := (i * batch) % (len(keys) - batch)
		var err error
		hits, err = s.LookupAppend(hits[:0], keys[at:at+batch])
		if err != nil || len(hits) != batch {
			b.Fatalf("lookup: %d hits, %v", len(hits), err)
		}
		s.Release(hits)
	}
	b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "keys/s")
}

// BenchmarkInsert is reserve, write and publish of fresh 512-byte entries
// into a full index, so each insert also evicts one entry, one key or 32
// per call, on one shard and on eight.
func BenchmarkInsert(b *testing.B) {
	for _, shards := range []int{1, 8} {
		for _, batch := range []int{1, 32} {
			b.Run(fmt.Sprintf("shards%d/batch%d", shards, batch), func(b *testing.B) {
				_, c := testTier(b, 1)
				s := testStoreShards(b, c, 4096, 512, shards)
				payloads := make([][]byte, batch)
				for i := range payloads {
					payloads[i] = make([]byte, 512)
				}
				keys := make([]Key, batch)
				next := uint64(1)
				for b.Loop() {
					for i := range keys {
						binary.LittleEndian.PutUint64(keys[i][:], next)
						next++
					}
					if st, err := s.Set(keys, payloads); err != nil || st[0] != Reserved {
						b.Fatalf("set: %v %v", st, err)
					}
				}
				b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "keys/s")
			})
		}
	}
}

// BenchmarkInsertLarge is BenchmarkInsert on an index whose entry table
// (64 MiB: 256k blocks, 512k entries) is beyond the last-level cache, as a
// production index is: eviction's reads of entries go to memory.
func BenchmarkInsertLarge(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run(fmt.Sprintf("batch%d", batch), func(b *testing.B) {
			_, c := tiertest.FormatAnon(b, 1, 160<<20, 1<<20)
			s, err := Create(c, Config{Name: "m", Blocks: 1 << 18, BlockBytes: 64, PinsPerClient: 256})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			payloads := make([][]byte, batch)
			for i := range payloads {
				payloads[i] = make([]byte, 64)
			}
			keys := make([]Key, batch)
			next := uint64(1)
			fill := func(n int) {
				for range n / batch {
					for i := range keys {
						binary.LittleEndian.PutUint64(keys[i][:], next)
						next++
					}
					if st, err := s.Set(keys, payloads); err != nil || st[0] != Reserved {
						b.Fatalf("set: %v %v", st, err)
					}
				}
			}
			fill(1 << 18) // full: every insert below evicts
			for b.Loop() {
				fill(batch)
			}
			b.ReportMetric(float64(b.N*batch)/b.Elapsed().Seconds(), "keys/s")
		})
	}
}

// BenchmarkPartKeys is the keys of HiCache's batch_exists: 30k pages'
// hex digests, two parts each.
func BenchmarkPartKeys(b *testing.B) {
	pages := make([]string, 30000)
	for i := range pages {
		pages[i] = StringKey(strconv.Itoa(i)).String()
	}
	masks := []Key{PartMask("k"), PartMask("v")}
	dst := make([]Key, 2*len(pages))
	for b.Loop() {
		if err := PartKeys(dst, pages, masks); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPins is a batch's pins without its probes: 32 claims of this
// client's pin records, then their release.
func BenchmarkPins(b *testing.B) {
	_, c := testTier(b, 1)
	s, _ := filledStore(b, c, 64, 64)
	var pins [32]int32
	for b.Loop() {
		for n := range pins {
			var err error
			if pins[n], err = s.claimPin(uint64(n+1)<<32 | 1); err != nil {
				b.Fatal(err)
			}
		}
		for _, j := range pins {
			s.unpin(j)
		}
	}
	b.ReportMetric(float64(b.N*len(pins))/b.Elapsed().Seconds(), "pins/s")
}

// BenchmarkFirstLargeLookup is the first pinned lookup of a large batch by
// a client whose pin table is empty (a server's first long prompt): every
// pin of the batch is new, and the table's high-water mark rises with them.
func BenchmarkFirstLargeLookup(b *testing.B) {
	for _, n := range []int{1000, 4000, 12000} {
		b.Run(fmt.Sprintf("keys%d", n), func(b *testing.B) {
			_, c := testTier(b, 1)
			s, err := Create(c, Config{Name: "first", Blocks: 2 * int64(n), BlockBytes: 64, PinsPerClient: int64(n)})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			keys := benchKeys(n)
			payloads := make([][]byte, n)
			for i := range payloads {
				payloads[i] = make([]byte, 64)
			}
			if _, err := s.Set(keys, payloads); err != nil {
				b.Fatal(err)
			}
			var hits []Hit
			for b.Loop() {
				var err error
				if hits, err = s.LookupAppend(hits[:0], keys); err != nil || len(hits) != n {
					b.Fatalf("%d hits: %v", len(hits), err)
				}
				b.StopTimer()
				s.Release(hits)
				// Empty again, as a new client's table is.
				atomic.StoreUint32(u32At(s.myPins, pinHdrHighWater), 0)
				s.pinHint.Store(0)
				b.StartTimer()
			}
		})
	}
}

// BenchmarkGetByLayout is a verified Get of 32 keys per op from an index
// of layout 4 (CRC of the payload) and one of layout 5 (CRC of key and
// payload), side by side: the cost of covering the key.
func BenchmarkGetByLayout(b *testing.B) {
	const n, batch = 512, 32
	for _, size := range []int64{512, 8 << 10} {
		for _, version := range []uint32{4, indexVersion} {
			b.Run(fmt.Sprintf("payload%d/layout%d", size, version), func(b *testing.B) {
				_, c := testTier(b, 1)
				s, err := create(c, Config{Name: "m", Blocks: 2 * n, BlockBytes: size, PinsPerClient: 256}, version)
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				keys := benchKeys(n)
				ps := make([][]byte, n)
				for i := range ps {
					ps[i] = make([]byte, size)
				}
				if _, err := s.Set(keys, ps); err != nil {
					b.Fatal(err)
				}
				dst := make([][]byte, batch)
				for i := range dst {
					dst[i] = make([]byte, size)
				}
				i := 0
				for b.Loop() {
					if got, err := s.Get(keys[i:i+batch], dst); err != nil || got != batch {
						b.Fatalf("get: %d, %v", got, err)
					}
					i = (i + batch) % n
				}
				b.SetBytes(batch * size)
			})
		}
	}
}
