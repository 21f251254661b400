package prefix

import (
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
)

// BenchmarkExistsLarge is HiCache's batch_exists in Go: 60k keys (30k
// pages of two parts) probed in an index of 16 MiB of entries, beyond the
// caches, where touchAhead and the parallel split earn their keep.
func BenchmarkExistsLarge(b *testing.B) {
	_, c := tiertest.Format(b, 1, 128<<20, 1<<20)
	const n = 60000
	s, err := Create(c, Config{Name: "m", Blocks: n + 1024, BlockBytes: 64})
	if err != nil {
		b.Fatal(err)
	}
	keys := benchKeys(n)
	ps := make([][]byte, 1000)
	for j := range ps {
		ps[j] = make([]byte, 64)
	}
	for i := 0; i < n; i += 1000 {
		if _, err := s.Set(keys[i:i+1000], ps); err != nil {
			b.Fatal(err)
		}
	}
	for b.Loop() {
		if got := s.Exists(keys); got != n {
			b.Fatal(got)
		}
	}
}
