package kernels

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkCPUGatherVsCopy measures the CPU engine's gather of random rows
// against one plain copy of the same number of bytes, side by side in one
// run, and reports both rates and their ratio (the goal is ≥ 0.7).
func BenchmarkCPUGatherVsCopy(b *testing.B) {
	for _, huge := range []bool{false, true} {
		for _, rb := range []int64{64, 656, 4096} {
			b.Run(fmt.Sprintf("hugepages=%v/row=%d", huge, rb), func(b *testing.B) {
				const region, batch = 1 << 30, 64 << 20
				e := NewCPU(0)
				defer e.Close()
				rng := rand.New(rand.NewPCG(1, 2))
				mem := mapRange(b, region, nil)
				if huge {
					unix.Madvise(mem, unix.MADV_HUGEPAGE)
				}
				fill(mem, rng)
				id, err := e.Register(mem)
				if err != nil {
					b.Fatal(err)
				}
				n := int(batch / rb)
				r := Rows{RowBytes: rb, Tier: make([]Addr, n)}
				for i := range r.Tier {
					r.Tier[i] = At(id, rng.Int64N(region/rb)*rb)
				}
				buf, _ := e.Alloc(int64(n) * rb)
				r.Buf = buf
				dst, _ := e.Bytes(buf)
				src := mem[region/2 : region/2+int64(n)*rb]
				var tGather, tCopy time.Duration
				b.SetBytes(int64(n) * rb)
				for b.Loop() {
					t0 := time.Now()
					h, err := e.Gather(r)
					if err != nil {
						b.Fatal(err)
					}
					h.Wait()
					t1 := time.Now()
					copy(dst, src)
					tCopy += time.Since(t1)
					tGather += t1.Sub(t0)
				}
				bytes := float64(b.N) * float64(n*int(rb))
				b.ReportMetric(bytes/tGather.Seconds()/1e9, "gather_GB/s")
				b.ReportMetric(bytes/tCopy.Seconds()/1e9, "copy_GB/s")
				b.ReportMetric(float64(tCopy)/float64(tGather), "gather/copy")
			})
		}
	}
}
