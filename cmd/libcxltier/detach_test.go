package main

import (
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/cxltier/cxltier/cluster"
	"github.com/cxltier/cxltier/prefix"
)

// TestDetachWithAnOpenLoad: detaching a tier while a KV pool on it has a
// layer-wise load open closes the load, the pool and the index and returns.
// It hung in about half the runs: detach held the handle table's lock while
// it closed the children, and the pool's close took that lock again to close
// its loads (which one came first depended on map order).
func TestDetachWithAnOpenLoad(t *testing.T) {
	runs := 100
	if testing.Short() {
		runs = 20
	}
	for run := range runs {
		h := attachTest(t)
		ix, err := prefixOpen(h, "m", "", 16, 4096)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 4*4096)
		for i := range buf {
			buf[i] = byte(i * 7)
		}
		sp := kvPoolSpec{ptrs: []unsafe.Pointer{unsafe.Pointer(&buf[0])}, lens: []int64{int64(len(buf))}, perLayer: 1,
			chunkBytes: 4096, pageStride: 4096, where: onHost}
		p, err := openKVPool(ix, "cpu", 0, sp, true)
		if err != nil {
			t.Fatal(err)
		}
		keys := []prefix.Key{prefix.StringKey("a"), prefix.StringKey("b")}
		if _, err := p.mover.Put(keys, p.layout, []int64{0, 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.startLoad(keys, []int64{2, 3}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- detach(h) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("run %d: detach: %v", run, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("run %d: detach with an open load hung", run)
		}
		for _, o := range []uint64{h, ix, p.handle} {
			if _, err := get[any](&handles, o); err == nil {
				t.Fatalf("run %d: handle %d still in the table after detach", run, o)
			}
		}
		runtime.KeepAlive(buf)
	}
}

// TestDetachWaitsForAViewsHold: a hold a caller keeps across a view's life
// (cxl_tier_hold) keeps the tier attached and mapped: a detach waits for
// it and goes on once it is given back.
func TestDetachWaitsForAViewsHold(t *testing.T) {
	h := attachTest(t)
	id, err := tierHold(h)
	if err != nil {
		t.Fatal(err)
	}
	if err := tierRelease(h); err == nil {
		t.Fatal("releasing the tier's own handle as a hold: no error")
	}
	done := make(chan error, 1)
	go func() { done <- detach(h) }()
	select {
	case err := <-done:
		t.Fatalf("detach returned while a view's hold was kept: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := tierRelease(id); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("detach after the hold went: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("detach still waiting after the hold was given back")
	}
	if err := tierRelease(id); err == nil {
		t.Fatal("a hold released twice: no error")
	}
}

// TestAddressesStayUnderHolds: every call that hands out tier addresses
// (the mappings, pins, a fill's blocks) hands them out under a hold that
// its handle keeps: a detach waits for each until it is given back, and
// then goes on. (They were plain integers, held only for the call: the
// uplink's transfer engine read the unmapped tier after a detach.)
func TestAddressesStayUnderHolds(t *testing.T) {
	for _, tc := range []struct {
		name string
		take func(t *testing.T, h, ix uint64) (release func() error)
	}{
		{"mappings", func(t *testing.T, h, _ uint64) func() error {
			maps, id, err := mappings(h)
			if err != nil || len(maps) != 1 || len(maps[0]) == 0 {
				t.Fatalf("mappings: %v, %d", err, len(maps))
			}
			return func() error { return tierRelease(id) }
		}},
		{"pins", func(t *testing.T, _, ix uint64) func() error {
			s, err := get[*index](&handles, ix)
			if err != nil {
				t.Fatal(err)
			}
			k := []prefix.Key{prefix.StringKey("a")}
			if _, err := s.Set(k, [][]byte{make([]byte, 100)}); err != nil {
				t.Fatal(err)
			}
			o := pinOut{addrs: make([]unsafe.Pointer, 1), lens: make([]int64, 1), trailers: make([]byte, cluster.TrailerBytes),
				inplace: make([]int8, 1), present: make([]int8, 1)}
			id, err := pinKeys(s, k, o)
			if err != nil || o.present[0] != 1 || o.inplace[0] != 1 {
				t.Fatalf("pin: %v, present %d, trailer in place %d", err, o.present[0], o.inplace[0])
			}
			p, _ := get[*pinned](&handles, id)
			return func() error { return handles.closeChild(id, p.child) }
		}},
		{"fill", func(t *testing.T, _, ix uint64) func() error {
			s, err := get[*index](&handles, ix)
			if err != nil {
				t.Fatal(err)
			}
			id, st, err := fillBegin(s, []prefix.Key{prefix.StringKey("b")}, []int64{100})
			if err != nil || st[0] != prefix.Reserved {
				t.Fatalf("fill: %v, %v", err, st)
			}
			fl, _ := get[*filling](&handles, id)
			return func() error { return handles.closeChild(id, fl.child) }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := attachTest(t)
			ix, err := prefixOpen(h, "m", "", 16, 4096)
			if err != nil {
				t.Fatal(err)
			}
			release := tc.take(t, h, ix)
			done := make(chan error, 1)
			go func() { done <- detach(h) }()
			select {
			case err := <-done:
				t.Fatalf("detach returned while the %s' addresses were out: %v", tc.name, err)
			case <-time.After(300 * time.Millisecond):
			}
			if err := release(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("detach once the %s were given back: %v", tc.name, err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("detach still waiting after the %s were given back", tc.name)
			}
		})
	}
}
