package prefix

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// moverEngines are the engines the mover's checksum tests run on: the CPU
// engine, and the interpreter running the committed GPU kernels (the path
// a CUDA engine takes; not under -race, where the interpreter is too slow,
// and .ci/run runs this package once more without it).
func moverEngines(t testing.TB) map[string]func() kernels.Engine {
	m := map[string]func() kernels.Engine{
		"cpu": func() kernels.Engine { return kernels.NewCPU(2) },
		"cpu-background": func() kernels.Engine { // stores copied on threads at nice 19
			e := kernels.NewCPU(2)
			if err := e.SetBackground(kernels.PriorityLow); err != nil {
				t.Fatal(err)
			}
			return e
		},
	}
	if !raceEnabled {
		m["ptxsim"] = func() kernels.Engine {
			e, err := kernels.NewSim(kernels.SimOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return e
		}
	}
	return m
}

// enginePool is a paged pool of layers layers of K and V chunks in buffers
// of eng, pages pages each, filled with bytes that name buffer and place;
// it returns the layout and a way to read a chunk of a page back.
func enginePool(t testing.TB, eng kernels.Engine, layers, pages int, chunk int64) (Layout, func(buf int, page int64) []byte) {
	t.Helper()
	l := Layout{ChunkBytes: chunk}
	for i := range 2 * layers {
		buf, err := eng.Alloc(int64(pages) * chunk)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { buf.Free() })
		b := make([]byte, buf.Len())
		for j := range b {
			b[j] = byte(i*37 + j*11 + j>>8)
		}
		if err := eng.Upload(buf, 0, b); err != nil {
			t.Fatal(err)
		}
		l.Chunks = append(l.Chunks, kernels.Span{Buf: buf})
	}
	read := func(buf int, page int64) []byte {
		b := make([]byte, chunk)
		if err := eng.Download(b, l.Chunks[buf].Buf, page*chunk); err != nil {
			t.Fatal(err)
		}
		return b
	}
	return l, read
}

// TestMoverChecksumsOnEveryEngine: the checksums a Put records are the
// payloads' (the index's own check reads them again on the CPU), a Get
// and a layer-wise load serve what was stored, and a byte changed in the
// tier between a store and a load is caught by the load's own pass on
// every engine — the page is not served, its entry is dropped (and every
// other damaged page the launch read) and the pages before it are.
func TestMoverChecksumsOnEveryEngine(t *testing.T) {
	for name, mk := range moverEngines(t) {
		for _, chunk := range []int64{4096, 656} { // vectors in every lane, and a tail
			for _, first := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/chunk=%d/first-token=%v", name, chunk, first), func(t *testing.T) {
					testMoverChecksums(t, mk(), chunk, first)
				})
			}
		}
	}
}

