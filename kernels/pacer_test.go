package kernels

import (
	"errors"
	"hash/crc32"
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

// depthLauncher is the interpreter engine with each Run's Handle noted:
// which Runs were waited for when the pacer is next asked.
type depthLauncher struct {
	*Sim
	runs   []*notedHandle
	turns  int
	ahead  int // the most Runs queued and not waited for at a Turn
	pieces []int
}

type notedHandle struct {
	h      Handle
	waited bool
}

func (h *notedHandle) Wait() error { h.waited = true; return h.h.Wait() }

func (d *depthLauncher) Run(f func(Launch) error) (Handle, error) {
	h, err := d.Sim.Run(f)
	if err != nil {
		return nil, err
	}
	n := &notedHandle{h: h}
	d.runs = append(d.runs, n)
	return n, nil
}

func (d *depthLauncher) Turn(n int64) {
	d.turns++
	d.pieces = append(d.pieces, int(n))
	ahead := 0
	for _, r := range d.runs {
		if !r.waited {
			ahead++
		}
	}
	d.ahead = max(d.ahead, ahead)
}

// A paced device engine queues a block call as kernels over whole pages
// of about a piece, asks its pacer before each for the bytes it moves,
// and has at most two of them queued when it asks; the checksums are one
// call's, and a call that is wrong anywhere moves nothing.
func TestDeviceBlockCallsArePaced(t *testing.T) {
	sim, err := NewSim(SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	const chunk, nchunks, nblocks = 1024, 3, 10
	f := newFixture(t, sim, 3, nchunks*nblocks*chunk)
	d := &depthLauncher{Sim: sim}
	sim.SetPacer(d, 2*nchunks*chunk+100) // two pages a piece: 5 pieces
	b := Blocks{ChunkBytes: chunk, CRCs: make([]uint32, nblocks)}
	for range nchunks {
		buf, err := sim.Alloc(nblocks * chunk)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Free()
		b.Chunks = append(b.Chunks, Span{Buf: buf})
	}
	for i := range nblocks {
		b.Tier, b.Pages = append(b.Tier, At(f.ids[0], int64(i*nchunks*chunk))), append(b.Pages, int64(i))
	}
	h, err := runBlocksPaced(d, &sim.pace, &sim.ranges, sim.fnBlocks, &b, sim.chunkAddrs(t, b), 0, &sim.shifts)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	if d.turns != 5 || len(d.runs) != 5 || d.ahead > pieceDepth {
		t.Fatalf("%d turns, %d kernels, up to %d queued at a turn: want 5, 5, at most %d", d.turns, len(d.runs), d.ahead, pieceDepth)
	}
	for i, n := range d.pieces {
		if n != 2*nchunks*chunk {
			t.Fatalf("piece %d: the pacer was asked for %d bytes, it moves %d", i, n, 2*nchunks*chunk)
		}
	}
	for i := range nblocks {
		page := f.bytesAt(b.Tier[i], nchunks*chunk)
		if want := crc32.Checksum(page, crc32.MakeTable(crc32.Castagnoli)); b.CRCs[i] != want {
			t.Fatalf("block %d: checksum %08x, want %08x", i, b.CRCs[i], want)
		}
	}
	bad := b
	bad.Pages = append([]int64(nil), b.Pages...)
	bad.Pages[nblocks-1] = nblocks // past the chunk buffers, in the last piece
	turns := d.turns
	if _, err := runBlocksPaced(d, &sim.pace, &sim.ranges, sim.fnBlocks, &bad, sim.chunkAddrs(t, bad), 0, &sim.shifts); !errors.Is(err, ErrOutOfBounds) {
		t.Fatalf("a page past the buffers in the last piece: %v, want ErrOutOfBounds", err)
	}
	if d.turns != turns {
		t.Fatalf("a call refused at its last page moved %d pieces first", d.turns-turns)
	}
}

// chunkAddrs are b's chunks' device addresses, as Sim.blocks computes them.
func (e *Sim) chunkAddrs(t *testing.T, b Blocks) []uint64 {
	t.Helper()
	out := make([]uint64, len(b.Chunks))
	for c, ch := range b.Chunks {
		sb, err := e.own(ch.Buf)
		if err != nil {
			t.Fatal(err)
		}
		out[c] = sb.dev + uint64(ch.Offset)
	}
	return out
}

// Joined to a pacer, the interpreter engine (as the CUDA one) waits where
// its pacer waits, and its row calls are never paced.
func TestDeviceEngineWaitsForItsPacer(t *testing.T) {
	e, err := NewSim(SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := &countingPacer{}
	e.SetPacer(p, 0)
	const chunk, nblocks = 64 << 10, 40 // 64 KiB pages: 16 a piece of DevicePiece
	f := newFixture(t, e, 5, nblocks*chunk)
	buf, err := e.Alloc(nblocks * chunk)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	b := Blocks{ChunkBytes: chunk, Chunks: []Span{{Buf: buf}}}
	for i := range nblocks {
		b.Tier, b.Pages = append(b.Tier, At(f.ids[0], int64(i)*chunk)), append(b.Pages, int64(i))
	}
	p.hold.Lock()
	done := make(chan error, 1)
	go func() {
		h, err := e.GatherBlocks(b)
		if err == nil {
			err = h.Wait()
		}
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a call finished while its pacer held it: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	p.hold.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if p.turns.Load() != 3 || p.bytes.Load() != nblocks*chunk {
		t.Fatalf("%d turns for %d bytes, want 3 for %d", p.turns.Load(), p.bytes.Load(), nblocks*chunk)
	}
	rows := Rows{RowBytes: 64, Buf: buf, Tier: []Addr{At(f.ids[0], 0)}, Slots: []int64{0}}
	if h, err := e.Gather(rows); err != nil || h.Wait() != nil {
		t.Fatal(err)
	}
	if p.turns.Load() != 3 {
		t.Fatal("a row call was paced")
	}
}

// A block call's own pacer takes the place of its engine's, on the CPU
// engine and on a device engine, for every byte of the call; an engine
// that is not paced asks neither.
func TestACallsOwnPacerTakesTheEnginesPlace(t *testing.T) {
	sim, err := NewSim(SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	cpu := NewCPU(3)
	defer cpu.Close()
	for _, tc := range []struct {
		name string
		eng  interface {
			Engine
			Paced
		}
		paced bool
	}{{"cpu", cpu, true}, {"sim", sim, true}, {"cpu, not paced", NewCPU(1), false}} {
		t.Run(tc.name, func(t *testing.T) {
			engine, own := &countingPacer{}, &countingPacer{}
			if tc.paced {
				tc.eng.SetPacer(engine, 128<<10)
				defer tc.eng.SetPacer(nil, 0)
			}
			const chunk, nblocks = 64 << 10, 16
			f := newFixture(t, tc.eng, 5, nblocks*chunk)
			buf, err := tc.eng.Alloc(nblocks * chunk)
			if err != nil {
				t.Fatal(err)
			}
			defer buf.Free()
			b := Blocks{ChunkBytes: chunk, Chunks: []Span{{Buf: buf}}, Pacer: own}
			for i := range nblocks {
				b.Tier, b.Pages = append(b.Tier, At(f.ids[0], int64(i)*chunk)), append(b.Pages, int64(i))
			}
			for _, call := range []func(Blocks) (Handle, error){tc.eng.GatherBlocks, tc.eng.ScatterBlocks} {
				if h, err := call(b); err != nil || h.Wait() != nil {
					t.Fatal(err)
				}
			}
			want := int64(0)
			if tc.paced {
				want = 2 * nblocks * chunk
			}
			if engine.bytes.Load() != 0 || own.bytes.Load() != want {
				t.Fatalf("the engine's pacer asked for %d bytes and the call's for %d, want 0 and %d", engine.bytes.Load(), own.bytes.Load(), want)
			}
		})
	}
}
