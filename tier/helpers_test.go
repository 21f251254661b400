package tier

import (
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

var shmSeq atomic.Int64

// testGeometry is small enough for CI: 32 MiB, 256 KiB chunks.
func testGeometry() Geometry {
	g := DefaultGeometry()
	g.DeviceSize = 32 << 20
	g.ChunkSize = 256 << 10
	g.Stripe = 1 << 20
	g.LeaseTimeout = 2 * time.Second
	return g
}

// shmBacking returns a fresh /dev/shm name removed when the test ends.
func shmBacking(t testing.TB) Backing {
	t.Helper()
	name := fmt.Sprintf("cxltier-test-%d-%d", os.Getpid(), shmSeq.Add(1))
	b, err := ParseBacking("shm:" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(b.Path) })
	return b
}

func fileBacking(t testing.TB) Backing {
	t.Helper()
	b, err := ParseBacking("file:" + filepath.Join(t.TempDir(), "region"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func formatTest(t testing.TB, g Geometry, devs ...Backing) *Region {
	t.Helper()
	if len(devs) == 0 {
		devs = []Backing{shmBacking(t)}
	}
	r, err := Format(Options{Devices: devs, Geometry: g})
	if err != nil {
		t.Fatalf("format: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func attachTest(t testing.TB, r *Region, node int) *Client {
	t.Helper()
	c, err := r.Attach(ClientOptions{Node: node, Name: "test"})
	if err != nil {
		t.Fatalf("attach: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
