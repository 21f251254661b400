package prefix

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// TestMoverPagedRoundTrip puts pages of a paged pool (three chunks per
// page, each in its own buffer, as K/V of layers are) into the index and
// gathers them into other pages, with the CPU engine: the same calls the
// CUDA engine serves on a GPU.
func TestMoverPagedRoundTrip(t *testing.T) {
	for _, devices := range []int{1, 2} {
		t.Run(fmt.Sprintf("%ddev", devices), func(t *testing.T) {
			_, c := testTier(t, devices)
			s := testStore(t, c, 16, 3*1024)
			eng := kernels.NewCPU(2)
			defer eng.Close()
			const pages, chunk = 8, 1024
			var l Layout
			l.ChunkBytes = chunk
			var raw [][]byte
			for i := range 3 {
				buf, err := eng.Alloc(pages * chunk)
				if err != nil {
					t.Fatal(err)
				}
				defer buf.Free()
				b, _ := eng.Bytes(buf)
				for j := range b {
					b[j] = byte(i*31 + j*7 + j>>10)
				}
				raw = append(raw, b)
				l.Chunks = append(l.Chunks, kernels.Span{Buf: buf})
			}
			m, err := NewMover(s, eng, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			keys := []Key{keyN(1), keyN(2), keyN(3)}
			st, err := m.Put(keys, l, []int64{0, 2, 5})
			if err != nil || st[0] != Reserved || st[2] != Reserved {
				t.Fatalf("Put = %v, %v", st, err)
			}
			want := func(i int, page int64) []byte { return append([]byte(nil), raw[i][page*chunk:(page+1)*chunk]...) }
			before := [][]byte{want(0, 2), want(1, 2), want(2, 2)}
			n, err := m.Get(keys, l, []int64{1, 3, 4})
			if err != nil || n != 3 {
				t.Fatalf("Get = %d, %v", n, err)
			}
			for i := range 3 {
				if !bytes.Equal(raw[i][3*chunk:4*chunk], before[i]) {
					t.Fatalf("chunk %d of page 3 is not page 2's", i)
				}
			}
			mustCheck(t, s)
			if _, err := m.Get(keys, Layout{ChunkBytes: 4096, Chunks: l.Chunks}, []int64{0, 1, 2}); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("oversized layout: %v", err)
			}
			if _, err := m.Put(keys, l, []int64{0}); !errors.Is(err, ErrBadConfig) {
				t.Fatalf("pages mismatch: %v", err)
			}
		})
	}
}

// layeredPool is a paged pool of pages pages, layers layers of K and V
// chunks (each in its own CPU buffer, layer-major as SGLang's pools are),
// filled with bytes that name buffer, page and offset.
func layeredPool(t *testing.T, eng *kernels.CPU, layers, pages int, chunk int64) (Layout, [][]byte) {
	t.Helper()
	l := Layout{ChunkBytes: chunk}
	var raw [][]byte
	for i := range 2 * layers {
		buf, err := eng.Alloc(int64(pages) * chunk)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { buf.Free() })
		b, _ := eng.Bytes(buf)
		for j := range b {
			b[j] = byte(i*37 + j*11 + j>>8)
		}
		raw = append(raw, b)
		l.Chunks = append(l.Chunks, kernels.Span{Buf: buf})
	}
	return l, raw
}

