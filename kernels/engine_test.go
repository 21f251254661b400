package kernels

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// engineMakers lists the engines under test: the CPU engine always, the
// CUDA engine when built with -tags cuda on a machine with a GPU (see
// cuda_test.go).
var engineMakers = []struct {
	name string
	make func(t testing.TB) Engine
}{
	{"cpu", func(t testing.TB) Engine { return NewCPU(0) }},
}

func forEachEngine(t *testing.T, f func(t *testing.T, e Engine)) {
	for _, m := range engineMakers {
		t.Run(m.name, func(t *testing.T) {
			e := m.make(t)
			t.Cleanup(func() {
				if err := e.Close(); err != nil {
					t.Errorf("close: %v", err)
				}
			})
			f(t, e)
		})
	}
}

// mapRange maps n bytes of anonymous memory filled from rng, as a tier
// device mapping would be.
func mapRange(t testing.TB, n int, rng *rand.Rand) []byte {
	t.Helper()
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(m) })
	if rng != nil {
		fill(m, rng)
	}
	return m
}

func fill(b []byte, rng *rand.Rand) {
	for i := 0; i+8 <= len(b); i += 8 {
		v := rng.Uint64()
		for k := range 8 {
			b[i+k] = byte(v >> (8 * k))
		}
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(rng.Uint32())
	}
}

type fixture struct {
	e    Engine
	mems [][]byte
	ids  []RangeID
	lens []int64
	rng  *rand.Rand
}

func newFixture(t testing.TB, e Engine, seed uint64, sizes ...int) *fixture {
	f := &fixture{e: e, rng: rand.New(rand.NewPCG(seed, 7))}
	for _, n := range sizes {
		m := mapRange(t, n, f.rng)
		id, err := e.Register(m)
		if err != nil {
			t.Fatal(err)
		}
		f.mems, f.ids, f.lens = append(f.mems, m), append(f.ids, id), append(f.lens, int64(n))
	}
	return f
}

// randomAddr picks a place for n bytes in a random range; aligned rows
// exercise the vector path, others the tails.
func (f *fixture) randomAddr(n int64, align int64) (int, Addr) {
	k := f.rng.IntN(len(f.ids))
	off := f.rng.Int64N(f.lens[k]-n+1) / align * align
	return k, At(f.ids[k], off)
}

func (f *fixture) bytesAt(a Addr, n int64) []byte {
	for k, id := range f.ids {
		if id == a.Range() {
			return f.mems[k][a.Offset() : a.Offset()+n]
		}
	}
	panic("unknown range")
}

type rowCase struct {
	rowBytes int64
	rows     int
	slotted  bool
	align    int64
}

func rowCases() []rowCase {
	var cs []rowCase
	for _, rb := range []int64{16, 17, 64, 100, 272, 656, 4096, 4100, 65536} {
		for _, rows := range []int{1, 7, 1000, 100_000} {
			if int64(rows)*rb > 24<<20 {
				continue
			}
			for _, slotted := range []bool{false, true} {
				align := int64(16)
				if rb%16 != 0 {
					align = 1
				}
				cs = append(cs, rowCase{rb, rows, slotted, align})
			}
		}
	}
	return cs
}

func TestGatherScatterRows(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, 1, 16<<20, 5<<20+13, 6<<20)
		for _, c := range rowCases() {
			// The interpreter's shuffled schedules skip the largest case: the
			// gather kernels' threads share nothing, so a schedule changes
			// little there, and it takes the interpreter most of a minute.
			if (testing.Short() || strings.Contains(t.Name(), "shuffled")) && c.rows == 100_000 {
				continue
			}
			t.Run(fmt.Sprintf("row=%d/rows=%d/slotted=%v", c.rowBytes, c.rows, c.slotted), func(t *testing.T) {
				testRows(t, f, c)
			})
		}
	})
}

