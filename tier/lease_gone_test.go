package tier

import (
	"errors"
	"os/exec"
	"sync/atomic"
	"testing"
)

// TestLeaseGone: a lease names its client by slot and generation; the
// client is gone once it closed, once another client holds the slot, or
// (one host) once the process its lease names is proven gone; a live one
// is there; a slot outside the table is an error, not a panic.
func TestLeaseGone(t *testing.T) {
	r := formatTest(t, testGeometry())
	a := attachTest(t, r, 0)
	gone := func(slot int, gen uint32) bool {
		t.Helper()
		g, err := r.LeaseGone(slot, gen)
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	if gone(a.Slot(), a.Gen()) {
		t.Fatal("a live client reads as gone")
	}
	if !gone(a.Slot(), a.Gen()+1) {
		t.Fatal("another generation of a live slot reads as there")
	}
	for _, slot := range []int{-1, r.l.Nodes * r.l.ClientsPerNode, 1 << 30} {
		if _, err := r.LeaseGone(slot, 1); !errors.Is(err, ErrOutOfBounds) {
			t.Errorf("slot %d: %v, want ErrOutOfBounds", slot, err)
		}
	}

	// A process that ended without closing (killed): its lease still says
	// live, and names a pid that no longer runs.
	b := attachTest(t, r, 0)
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	line := r.leaseLine(b.Slot())
	atomic.StoreUint32(u32At(line, 8), uint32(exited.Process.Pid))
	atomic.StoreUint64(u64At(line, leaseStartAt), 0)
	if !gone(b.Slot(), b.Gen()) {
		t.Fatal("a lease whose process is gone reads as there")
	}

	slot, gen := a.Slot(), a.Gen()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if !gone(slot, gen) {
		t.Fatal("a closed client reads as there")
	}
	c := attachTest(t, r, 0) // may take the freed slot, with the next generation
	if c.Slot() == slot && !gone(slot, gen) {
		t.Fatal("the slot's next holder stands for the closed client")
	}
}
