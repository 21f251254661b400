package rowgather

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkCopy gathers random Engram rows (256-byte rows and their 8-byte
// scales, 24 a token) from a 1 GiB table, through Copy on one thread and
// on every core, beside the baseline of one memmove per row (what the
// library did before, and what torch's index_select does): compare the
// ns/row of each pair, measured in one run.
func BenchmarkCopy(b *testing.B) {
	const rows, dim, scales = 1 << 22, 256, 8
	mem, err := unix.Mmap(-1, 0, rows*(dim+scales), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Skip(err)
	}
	defer unix.Munmap(mem)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1 // real pages, not the shared zero page
	}
	pool := NewPool(runtime.NumCPU())
	for _, tokens := range []int{1, 32, 256, 4096} {
		n := tokens * 24
		planes := []Plane{{mem[:rows*dim], dim, make([]byte, n*dim)}, {mem[rows*dim:], scales, make([]byte, n*scales)}}
		sets := make([][]int64, 32)
		for k := range sets {
			sets[k] = make([]int64, n)
			for i := range sets[k] {
				sets[k][i] = rand.Int64N(rows)
			}
		}
		perRow := func(b *testing.B) {
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/row")
		}
		b.Run(fmt.Sprintf("rows=%d/memmove", n), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				naive(planes, sets[i%len(sets)])
			}
			perRow(b)
		})
		for _, threads := range []int{1, runtime.NumCPU()} {
			b.Run(fmt.Sprintf("rows=%d/threads=%d", n, threads), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					if err := pool.Copy(planes, sets[i%len(sets)], threads); err != nil {
						b.Fatal(err)
					}
				}
				perRow(b)
			})
		}
	}
}
