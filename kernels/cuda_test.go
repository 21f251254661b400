//go:build cuda

package kernels

import (
	"errors"
	"testing"
)

// The CUDA engine joins every engine test, unpaced and paced. Without a device, or with a
// driver that fails, the tests skip (scripts/cuda-nodriver-check runs this
// binary so in CI); without libcuda.so.1 at all the binary cannot load.
func init() {
	engineMakers = append(engineMakers, struct {
		name string
		make func(t testing.TB) Engine
	}{"cuda", func(t testing.TB) Engine { return newTestCUDA(t) }})
	// And paced, a page a piece: every block call as many kernels, two of
	// them queued at a time, the stage ring reused under them.
	engineMakers = append(engineMakers, struct {
		name string
		make func(t testing.TB) Engine
	}{"cuda-paced", func(t testing.TB) Engine {
		e := newTestCUDA(t)
		e.SetPacer(&countingPacer{}, 1)
		return e
	}})
}

// newTestCUDA starts a CUDA engine, or skips the test without a device.
func newTestCUDA(t testing.TB) *CUDA {
	t.Helper()
	e, err := NewCUDA(CUDAOptions{})
	if errors.Is(err, ErrNoDevice) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return e.(*CUDA)
}

func TestCUDAWrapDevice(t *testing.T) {
	e := newTestCUDA(t)
	defer e.Close()
	buf, err := e.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	w, err := e.WrapDevice(uintptr(buf.(*deviceBuffer).ptr)+1024, 1024)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("written through a wrapped pointer")
	if err := e.Upload(w, 10, want); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if err := e.Download(got, buf, 1034); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("got %q", got)
	}
	if err := w.Free(); err != nil {
		t.Fatal(err)
	}
}

// TestUnregisterClearsDeviceBase: after Unregister the device's base table
// holds 0 for the id, so a kernel resolving a stale Addr finds no memory
// rather than the address of memory no longer pinned. Unregister used to
// leave the old base on the device.
func TestUnregisterClearsDeviceBase(t *testing.T) {
	e := newTestCUDA(t)
	defer e.Close()
	id, err := e.Register(make([]byte, 1<<16))
	if err != nil {
		t.Fatal(err)
	}
	base := func() uint64 {
		var b [8]byte
		if _, err := e.Run(func(l Launch) error { return l.Read(b[:], l.Bases()+8*uint64(id)) }); err != nil {
			t.Fatal(err)
		}
		return uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 | uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
	}
	if base() == 0 {
		t.Fatal("a registered range has no base on the device")
	}
	if err := e.Unregister(id); err != nil {
		t.Fatal(err)
	}
	if b := base(); b != 0 {
		t.Fatalf("the device still holds base %#x for unregistered range %d", b, id)
	}
}
