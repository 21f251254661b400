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
	s, keys := filledStore(b, c, n, 64)
	for b.Loop() {
		if got := s.Exists(keys); got != n {
			b.Fatal(got)
		}
	}
}