// TestLayerLoad stores pages of a 3-layer K/V pool, then loads them into
// other pages a layer at a time: after each call the layers so far have
// landed and none past the one queued ahead, the entries stay pinned
// until Close, and every way of misusing a load is refused.
func TestLayerLoad(t *testing.T) {
	const layers, pages, chunk = 3, 8, 256
	r, c := testTier(t, 1)
	s := testStore(t, c, 16, 2*layers*chunk)
	eng := kernels.NewCPU(2)
	defer eng.Close()
	l, raw := layeredPool(t, eng, layers, pages, chunk)
	m, err := NewMover(s, eng, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	keys := []Key{keyN(1), keyN(2)}
	if st, err := m.Put(keys, l, []int64{0, 1}); err != nil || st[0] != Reserved || st[1] != Reserved {
		t.Fatalf("Put = %v, %v", st, err)
	}
	page := func(buf int, p int64) []byte { return raw[buf][p*chunk : (p+1)*chunk] }
	ld, err := m.StartLoad(keys, l, 2, []int64{5, 6})
	if err != nil || ld.Pages() != 2 {
		t.Fatalf("StartLoad = %v, %v", ld, err)
	}
	if n, err := s.Delete(keys); n != 0 || !errors.Is(err, ErrPinned) {
		t.Fatalf("delete of entries being loaded = %d, %v; want ErrPinned", n, err)
	}
	if err := ld.Layer(1); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("layer 1 first: %v", err)
	}
	for layer := range layers {
		if err := ld.Layer(layer); err != nil {
			t.Fatalf("layer %d: %v", layer, err)
		}
		for buf := range 2 * layers {
			landed := bytes.Equal(page(buf, 5), page(buf, 0)) && bytes.Equal(page(buf, 6), page(buf, 1))
			if buf/2 <= layer && !landed || buf/2 > layer+1 && landed {
				t.Fatalf("after layer %d, buffer %d landed = %v", layer, buf, landed)
			}
		}
	}
	if err := ld.Close(); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Delete(keys[:1]); n != 1 || err != nil {
		t.Fatalf("delete after Close = %d, %v", n, err)
	}

	// A key that is gone fails the start with no pin kept.
	if _, err := m.StartLoad([]Key{keys[1], keys[0]}, l, 2, []int64{2, 3}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("load with a missing page: %v", err)
	}
	if _, err := m.StartLoad(keys[1:], l, 4, []int64{2}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("4 chunks a layer of 6: %v", err)
	}
	early, err := m.StartLoad(keys[1:], l, 2, []int64{2})
	if err != nil {
		t.Fatal(err)
	}
	if err := early.Layer(0); err != nil {
		t.Fatal(err)
	}
	if err := early.Close(); !errors.Is(err, ErrIncomplete) {
		t.Fatalf("close after 1 of 3 layers: %v", err)
	}

	// A page past the pool: the first layer fails, and the pins go then,
	// not when the caller gets round to Close. A negative page never starts.
	if _, err := m.StartLoad(keys[1:], l, 2, []int64{-1}); !errors.Is(err, ErrBadConfig) {
		t.Fatalf("load into page -1: %v", err)
	}
	past, err := m.StartLoad(keys[1:], l, 2, []int64{pages})
	if err != nil {
		t.Fatal(err)
	}
	if err := past.Layer(0); err == nil {
		t.Fatal("a load into a page past the pool landed")
	}
	if held := s.Stats().PinsHeld; held != 0 {
		t.Fatalf("%d pins held after the load failed", held)
	}
	if err := past.Close(); err == nil {
		t.Fatal("Close of a failed load reported no failure")
	}

	// Damage in the last layer of a page: the load fails at that layer and
	// the entry is dropped.
	hits, _ := s.Lookup(keys[1:])
	s.Release(hits)
	last := hits[0].Offset + tier.Offset(2*layers*chunk-3)
	var b [1]byte
	if err := r.ReadAt(b[:], last); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x40
	if err := r.WriteAt(b[:], last); err != nil {
		t.Fatal(err)
	}
	bad, err := m.StartLoad(keys[1:], l, 2, []int64{7})
	if err != nil {
		t.Fatal(err)
	}
	for layer := range layers - 1 {
		if err := bad.Layer(layer); err != nil {
			t.Fatalf("layer %d of the damaged page: %v", layer, err)
		}
	}
	if err := bad.Layer(layers - 1); !errors.Is(err, ErrChecksum) {
		t.Fatalf("last layer of a damaged page: %v", err)
	}
	if err := bad.Close(); !errors.Is(err, ErrChecksum) {
		t.Fatalf("close of a damaged load: %v", err)
	}
	if n := s.Exists(keys[1:]); n != 0 {
		t.Fatal("the damaged entry is still there")
	}
	mustCheck(t, s)
}