func testRows(t *testing.T, f *fixture, c rowCase) {
	r := Rows{RowBytes: c.rowBytes, Tier: make([]Addr, c.rows)}
	for i := range r.Tier {
		_, r.Tier[i] = f.randomAddr(c.rowBytes, c.align)
	}
	nslots := int64(c.rows)
	if c.slotted {
		nslots = int64(c.rows) + 3
		r.SlotStride = (c.rowBytes + 31) / 16 * 16 // padded slots
		r.BufOffset = 48
		r.Slots = make([]int64, c.rows)
		for i, s := range f.rng.Perm(int(nslots))[:c.rows] {
			r.Slots[i] = int64(s)
		}
	}
	stride := max(r.SlotStride, c.rowBytes)
	bufLen := r.BufOffset + nslots*stride
	buf, err := f.e.Alloc(bufLen)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	r.Buf = buf

	// Gather: the buffer must hold exactly the reference's bytes.
	want := make([]byte, bufLen)
	fill(want, f.rng)
	if err := f.e.Upload(buf, 0, want); err != nil {
		t.Fatal(err)
	}
	for i, a := range r.Tier {
		copy(want[slotOffset(r, i):], f.bytesAt(a, c.rowBytes))
	}
	h, err := f.e.Gather(r)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, bufLen)
	if err := f.e.Download(got, buf, 0); err != nil {
		t.Fatal(err)
	}
	compare(t, "gather", got, want, r)

	// Scatter to distinct places: the tier must hold the buffer's rows.
	for i := range r.Tier {
		r.Tier[i] = f.distinctAddr(i, c)
	}
	fill(want, f.rng)
	if err := f.e.Upload(buf, 0, want); err != nil {
		t.Fatal(err)
	}
	if h, err = f.e.Scatter(r); err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	for i, a := range r.Tier {
		so := slotOffset(r, i)
		if !bytes.Equal(f.bytesAt(a, c.rowBytes), want[so:so+c.rowBytes]) {
			t.Fatalf("scatter: row %d (slot at %d) differs at %v", i, so, a)
		}
	}
}

// distinctAddr places row i where no other row of the case goes: rows are
// laid out in cells of the first range, wrapping over the others.
func (f *fixture) distinctAddr(i int, c rowCase) Addr {
	cell := (c.rowBytes + 15) / 16 * 16
	for k, l := range f.lens {
		per := int(l / cell)
		if i < per {
			return At(f.ids[k], int64(i)*cell)
		}
		i -= per
	}
	panic("case larger than the fixture")
}

func slotOffset(r Rows, i int) int64 {
	stride := max(r.SlotStride, r.RowBytes)
	if r.Slots == nil {
		return r.BufOffset + int64(i)*stride
	}
	return r.BufOffset + r.Slots[i]*stride
}

func compare(t *testing.T, what string, got, want []byte, r Rows) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: first difference at buffer byte %d (row size %d, stride %d, offset %d): got %#x want %#x",
				what, i, r.RowBytes, r.SlotStride, r.BufOffset, got[i], want[i])
		}
	}
}

func TestGatherScatterBlocks(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, 2, 16<<20, 16<<20)
		for _, c := range []struct {
			chunkBytes int64
			chunks     int
			blocks     int
			pages      int
		}{
			{16, 1, 1, 1},
			{1152, 128, 5, 11}, // 64 layers × K/V, page 1 token × 576 B × 2 B
			{9216, 61, 9, 32},  // MLA latent, 16-token pages, odd layer count
			{100, 7, 40, 64},   // not a multiple of 16
			{32768, 4, 30, 100},
		} {
			t.Run(fmt.Sprintf("chunk=%d/chunks=%d/blocks=%d", c.chunkBytes, c.chunks, c.blocks), func(t *testing.T) {
				testBlocks(t, f, c.chunkBytes, c.chunks, c.blocks, c.pages)
			})
		}
	})
}

