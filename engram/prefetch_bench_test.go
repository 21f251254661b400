package engram

import (
	"math/rand/v2"
	"testing"

	"github.com/cxltier/cxltier/kernels"
)

// BenchmarkPrefetch is one decode step of 256 sequences on the CPU engine,
// with and without the hot cache, to see where the host-side time goes.
func BenchmarkPrefetch(b *testing.B) {
	for _, cache := range []bool{false, true} {
		name := "bypass"
		if cache {
			name = "cache"
		}
		b.Run(name, func(b *testing.B) {
			_, c := testTier(b, 1)
			g := tinyGeometry()
			g.BaseSizes = []int64{4000, 4000}
			g.Vocab = 100000
			h, _ := NewHasher(g)
			tb, err := CreateTable(c, g, h, 1, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			eng := kernels.NewCPU(1)
			defer eng.Close()
			p, err := NewPrefetcher(eng, c, h, []*Table{tb}, PrefetchOptions{Slots: 1 << 16, Cache: cache})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Close()
			rng := rand.New(rand.NewPCG(1, 1))
			hist, seqs := make([][]int64, 256), make([][]int64, 256)
			for i := range hist {
				hist[i] = []int64{rng.Int64N(g.Vocab), rng.Int64N(g.Vocab)}
				seqs[i] = []int64{0}
			}
			for b.Loop() {
				for i := range seqs {
					seqs[i][0] = rng.Int64N(g.Vocab)
				}
				pd, err := p.Prefetch(1, hist, seqs)
				if err != nil {
					b.Fatal(err)
				}
				pd.Wait()
			}
		})
	}
}