// testMoverChecksums stores, loads and damages pages through a mover on
// eng; with first, on an engine paced in small pieces, with its loads as
// first-token transfers (Mover.FirstToken), which must check every page
// as the bulk path does.
func testMoverChecksums(t *testing.T, eng kernels.Engine, chunk int64, first bool) {
	const layers, pages = 2, 8
	r, c := testTier(t, 1)
	s := testStore(t, c, 16, 2*layers*chunk)
	defer eng.Close()
	l, read := enginePool(t, eng, layers, pages, chunk)
	m, err := NewMover(s, eng, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var bulk, loads turnCounter
	begun, ended := 0, 0 // the mover's calls are this goroutine's
	if first {
		eng.(kernels.Paced).SetPacer(&bulk, 3*chunk)
		m.FirstToken = func() (kernels.Pacer, func()) { begun++; return &loads, func() { ended++ } }
		defer func() {
			page := 2 * layers * chunk
			// Four pages stored; loads of 4, 4 (the engine moves every
			// page, damaged or not), then 2 pages a layer at a time.
			if bulk.bytes != 4*page || loads.bytes != 10*page || begun != 3 || ended != 3 {
				t.Errorf("bulk %d bytes, first-token %d bytes in %d transfers (%d ended); want %d, %d, 3, 3",
					bulk.bytes, loads.bytes, begun, ended, 4*page, 10*page)
			}
		}()
	}
	keys := keysN(4)
	if st, err := m.Put(keys, l, []int64{0, 1, 2, 3}); err != nil || st[3] != Reserved {
		t.Fatalf("Put = %v, %v", st, err)
	}
	mustCheck(t, s) // every stored checksum against its payload, on the CPU
	if n, err := m.Get(keys, l, []int64{4, 5, 6, 7}); n != 4 || err != nil {
		t.Fatalf("Get = %d, %v", n, err)
	}
	for buf := range 2 * layers {
		for p := range int64(4) {
			if !bytes.Equal(read(buf, 4+p), read(buf, p)) {
				t.Fatalf("buffer %d: page %d is not page %d's", buf, 4+p, p)
			}
		}
	}

	flip := func(k Key, at int64) {
		hits, err := s.Lookup([]Key{k})
		if err != nil || len(hits) != 1 {
			t.Fatalf("lookup %v: %v", k, err)
		}
		s.Release(hits)
		var b [1]byte
		off := hits[0].Offset + tier.Offset(at)
		if err := r.ReadAt(b[:], off); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0x08
		if err := r.WriteAt(b[:], off); err != nil {
			t.Fatal(err)
		}
	}
	flip(keys[2], chunk+17)           // in layer 0's V
	flip(keys[3], 2*layers*chunk-100) // and another page of the same launch
	n, err := m.Get(keys, l, []int64{4, 5, 6, 7})
	if n != 2 || !errors.Is(err, ErrChecksum) {
		t.Fatalf("Get past a damaged page = %d, %v; want 2, ErrChecksum", n, err)
	}
	if got := s.Exists(keys); got != 2 {
		t.Fatalf("after the damaged page was read, %d keys exist; want 2", got)
	}
	if got := s.Exists(keys[3:]); got != 0 {
		t.Fatal("the second damaged page the launch read is still in the index")
	}

	flip(keys[1], 2*layers*chunk-1) // the last byte of the last layer
	ld, err := m.StartLoad(keys[:2], l, 2, []int64{6, 7})
	if err != nil {
		t.Fatal(err)
	}
	for layer := range layers - 1 {
		if err := ld.Layer(layer); err != nil {
			t.Fatalf("layer %d: %v", layer, err)
		}
	}
	if err := ld.Layer(layers - 1); !errors.Is(err, ErrChecksum) {
		t.Fatalf("the last layer of a damaged page: %v", err)
	}
	if err := ld.Close(); !errors.Is(err, ErrChecksum) {
		t.Fatalf("close of a damaged load: %v", err)
	}
	if got := s.Exists(keys); got != 1 {
		t.Fatalf("after the damaged load, %d keys exist; want 1", got)
	}
	mustCheck(t, s)
}

// BenchmarkMover moves a batch of pages (16 layers of K and V, 32 KiB
// chunks: 1 MiB pages) through the mover on the CPU engine, each way and
// side by side with the engine's bare copy of the same blocks: the store
// and the verified load take their checksums from the copy, so they should
// cost what the bare copy does, and a verified load what an unverified
// one does. keyed/ does the same in an index with a tenant key, whose
// pages are signed (HMAC-SHA256) as stored and checked as loaded, Verify
// or not: what tenant isolation costs beside the unkeyed figures.
func BenchmarkMover(b *testing.B) {
	b.Run("unkeyed", func(b *testing.B) { benchMover(b, "") })
	b.Run("keyed", func(b *testing.B) { benchMover(b, "tenant") })
}

func benchMover(b *testing.B, key string) {
	const layers, pages, chunk = 16, 32, 32 << 10
	_, c := tiertest.FormatAnon(b, 1, 3*pages*2*layers*chunk, 4<<20)
	s, err := Create(c, Config{Name: "m", Blocks: 2 * pages, BlockBytes: 2 * layers * chunk, PinsPerClient: 256, Key: key})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	eng := kernels.NewCPU(0)
	defer eng.Close()
	l, _ := enginePool(b, eng, layers, 2*pages, chunk)
	m, err := NewMover(s, eng, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	keys := keysN(pages)
	src, dst := make([]int64, pages), make([]int64, pages)
	for i := range pages {
		src[i], dst[i] = int64(i), int64(pages+i)
	}
	if _, err := m.Put(keys, l, src); err != nil {
		b.Fatal(err)
	}
	hits, err := s.Lookup(keys)
	if err != nil || len(hits) != pages {
		b.Fatalf("lookup: %d, %v", len(hits), err)
	}
	bare := kernels.Blocks{ChunkBytes: chunk, Chunks: l.Chunks, Pages: dst}
	for _, h := range hits {
		a, err := m.addr(h.Offset)
		if err != nil {
			b.Fatal(err)
		}
		bare.Tier = append(bare.Tier, a)
	}
	s.Release(hits)
	load := func(b *testing.B) {
		ld, err := m.StartLoad(keys, l, 2, dst)
		if err != nil {
			b.Fatal(err)
		}
		for i := range layers {
			if err := ld.Layer(i); err != nil {
				b.Fatal(err)
			}
		}
		if err := ld.Close(); err != nil {
			b.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		run  func(b *testing.B)
	}{
		{"store", func(b *testing.B) {
			if n, err := s.Delete(keys); n != pages || err != nil {
				b.Fatalf("delete: %d, %v", n, err)
			}
			if _, err := m.Put(keys, l, src); err != nil {
				b.Fatal(err)
			}
		}},
		{"bare-scatter", func(b *testing.B) {
			if err := wait(eng.ScatterBlocks(kernels.Blocks{ChunkBytes: chunk, Chunks: l.Chunks, Pages: src, Tier: bare.Tier})); err != nil {
				b.Fatal(err)
			}
		}},
		{"load", func(b *testing.B) { m.Verify = true; load(b) }},
		{"load-unverified", func(b *testing.B) { m.Verify = false; load(b); m.Verify = true }},
		{"bare-gather", func(b *testing.B) {
			if err := wait(eng.GatherBlocks(bare)); err != nil {
				b.Fatal(err)
			}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				tc.run(b)
			}
			b.SetBytes(pages * 2 * layers * chunk)
		})
	}
}