func testBlocks(t *testing.T, f *fixture, chunkBytes int64, nchunks, nblocks, npages int) {
	blockBytes := chunkBytes * int64(nchunks)
	stride := chunkBytes + 16
	b := Blocks{ChunkBytes: chunkBytes, PageStride: stride, Tier: make([]Addr, nblocks), Pages: make([]int64, nblocks)}
	host := make([][]byte, nchunks)
	for c := range nchunks {
		n := int64(c%3)*64 + int64(npages)*stride
		buf, err := f.e.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Free()
		b.Chunks = append(b.Chunks, Span{Buf: buf, Offset: int64(c%3) * 64})
		host[c] = make([]byte, n)
	}
	pages := f.rng.Perm(npages)
	for i := range nblocks {
		k := i % len(f.ids)
		b.Tier[i] = At(f.ids[k], int64(i/len(f.ids))*blockBytes) // distinct blocks, for the scatter
		b.Pages[i] = int64(pages[i%npages])
	}
	if nblocks > npages {
		b.Tier, b.Pages = b.Tier[:npages], b.Pages[:npages]
		nblocks = npages
	}
	upload := func() {
		for c := range nchunks {
			fill(host[c], f.rng)
			if err := f.e.Upload(b.Chunks[c].Buf, 0, host[c]); err != nil {
				t.Fatal(err)
			}
		}
	}
	upload()
	h, err := f.e.GatherBlocks(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	for c := range nchunks {
		for i := range nblocks {
			off := b.Chunks[c].Offset + b.Pages[i]*stride
			copy(host[c][off:off+chunkBytes], f.bytesAt(b.Tier[i], blockBytes)[int64(c)*chunkBytes:])
		}
		got := make([]byte, len(host[c]))
		if err := f.e.Download(got, b.Chunks[c].Buf, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, host[c]) {
			t.Fatalf("gather blocks: chunk %d buffer differs", c)
		}
	}

	upload()
	if h, err = f.e.ScatterBlocks(b); err != nil {
		t.Fatal(err)
	}
	if err := h.Wait(); err != nil {
		t.Fatal(err)
	}
	for i := range nblocks {
		block := f.bytesAt(b.Tier[i], blockBytes)
		for c := range nchunks {
			off := b.Chunks[c].Offset + b.Pages[i]*stride
			if !bytes.Equal(block[int64(c)*chunkBytes:int64(c+1)*chunkBytes], host[c][off:off+chunkBytes]) {
				t.Fatalf("scatter blocks: block %d chunk %d differs", i, c)
			}
		}
	}
}

func TestOrderedCalls(t *testing.T) {
	// A scatter then a gather of the same rows: the gather must see the
	// scatter's bytes without a Wait in between, as on a CUDA stream.
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, 3, 32<<20)
		const rows, rb = 20000, 656
		src, _ := e.Alloc(rows * rb)
		dst, _ := e.Alloc(rows * rb)
		defer src.Free()
		defer dst.Free()
		want := make([]byte, rows*rb)
		fill(want, f.rng)
		if err := e.Upload(src, 0, want); err != nil {
			t.Fatal(err)
		}
		r := Rows{RowBytes: rb, Tier: make([]Addr, rows), Buf: src}
		for i := range r.Tier {
			r.Tier[i] = At(f.ids[0], int64(rows-1-i)*rb)
		}
		if _, err := e.Scatter(r); err != nil {
			t.Fatal(err)
		}
		r.Buf = dst
		h, err := e.Gather(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Wait(); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, rows*rb)
		if err := e.Download(got, dst, 0); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatal("gather after scatter did not see the scattered rows")
		}
	})
}