// TestGetAll lands every page whole or none: a batch with a key that is
// not there fails before anything is copied, with no pin kept; a damaged
// page fails it with ErrChecksum and is dropped, the others stay.
func TestGetAll(t *testing.T) {
	const layers, pages, chunk = 3, 8, 256
	r, c := testTier(t, 1)
	s := testStore(t, c, 16, 2*layers*chunk)
	eng := kernels.NewCPU(2)
	defer eng.Close()
	l, raw := layeredPool(t, eng, layers, pages, chunk)
	m, err := NewMover(s, eng, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	keys := []Key{keyN(1), keyN(2)}
	if _, err := m.Put(keys, l, []int64{0, 1}); err != nil {
		t.Fatal(err)
	}
	page := func(buf int, p int64) []byte { return raw[buf][p*chunk : (p+1)*chunk] }
	if err := m.GetAll(keys, l, []int64{5, 6}); err != nil {
		t.Fatal(err)
	}
	for buf := range 2 * layers {
		if !bytes.Equal(page(buf, 5), page(buf, 0)) || !bytes.Equal(page(buf, 6), page(buf, 1)) {
			t.Fatalf("buffer %d: the pages did not land", buf)
		}
	}
	before := bytes.Clone(page(0, 7))
	if err := m.GetAll([]Key{keys[0], keyN(9)}, l, []int64{7, 4}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a batch with a missing page: %v", err)
	}
	if !bytes.Equal(page(0, 7), before) {
		t.Fatal("a batch with a missing page copied some")
	}
	if held := s.Stats().PinsHeld; held != 0 {
		t.Fatalf("%d pins held after a refused get", held)
	}
	hits, _ := s.Lookup(keys[1:])
	s.Release(hits)
	at := hits[0].Offset + tier.Offset(chunk+5)
	var b [1]byte
	if err := r.ReadAt(b[:], at); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0x02
	if err := r.WriteAt(b[:], at); err != nil {
		t.Fatal(err)
	}
	if err := m.GetAll(keys, l, []int64{2, 3}); !errors.Is(err, ErrChecksum) {
		t.Fatalf("a batch with a damaged page: %v", err)
	}
	if n := s.Exists(keys); n != 1 {
		t.Fatalf("%d of the batch still there; want the first (the damaged second dropped)", n)
	}
	mustCheck(t, s)
}

// TestReapedMoverDoesNotScatter: a client reaped between Put's reserve and
// its scatter (stalled past the lease timeout) writes nothing into the
// blocks, which may be another's by then. The linker's write path (Put)
// had no lease check at all.
func TestReapedMoverDoesNotScatter(t *testing.T) {
	r, c := testTier(t, 1)
	testStore(t, c, 4, 1024)
	z, sz := stalledClient(t, r)
	eng := kernels.NewCPU(1)
	defer eng.Close()
	buf, err := eng.Alloc(1024)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	raw, _ := eng.Bytes(buf)
	for i := range raw {
		raw[i] = 0xAB
	}
	m, err := NewMover(sz, eng, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	m.afterReserve = func() { reapUntilFenced(t, r, z) }
	_, err = m.Put([]Key{keyN(1)}, Layout{ChunkBytes: 1024, Chunks: []kernels.Span{{Buf: buf}}}, []int64{0})
	if !errors.Is(err, tier.ErrLeaseLost) {
		t.Fatalf("put by a reaped client: %v, want ErrLeaseLost", err)
	}
	got := make([]byte, sz.g.Blocks*sz.g.BlockStride) // every block of the index
	if err := r.ReadAt(got, tier.Offset(sz.g.PayloadOff)); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(got, bytes.Repeat([]byte{0xAB}, 64)) {
		t.Error("the reaped client's page reached a block")
	}
}
