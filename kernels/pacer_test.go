package kernels

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingPacer counts the pieces and bytes it is asked for; while held,
// Turn waits, as an arbiter's does while a deadline is due.
type countingPacer struct {
	turns, bytes atomic.Int64
	hold         sync.RWMutex
}

func (p *countingPacer) Turn(n int64) {
	p.turns.Add(1)
	p.bytes.Add(n)
	p.hold.RLock()
	p.hold.RUnlock()
}

// A paced CPU engine asks its pacer before every piece of its block calls,
// for every byte they move, and waits where the pacer waits; checksums
// come out the same (TestBlocksChecksums runs a paced engine too), and
// row calls are never paced.
func TestBlockCallsArePaced(t *testing.T) {
	for _, workers := range []int{1, 3} {
		e := NewCPU(workers)
		defer e.Close()
		p := &countingPacer{}
		e.SetPacer(p, 100<<10) // pieces of whole chunks: 4 of 32 KiB
		f := newFixture(t, e, 9, 8<<20)
		const chunk, nchunks, nblocks = 32 << 10, 4, 24 // 3 MiB
		buf, err := e.Alloc(nchunks * nblocks * chunk)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Free()
		b := Blocks{ChunkBytes: chunk, PageStride: nchunks * chunk}
		for c := range nchunks {
			b.Chunks = append(b.Chunks, Span{Buf: buf, Offset: int64(c) * chunk})
		}
		for i := range nblocks {
			b.Tier, b.Pages = append(b.Tier, At(f.ids[0], int64(i)*nchunks*chunk)), append(b.Pages, int64(i))
		}
		p.hold.Lock()
		done := make(chan error, 1)
		go func() { // a call too small to split runs on its caller's goroutine
			h, err := e.GatherBlocks(b)
			if err == nil {
				err = h.Wait()
			}
			done <- err
		}()
		select {
		case err := <-done:
			t.Fatalf("%d workers: a call finished while its pacer held it: %v", workers, err)
		case <-time.After(20 * time.Millisecond):
		}
		p.hold.Unlock()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		total := int64(nchunks * nblocks * chunk)
		if got := p.bytes.Load(); got != total {
			t.Fatalf("%d workers: the pacer was asked for %d bytes, the call moved %d", workers, got, total)
		}
		if turns := p.turns.Load(); turns < total/(128<<10) || turns > total/(128<<10)+int64(workers) {
			t.Fatalf("%d workers: %d pieces for %d bytes in pieces of 128 KiB", workers, turns, total)
		}
		before := p.turns.Load()
		rows := Rows{RowBytes: 64, Buf: buf, Tier: []Addr{At(f.ids[0], 0)}, Slots: []int64{0}}
		if h, err := e.Gather(rows); err != nil || h.Wait() != nil {
			t.Fatal(err)
		}
		if p.turns.Load() != before {
			t.Fatal("a row call was paced")
		}
	}
}