func TestRefusals(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		f := newFixture(t, e, 4, 1<<20)
		id := f.ids[0]
		buf, err := e.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Free()
		other := NewCPU(1)
		defer other.Close()
		foreign, _ := other.Alloc(4096)
		ok := func() Rows { return Rows{RowBytes: 64, Tier: []Addr{At(id, 0), At(id, 64)}, Buf: buf} }
		for _, tc := range []struct {
			name string
			edit func(*Rows)
			want error
		}{
			{"row past the range", func(r *Rows) { r.Tier[1] = At(id, 1<<20-63) }, ErrOutOfBounds},
			{"row at the range's end", func(r *Rows) { r.Tier[1] = At(id, 1<<20) }, ErrOutOfBounds},
			{"huge offset", func(r *Rows) { r.Tier[1] = At(id, MaxRangeBytes-1) }, ErrOutOfBounds},
			{"unregistered range", func(r *Rows) { r.Tier[0] = At(id+1, 0) }, ErrNoRange},
			{"slot past the buffer", func(r *Rows) { r.Slots = []int64{0, 64} }, ErrOutOfBounds},
			{"negative slot", func(r *Rows) { r.Slots = []int64{0, -1} }, ErrOutOfBounds},
			{"huge slot", func(r *Rows) { r.Slots = []int64{0, 1 << 62} }, ErrOutOfBounds},
			{"rows overrun the buffer", func(r *Rows) { r.BufOffset = 4096 - 64 }, ErrOutOfBounds},
			{"negative buffer offset", func(r *Rows) { r.BufOffset = -64 }, ErrOutOfBounds},
			{"slots and rows disagree", func(r *Rows) { r.Slots = []int64{0} }, ErrBadRequest},
			{"zero row size", func(r *Rows) { r.RowBytes = 0 }, ErrBadRequest},
			{"stride below row size", func(r *Rows) { r.SlotStride = 32 }, ErrBadRequest},
			{"no buffer", func(r *Rows) { r.Buf = nil }, ErrBadRequest},
			{"another engine's buffer", func(r *Rows) { r.Buf = foreign }, ErrForeignBuffer},
		} {
			r := ok()
			tc.edit(&r)
			for _, op := range []func(Rows) (Handle, error){e.Gather, e.Scatter} {
				if _, err := op(r); !errors.Is(err, tc.want) {
					t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
				}
			}
		}
		if _, err := e.Gather(ok()); err != nil {
			t.Fatalf("the valid request failed: %v", err)
		}

		okb := func() Blocks {
			return Blocks{ChunkBytes: 256, Tier: []Addr{At(id, 0)}, Pages: []int64{3}, Chunks: []Span{{buf, 0}, {buf, 1024}}}
		}
		for _, tc := range []struct {
			name string
			edit func(*Blocks)
			want error
		}{
			{"page past a chunk buffer", func(b *Blocks) { b.Pages[0] = 12 }, ErrOutOfBounds},
			{"block past the range", func(b *Blocks) { b.Tier[0] = At(id, 1<<20-511) }, ErrOutOfBounds},
			{"pages and blocks disagree", func(b *Blocks) { b.Pages = nil }, ErrBadRequest},
			{"no chunks", func(b *Blocks) { b.Chunks = nil }, ErrBadRequest},
			{"page stride below chunk", func(b *Blocks) { b.PageStride = 8 }, ErrBadRequest},
			{"foreign chunk buffer", func(b *Blocks) { b.Chunks[1].Buf = foreign }, ErrForeignBuffer},
		} {
			b := okb()
			tc.edit(&b)
			for _, op := range []func(Blocks) (Handle, error){e.GatherBlocks, e.ScatterBlocks} {
				if _, err := op(b); !errors.Is(err, tc.want) {
					t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
				}
			}
		}
		if _, err := e.GatherBlocks(okb()); err != nil {
			t.Fatalf("the valid block request failed: %v", err)
		}
		if err := e.Upload(buf, 4000, make([]byte, 97)); !errors.Is(err, ErrOutOfBounds) {
			t.Errorf("upload past the buffer: %v", err)
		}
		if err := e.Download(make([]byte, 10), buf, -1); !errors.Is(err, ErrOutOfBounds) {
			t.Errorf("download at -1: %v", err)
		}
		if err := e.Unregister(id); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Gather(ok()); !errors.Is(err, ErrNoRange) {
			t.Errorf("gather from an unregistered range: %v", err)
		}
		if err := e.Unregister(id); !errors.Is(err, ErrNoRange) {
			t.Errorf("second unregister: %v", err)
		}
	})
}

