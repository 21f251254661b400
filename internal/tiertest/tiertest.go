// Package tiertest makes small file-backed tiers for tests (and, built
// with the tag cuda, CUDA engines).
package tiertest

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cxltier/cxltier/tier"
)

// Format formats a tier of devices file-backed devices of deviceSize bytes
// each in t's temporary directory (chunk and stripe both chunk bytes, a
// 2 s lease timeout), attaches a client, and closes both when t ends.
func Format(t testing.TB, devices int, deviceSize, chunk int64) (*tier.Region, *tier.Client) {
	t.Helper()
	dir := t.TempDir()
	return format(t, devices, deviceSize, chunk, func(i int) string { return "file:" + filepath.Join(dir, fmt.Sprintf("dev%d", i)) })
}

// FormatAnon is Format with anonymous memory for devices: what a CUDA
// engine can page-lock where the test directory's file system cannot be.
func FormatAnon(t testing.TB, devices int, deviceSize, chunk int64) (*tier.Region, *tier.Client) {
	t.Helper()
	return format(t, devices, deviceSize, chunk, func(int) string { return "anon" })
}

func format(t testing.TB, devices int, deviceSize, chunk int64, backing func(int) string) (*tier.Region, *tier.Client) {
	t.Helper()
	var devs []tier.Backing
	for i := range devices {
		b, err := tier.ParseBacking(backing(i))
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, b)
	}
	g := tier.DefaultGeometry()
	g.DeviceSize, g.ChunkSize, g.Stripe = deviceSize, chunk, chunk
	g.ClientsPerNode = 16
	g.LeaseTimeout = 2 * time.Second
	r, err := tier.Format(tier.Options{Devices: devs, Geometry: g})
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.Attach(tier.ClientOptions{Name: "test"})
	if err != nil {
		r.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); r.Close() })
	return r, c
}

// Attach opens the tier on devices, comma-separated specs as a test hands
// them to a child process it starts, and attaches a client called name:
// the child's side of a multi-process test.
func Attach(devices, name string) (*tier.Client, error) {
	var devs []tier.Backing
	for _, s := range strings.Split(devices, ",") {
		b, err := tier.ParseBacking(s)
		if err != nil {
			return nil, err
		}
		devs = append(devs, b)
	}
	r, err := tier.Open(tier.Options{Devices: devs})
	if err != nil {
		return nil, err
	}
	c, err := r.Attach(tier.ClientOptions{Name: name})
	if err != nil {
		r.Close()
		return nil, err
	}
	return c, nil
}

// WaitProven waits until m holds the kernel's word for the live lease of
// pid (a child of the test, in the test's PID namespace), which it needs
// before it may end that process.
func WaitProven(t testing.TB, m *tier.Manager, pid int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		for _, p := range m.Proofs() {
			if p.PID == pid && m.Client().Region().LeaseLive(uint64(p.Gen)<<32|uint64(p.Slot+1)) {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the client of pid %d did not register with the daemon in 10 s", pid)
		}
	}
}
