package prefix

import (
	"strconv"
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
)

// BenchmarkExistsLarge is HiCache's batch_exists in Go: 60k keys (30k
// pages of two parts) probed in an index of 16 MiB of entries, beyond the
// caches, where touchAhead and the parallel split earn their keep.
func BenchmarkExistsLarge(b *testing.B) {
	_, c := tiertest.Format(b, 1, 128<<20, 1<<20)
	const n = 60000
	s, keys := filledStore(b, c, n, 64)
	for b.Loop() {
		if got := s.Exists(keys); got != n {
			b.Fatal(got)
		}
	}
}

// BenchmarkExistsPages is batch_exists as the library call makes it: 30k
// pages' hex digests, two parts each, keys derived as they are probed, in
// the index of BenchmarkExistsLarge; PartKeys then Exists beside it.
func BenchmarkExistsPages(b *testing.B) {
	_, c := tiertest.Format(b, 1, 128<<20, 1<<20)
	const pages = 30000
	s := testStore(b, c, 4*pages, 64)
	masks := []Key{PartMask("k"), PartMask("v")}
	hexes := make([]string, pages)
	keys := make([]Key, 2*pages)
	for i := range hexes {
		hexes[i] = StringKey(strconv.Itoa(i)).String()
	}
	if err := PartKeys(keys, hexes, masks); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < len(keys); i += 1024 {
		batch := keys[i:min(i+1024, len(keys))]
		if st, err := s.Set(batch, make([][]byte, len(batch))); err != nil || st[len(batch)-1] != Reserved {
			b.Fatalf("fill: %v", err)
		}
	}
	b.Run("one-call", func(b *testing.B) {
		for b.Loop() {
			if got := s.ExistsPages(hexes, masks); got != pages {
				b.Fatal(got)
			}
		}
	})
	b.Run("keys-then-probe", func(b *testing.B) {
		dst := make([]Key, 2*pages)
		for b.Loop() {
			if err := PartKeys(dst, hexes, masks); err != nil {
				b.Fatal(err)
			}
			if got := s.Exists(dst); got != 2*pages {
				b.Fatal(got)
			}
		}
	})
}
