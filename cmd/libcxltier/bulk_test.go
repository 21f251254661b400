package main

import (
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/cxltier/cxltier/kernels"
)

// TestAJoinedTiersStoresAreLowered: joining the link lowers the threads of
// the tier's CPU engines that copy its KV pools' stores, those open and
// those opened later, unless cxl_tier_bulk_priority chose first; the
// choice holds either way.
func TestAJoinedTiersStoresAreLowered(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("threads are lowered on Linux")
	}
	openPool := func(t *testing.T, h uint64, name string) {
		t.Helper()
		ix, err := prefixOpen(h, name, "", 16, 64<<10)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 2*64<<10)
		t.Cleanup(func() { runtime.KeepAlive(buf) })
		sp := kvPoolSpec{ptrs: []unsafe.Pointer{unsafe.Pointer(&buf[0])}, lens: []int64{int64(len(buf))}, perLayer: 1,
			chunkBytes: 64 << 10, pageStride: 64 << 10, where: onHost}
		if _, err := openKVPool(ix, "cpu", 0, sp, true); err != nil {
			t.Fatal(err)
		}
	}
	report := func(t *testing.T, h uint64, wanted string, engines ...string) {
		t.Helper()
		a, err := tierOf(h)
		if err != nil {
			t.Fatal(err)
		}
		got := a.engines.bulkReport()
		if got.Wanted != wanted || !slices.Equal(got.Engines, engines) || got.Error != "" {
			t.Fatalf("bulk priority %+v, want %s with engines %v", got, wanted, engines)
		}
	}
	t.Run("joining lowers them", func(t *testing.T) {
		devices := formatTest(t)
		h, err := attach(devices, "a")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { detach(h) })
		openPool(t, h, "m")
		report(t, h, "normal", "normal")
		if _, err := joinArbiter(h, strictLink, 0); err != nil {
			t.Fatal(err)
		}
		report(t, h, "low", "low")
		openPool(t, h, "n") // the same engine
		report(t, h, "low", "low")
		a, _ := tierOf(h)
		if err := a.engines.setBulk(kernels.PriorityIdle); err != nil {
			t.Fatal(err)
		}
		report(t, h, "idle", "idle")
		if err := a.engines.setBulk(kernels.PriorityNormal); err != nil {
			t.Fatal(err)
		}
		report(t, h, "normal", "normal")
	})
	t.Run("a choice made before joining holds", func(t *testing.T) {
		devices := formatTest(t)
		h, err := attach(devices, "b")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { detach(h) })
		a, _ := tierOf(h)
		if err := a.engines.setBulk(kernels.PriorityNormal); err != nil {
			t.Fatal(err)
		}
		if _, err := joinArbiter(h, strictLink, 0); err != nil {
			t.Fatal(err)
		}
		openPool(t, h, "m")
		report(t, h, "normal", "normal")
	})
}
