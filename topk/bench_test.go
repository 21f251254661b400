package topk

import "testing"

// BenchmarkPlan is the CPU planning of one request's step (k = 2048,
// 4096 slots, 90% overlap), without copies.
func BenchmarkPlan(b *testing.B) {
	tr, err := NewTrace(TraceConfig{Batch: 1, Context: 65536, TopK: 2048, Overlap: 0.9, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	steps := make([][]int32, 64)
	lens := make([]int64, 64)
	for i := range steps {
		steps[i] = tr.Next()
		lens[i] = tr.Lens()[0]
	}
	t := newTable(4096)
	var sc scratch
	out := make([]int32, 2048)
	var copies []copyOp
	for i := 0; b.Loop(); i++ {
		copies, _ = t.resolve(lens[i%64], steps[i%64], out, &sc, copies[:0])
	}
}
