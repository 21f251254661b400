package main

import (
	"math/rand/v2"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkGatherRows gathers 768 random 256-byte rows and their 8-byte
// scales (32 tokens of DeepSeek-V4.1 Engram) from a 1 GiB table.
func BenchmarkGatherRows(b *testing.B) {
	const rows, dim, scales = 1 << 22, 256, 8
	mem, err := unix.Mmap(-1, 0, rows*(dim+scales), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		b.Skip(err)
	}
	defer unix.Munmap(mem)
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = 1
	}
	const n = 768
	w, s := make([]byte, n*dim), make([]byte, n*scales)
	planes := []plane{{src: mem, rowBytes: dim, dst: w}, {src: mem[rows*dim:], rowBytes: scales, dst: s}}
	idsets := make([][]int64, 64)
	for k := range idsets {
		idsets[k] = make([]int64, n)
		for i := range idsets[k] {
			idsets[k][i] = rand.Int64N(rows)
		}
	}
	b.SetBytes(n * (dim + scales))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := gatherRows(planes, rows, idsets[i%len(idsets)]); err != nil {
			b.Fatal(err)
		}
	}
}
