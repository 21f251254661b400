package tier

import (
	"errors"
	"fmt"
	"testing"
)

// BenchmarkHeapAllocFree measures one allocation plus one free.
func BenchmarkHeapAllocFree(b *testing.B) {
	for _, size := range []int64{64, 656, 4096} {
		b.Run(fmt.Sprintf("size=%d", size), func(b *testing.B) {
			r := formatTest(b, testGeometry())
			h := NewHeap(attachTest(b, r, 0))
			b.ReportAllocs()
			allocFreeLoop(b, h, size)
		})
	}
}

// BenchmarkHeapAllocHighUtil allocates and frees 656 B blocks with the tier
// 96% full (the utilization Mooncake's allocator figures are quoted at).
func BenchmarkHeapAllocHighUtil(b *testing.B) {
	const size = 656
	r := formatTest(b, testGeometry())
	h := NewHeap(attachTest(b, r, 0))
	var all []Offset
	for {
		off, err := h.Alloc(size)
		if errors.Is(err, ErrExhausted) {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
		all = append(all, off)
	}
	for _, off := range all[:len(all)*4/100] {
		if err := h.Free(off); err != nil {
			b.Fatal(err)
		}
	}
	allocFreeLoop(b, h, size)
	b.ReportMetric(float64(len(all)-len(all)*4/100)/float64(len(all))*100, "%full")
}

// BenchmarkChunkAllocFree measures the global allocator (system lock, bitmap
// search, owner words) for one chunk.
func BenchmarkChunkAllocFree(b *testing.B) {
	r := formatTest(b, testGeometry())
	c := attachTest(b, r, 0)
	for b.Loop() {
		off, err := c.AllocChunks(1)
		if err != nil {
			b.Fatal(err)
		}
		if err := c.FreeChunks(off, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLock measures acquire+release, alone and against three other
// processes hammering the same lock. With one node the lock is the node-local
// word; with two, every acquisition goes through the lock manager.
func BenchmarkLock(b *testing.B) {
	for _, nodes := range []int{1, 2} {
		for _, rivals := range []int{0, 3} {
			b.Run(fmt.Sprintf("nodes=%d/processes=%d", nodes, rivals+1), func(b *testing.B) {
				g := testGeometry()
				g.Nodes = nodes
				r := formatTest(b, g)
				runManager(b, r, ManagerOptions{Node: 0, GrantLocks: true})
				c := attachTest(b, r, 0)
				for i := 0; i < rivals; i++ {
					spawn(b, r, "contender", (i+1)%nodes)
				}
				for b.Loop() {
					if err := c.Lock(FirstUserLock); err != nil {
						b.Fatal(err)
					}
					if err := c.Unlock(FirstUserLock); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// allocFreeLoop is the timed part of the heap benchmarks: one allocation
// and its free per iteration.
func allocFreeLoop(b *testing.B, h *Heap, size int64) {
	for b.Loop() {
		off, err := h.Alloc(size)
		if err != nil {
			b.Fatal(err)
		}
		if err := h.Free(off); err != nil {
			b.Fatal(err)
		}
	}
}
