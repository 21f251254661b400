package tier

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestRegionAfterClose: every method of a closed region returns ErrClosed
// or a zero value. They used to index the unmapped devices (a panic) or
// read the unmapped control area (a fault no recover catches).
func TestRegionAfterClose(t *testing.T) {
	r := formatTest(t, testGeometry(), fileBacking(t))
	c := attachTest(t, r, 0) // still attached when the region closes
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"AllocChunks": func() error { _, err := c.AllocChunks(1); return err }(),
		"Lock":        c.Lock(SystemLock),
		"Unlock":      c.Unlock(SystemLock),
		"DirPut":      c.DirPut(DirEntry{Name: "x", Kind: 1, Size: 1}),
		"Err":         c.Err(),
		"Close":       c.Close(),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("client %s after the region closed: %v", name, err)
		}
	}
	for name, err := range map[string]error{
		"Slice":     func() error { _, err := r.Slice(r.DataStart(), 8); return err }(),
		"ReadAt":    r.ReadAt(make([]byte, 8), r.DataStart()),
		"WriteAt":   r.WriteAt(make([]byte, 8), r.DataStart()),
		"Publish":   r.Publish(r.DataStart(), 8),
		"Refresh":   r.Refresh(r.DataStart(), 8),
		"DirLookup": func() error { _, err := r.DirLookup("x"); return err }(),
		"DirList":   func() error { _, err := r.DirList(); return err }(),
		"Attach":    func() error { _, err := r.Attach(ClientOptions{Name: "late"}); return err }(),
		"Close":     r.Close(),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v", name, err)
		}
	}
	if r.Leases() != nil || r.Locks() != nil || r.LeaseLive(1) || r.Device(0) != nil || r.NumDevices() != 0 || c.LockBusy(SystemLock) {
		t.Error("a closed region still reports leases, locks or devices")
	}
	if u := r.Usage(); u != (Usage{}) {
		t.Errorf("usage of a closed region: %+v", u)
	}
	_ = r.Snapshot() // must not fault
	_ = r.Info()
}

// TestVerifySeesDamage: a header zeroed or changed under an open region is
// reported by Verify (the daemon's /healthz), which passes on a sound one.
func TestVerifySeesDamage(t *testing.T) {
	r := formatTest(t, testGeometry(), fileBacking(t))
	if err := r.Verify(); err != nil {
		t.Fatal(err)
	}
	saved := append([]byte(nil), r.devs[0].data[:headerLen]...)
	clear(r.devs[0].data[:8])
	if err := r.Verify(); !errors.Is(err, ErrBadMagic) {
		t.Fatalf("zeroed magic: %v", err)
	}
	copy(r.devs[0].data, saved)
	if err := r.Verify(); err != nil {
		t.Fatalf("restored: %v", err)
	}
}

// TestBackingNotFollowedNorForeign: a tier path that is a symbolic link is
// refused, by a format with Overwrite too (which used to follow it and cut
// the file it named); a region file another user owns is refused for
// writing, and allowed for reading.
func TestBackingNotFollowedNorForeign(t *testing.T) {
	dir := t.TempDir()
	victim := filepath.Join(dir, "victim")
	os.WriteFile(victim, []byte("precious"), 0o600)
	link := filepath.Join(dir, "tier")
	if err := os.Symlink(victim, link); err != nil {
		t.Fatal(err)
	}
	b, _ := ParseBacking("file:" + link)
	if _, err := Format(Options{Devices: []Backing{b}, Geometry: testGeometry(), Overwrite: true}); !errors.Is(err, ErrPermission) {
		t.Fatalf("format through a link: %v", err)
	}
	if got, _ := os.ReadFile(victim); string(got) != "precious" {
		t.Fatalf("the link's target was changed: %q", got)
	}
	if _, err := Open(Options{Devices: []Backing{b}}); !errors.Is(err, ErrPermission) {
		t.Fatalf("open through a link: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("not root: cannot make a file another user owns")
	}
	fb := fileBacking(t)
	r, err := Format(Options{Devices: []Backing{fb}, Geometry: testGeometry()})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	if err := os.Chown(fb.Path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Devices: []Backing{fb}}); !errors.Is(err, ErrPermission) {
		t.Fatalf("open a region another user owns: %v", err)
	}
	ro, err := Open(Options{Devices: []Backing{fb}, ReadOnly: true})
	if err != nil {
		t.Fatalf("read-only open of another user's region: %v", err)
	}
	ro.Close()
}