func TestRangeTableFull(t *testing.T) {
	var tab rangeTable
	for i := range MaxRanges {
		if id, err := tab.claim(4096); err != nil || int(id) != i {
			t.Fatalf("claim %d: %d, %v", i, id, err)
		}
	}
	if _, err := tab.claim(4096); !errors.Is(err, ErrTooManyRanges) {
		t.Fatalf("claim beyond %d: %v", MaxRanges, err)
	}
	if err := tab.release(17); err != nil {
		t.Fatal(err)
	}
	if id, err := tab.claim(1); err != nil || id != 17 {
		t.Fatalf("reclaim: %d, %v", id, err)
	}
	if _, err := tab.claim(0); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("empty range: %v", err)
	}
	if _, err := tab.claim(MaxRangeBytes + 1); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("range beyond an Addr: %v", err)
	}
}

func TestAddr(t *testing.T) {
	for _, tc := range []struct {
		r   RangeID
		off int64
	}{{0, 0}, {1, 656}, {255, MaxRangeBytes - 1}, {7, 1 << 40}} {
		a := At(tc.r, tc.off)
		if a.Range() != tc.r || a.Offset() != tc.off {
			t.Errorf("At(%d, %d) = %v", tc.r, tc.off, a)
		}
	}
}

func TestClosedEngine(t *testing.T) {
	e := NewCPU(0)
	buf, _ := e.Alloc(64)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Register(make([]byte, 64)); !errors.Is(err, ErrClosed) {
		t.Errorf("register after close: %v", err)
	}
	if _, err := e.Gather(Rows{RowBytes: 64, Buf: buf}); !errors.Is(err, ErrClosed) {
		t.Errorf("gather after close: %v", err)
	}
}

// TestUnregisterDuringCalls: a range unregistered while calls on it are
// made is, for each call, either an error (checked after the unregister)
// or a complete copy of the right bytes (checked before it, and finished
// before Unregister returns) — never a fault on memory the engine let go.
// Calls used to check the range before taking the engine lock, so an
// Unregister in between left the copy a nil mapping to index.
func TestUnregisterDuringCalls(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		const rowBytes, rows = 64, 256
		mem := mapRange(t, rowBytes*rows, rand.New(rand.NewPCG(3, 3)))
		buf, err := e.Alloc(rowBytes * rows)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Free()
		tier := make([]Addr, rows)
		stop := make(chan struct{})
		done := make(chan error)
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				id, err := e.Register(mem)
				if err != nil {
					done <- err
					return
				}
				if err := e.Unregister(id); err != nil {
					done <- err
					return
				}
			}
		}()
		copied := 0
		got := make([]byte, rowBytes*rows)
		for i := range tier {
			tier[i] = At(0, int64(i)*rowBytes) // the only range takes id 0
		}
		for range 3000 {
			h, err := e.Gather(Rows{RowBytes: rowBytes, Tier: tier, Buf: buf})
			if err != nil {
				if !errors.Is(err, ErrNoRange) {
					t.Fatalf("gather: %v", err)
				}
				continue
			}
			if err := h.Wait(); err != nil {
				t.Fatal(err)
			}
			copied++
		}
		close(stop)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := e.Download(got, buf, 0); err != nil {
			t.Fatal(err)
		}
		if copied > 0 && !bytes.Equal(got, mem) {
			t.Fatalf("after %d whole copies the buffer differs from the range", copied)
		}
		t.Logf("%d of 3000 calls copied, the rest found the range gone", copied)
	})
}
