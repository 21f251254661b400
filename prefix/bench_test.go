package prefix

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"testing"
)

func benchKeys(n int) []Key {
	keys := make([]Key, n)
	for i := range keys {
		binary.LittleEndian.PutUint64(keys[i][:], uint64(i)*0x9e3779b97f4a7c15)
		keys[i][8] = 1
	}
	return keys
}

// BenchmarkLookup is one pinned lookup and its release per op, on a full
// index (the lock-free read path), reusing the hits slice as a server
// does (LookupAppend).
func BenchmarkLookup(b *testing.B) {
	for _, batch := range []int{1, 32} {
		b.Run(map[int]string{1: "batch1", 32: "batch32"}[batch], func(b *testing.B) {
			_, c := testTier(b, 1)
			s := testStore(b, c, 4096, 512)
			keys := benchKeys(4096)
			payload := make([]byte, 512)
			for i := 0; i < len(keys); i += 256 {
				ps := make([][]byte, 256)
				for j := range ps {
					ps[j] = payload
				}
				if _, err := s.Set(keys[i:i+256], ps); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
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
		})
	}
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

// BenchmarkLookupRandom draws keys at random from a larger index (8192
// ready entries, a 2 MiB table: beyond the core's own caches), as
// bench/prefix does; touchAhead is for this case.
func BenchmarkLookupRandom(b *testing.B) {
	const n = 8192
	tierFor := func(tb testing.TB) *Store {
		_, c := testTier(tb, 1)
		s := testStore(tb, c, n, 64)
		keys := benchKeys(n)
		ps := make([][]byte, 256)
		for j := range ps {
			ps[j] = make([]byte, 64)
		}
		for i := 0; i < n; i += 256 {
			if _, err := s.Set(keys[i:i+256], ps); err != nil {
				tb.Fatal(err)
			}
		}
		return s
	}
	for _, batch := range []int{1, 32} {
		b.Run(map[int]string{1: "batch1", 32: "batch32"}[batch], func(b *testing.B) {
			s := tierFor(b)
			keys := benchKeys(n)
			draws := make([]Key, 1<<16)
			rng := uint64(1)
			for i := range draws {
				rng = rng*6364136223846793005 + 1442695040888963407
				draws[i] = keys[(rng>>33)%n]
			}
			var hits []Hit
			for i := 0; b.Loop(); i++ {
				at := (i * batch) % (len(draws) - batch)
				var err error
				hits, err = s.LookupAppend(hits[:0], draws[at:at+batch])
				if err != nil || len(hits) != batch {
					b.Fatalf("lookup: %d hits, %v", len(hits), err)
				}
				s.Release(hits)
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
