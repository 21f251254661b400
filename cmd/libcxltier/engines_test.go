package main

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/topk"
)

// TestOneEnginePerTier: a top-k pool, an Engram prefetcher and a prefix
// mover opened on one tier in one process share one engine, with the tier
// registered once; the engine goes when the last of them closes. (On a
// CUDA engine a second registration of the same mapping is refused by the
// driver; on the CPU engine the test checks the sharing itself, where the
// row calls share one engine and the bulk copies another.)
func TestOneEnginePerTier(t *testing.T) {
	for _, kind := range engineKinds(t) {
		t.Run(kind, func(t *testing.T) { oneEnginePerTier(t, kind) })
	}
}

func oneEnginePerTier(t *testing.T, kind string) {
	dir := t.TempDir()
	devices := "file:" + filepath.Join(dir, "d0") + ",file:" + filepath.Join(dir, "d1")
	var devs []tier.Backing
	for _, d := range []string{"d0", "d1"} {
		b, err := tier.ParseBacking("file:" + filepath.Join(dir, d))
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, b)
	}
	geo := tier.DefaultGeometry()
	geo.DeviceSize, geo.ChunkSize, geo.Stripe = 16<<20, 256<<10, 256<<10
	r, err := tier.Format(tier.Options{Devices: devs, Geometry: geo})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	h, err := attach(devices, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer detach(h)
	a, _ := tierOf(h)

	pool, err := openTopk(h, kind, 0, topk.Config{Layers: 2, EntryBytes: 64, Slots: 64, TopK: 16, MaxRequests: 4})
	if err != nil {
		t.Fatal(err)
	}
	pf := engramOn(t, h, a, kind, engramCache, 0)
	store, err := prefix.Create(a.c, prefix.Config{Name: "p", Blocks: 8, BlockBytes: 4096, PinsPerClient: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	se, err := a.engines.acquire(kind, 0, a.r.NumDevices(), a.r.Device)
	if err != nil {
		t.Fatal(err)
	}
	mover, err := prefix.NewMover(store, se.eng, se.ids)
	if err != nil {
		t.Fatal(err)
	}
	// On the CPU the row calls get an engine of their own, so that a row
	// with a deadline never queues behind a bulk copy; a GPU's is shared.
	rowsApart := kind == "cpu"
	wantEngines, wantRefs := 1, 3
	if rowsApart {
		wantEngines, wantRefs = 2, 1
	}
	if n := a.engines.count(); n != wantEngines || pool.eng != pf.eng || (pf.eng == se.eng) == rowsApart || se.refs != wantRefs {
		t.Fatalf("%d engines, rows shared: %v, rows and bulk shared: %v, %d uses", n, pool.eng == pf.eng, pf.eng == se.eng, se.refs)
	}

	// Each works on the shared engine: a step, a prefetch, a block moved.
	if err := pool.Register(0, topk.Sequence{Layers: 2, EntryBytes: 64, Capacity: 32}); err != nil {
		t.Fatal(err)
	}
	if err := pool.Append(0, 0, make([]byte, 32*64)); err != nil {
		t.Fatal(err)
	}
	sel := []int32{0, 5, 31, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1}
	if _, err := pool.Resolve(0, []int{0}, []int64{32}, sel, make([]int32, 16)); err != nil {
		t.Fatal(err)
	}
	pd, err := pf.Prefetch(1, nil, [][]int64{{3, 4, 5}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pd.Wait(); err != nil {
		t.Fatal(err)
	}
	buf, err := se.eng.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	l := prefix.Layout{ChunkBytes: 4096, Chunks: []kernels.Span{{Buf: buf}}}
	keys := []prefix.Key{prefix.StringKey("k")}
	if _, err := mover.Put(keys, l, []int64{0}); err != nil {
		t.Fatal(err)
	}
	if n, err := mover.Get(keys, l, []int64{0}); err != nil || n != 1 {
		t.Fatalf("get: %d, %v", n, err)
	}

	for i, c := range []func() error{mover.Close, func() error { return a.engines.release(se) }, pool.shut, pf.shut} {
		left := wantEngines
		if rowsApart && i >= 2 {
			left = 1 // the bulk engine went with its last user
		}
		if a.engines.count() != left {
			t.Fatalf("%d engines after %d of 4 closed, want %d", a.engines.count(), i, left)
		}
		if err := c(); err != nil {
			t.Fatal(err)
		}
	}
	if a.engines.count() != 0 {
		t.Fatal("the engine outlived its last user")
	}
	// A tier's devices registered once: the range ids the engine handed
	// out are free again, so a new engine starts at 0.
	se2, err := a.engines.acquire(kind, 0, a.r.NumDevices(), a.r.Device)
	if err != nil {
		t.Fatal(err)
	}
	defer a.engines.release(se2)
	if se2 == se || se2.ids[0] != 0 || se2.ids[1] != 1 {
		t.Fatalf("a fresh engine got ranges %v", se2.ids)
	}
}

// engineKinds are the engines the test runs on: the CPU engine, the PTX
// interpreter standing in for a GPU, and CUDA in a cuda build on a machine
// with a device.
func engineKinds(t *testing.T) []string {
	kinds := []string{"cpu", "ptxsim:0"}
	if e, err := kernels.NewCUDA(kernels.CUDAOptions{}); err == nil {
		e.Close()
		kinds = append(kinds, "cuda")
	}
	return kinds
}

// fakeDevices stands in for the driver's answers: stream s belongs to
// device s/100; the calling thread's context is on device current (none
// if negative).
type fakeDevices struct{ current int }

func (f fakeDevices) StreamDevice(s uintptr) (int, error) { return int(s / 100), nil }
func (f fakeDevices) CurrentDevice() (int, bool)          { return f.current, f.current >= 0 }

// TestEngineResolvesTheCallersDevice: "cuda" means the device of the
// caller's stream, else of its thread's current context, else 0; "cuda:N"
// names one. Every TP rank of SGLang runs on its own GPU: an engine made on
// device 0 for all of them would copy into another GPU's context.
func TestEngineResolvesTheCallersDevice(t *testing.T) {
	cases := []struct {
		kind    string
		stream  uintptr
		current int
		want    engineKey
	}{
		{"cuda", 0, -1, engineKey{name: "cuda:0", stream: 0}},
		{"cuda", 0, 3, engineKey{name: "cuda:3", stream: 0}},
		{"cuda", 205, 3, engineKey{name: "cuda:2", stream: 205}},
		{"auto", 105, -1, engineKey{name: "cuda:1", stream: 105}},
		{"auto", 0, 5, engineKey{name: "cuda:5", stream: 0}},
		{"cuda:7", 105, 3, engineKey{name: "cuda:7", stream: 105}},
		{"ptxsim:4", 0, 3, engineKey{name: "ptxsim:4", stream: 0}},
		{"ptxsim", 9, 3, engineKey{name: "ptxsim:0", stream: 9}},
		{"cpu", 0, 3, engineKey{name: "cpu", stream: 0}},
	}
	for _, c := range cases {
		es := &engines{devices: fakeDevices{c.current}}
		spec, err := es.resolve(c.kind, c.stream)
		if err != nil || spec.key != c.want {
			t.Errorf("%s on stream %d (current device %d): %+v, %v; want %+v", c.kind, c.stream, c.current, spec.key, err, c.want)
		}
	}
	for _, bad := range []string{"gpu", "cuda:", "cuda:-1", "cuda:x", "cpu:1", "auto:2", ""} {
		if _, err := (&engines{}).resolve(bad, 0); !errors.Is(err, kernels.ErrBadRequest) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestEnginePerDevice: handles on two devices get an engine each, on the
// device they named; handles on one device and stream share one. The PTX
// interpreter stands in for the two GPUs.
func TestEnginePerDevice(t *testing.T) {
	devs := [][]byte{make([]byte, 1<<16), make([]byte, 1<<16)}
	mem := func(i int) []byte { return devs[i] }
	es := &engines{}
	var got []*sharedEngine
	for _, c := range []struct {
		kind   string
		stream uintptr
	}{{"ptxsim:0", 0}, {"ptxsim:1", 0}, {"ptxsim:1", 0}, {"ptxsim:1", 7}} {
		se, err := es.acquire(c.kind, c.stream, len(devs), mem)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, se)
	}
	if es.count() != 3 || got[1] != got[2] || got[0] == got[1] || got[3] == got[1] {
		t.Fatalf("%d engines for two devices and two streams on one", es.count())
	}
	for i, want := range []int{0, 1, 1, 1} {
		if d := got[i].eng.(*kernels.Sim).Device(); d != want {
			t.Errorf("handle %d runs on device %d, want %d", i, d, want)
		}
	}
	// Each engine moves rows on its own: a gather through device 1's
	// engine reads the tier it registered.
	copy(devs[1][64:], "row on device 1")
	eng := got[1].eng
	buf, err := eng.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	h, err := eng.Gather(kernels.Rows{RowBytes: 64, Tier: []kernels.Addr{kernels.At(got[1].ids[1], 64)}, Buf: buf})
	if err == nil {
		err = h.Wait()
	}
	if err != nil {
		t.Fatal(err)
	}
	row := make([]byte, 15)
	if err := eng.Download(row, buf, 0); err != nil || string(row) != "row on device 1" {
		t.Fatalf("gathered %q, %v", row, err)
	}
	buf.Free()
	for _, se := range got {
		if err := es.release(se); err != nil {
			t.Fatal(err)
		}
	}
	if es.count() != 0 {
		t.Fatal("engines outlived their handles")
	}
}
