package tier

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestBackingParse(t *testing.T) {
	for _, tc := range []struct {
		spec string
		kind BackingKind
		path string
		bad  bool
	}{
		{"shm:cxl", BackingShm, "/dev/shm/cxl", false},
		{"file:/tmp/x", BackingFile, "/tmp/x", false},
		{"dax:/dev/dax0.0", BackingDax, "/dev/dax0.0", false},
		{"anon", BackingAnon, "", false},
		{"shm:", 0, "", true},
		{"shm:a/b", 0, "", true},
		{"shm:..", 0, "", true},
		{"anon:x", 0, "", true},
		{"file:", 0, "", true},
		{"nvme:/dev/x", 0, "", true},
		{"", 0, "", true},
	} {
		b, err := ParseBacking(tc.spec)
		if tc.bad {
			if !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("%q: err %v, want ErrInvalidConfig", tc.spec, err)
			}
			continue
		}
		if err != nil || b.Kind != tc.kind || b.Path != tc.path {
			t.Errorf("%q: got %+v, %v", tc.spec, b, err)
		}
		if b.String() != tc.spec {
			t.Errorf("%q: String() = %q", tc.spec, b.String())
		}
	}
}

func TestFormatOpenRoundTrip(t *testing.T) {
	for _, name := range []string{"shm", "file"} {
		t.Run(name, func(t *testing.T) {
			b := shmBacking(t)
			if name == "file" {
				b = fileBacking(t)
			}
			g := testGeometry()
			r := formatTest(t, g, b)
			info := r.Info()
			c := attachTest(t, r, 0)
			off, err := c.AllocChunks(1)
			if err != nil {
				t.Fatal(err)
			}
			if err := r.WriteAt([]byte("persisted"), off); err != nil {
				t.Fatal(err)
			}
			if err := c.ShareChunks(off, 1); err != nil {
				t.Fatal(err)
			}
			if err := c.DirPut(DirEntry{Name: "blob", Kind: 7, Offset: off, Size: 9}); err != nil {
				t.Fatal(err)
			}
			c.Close()
			r.Close()

			st, err := os.Stat(b.Path)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Errorf("backing mode %v, want 0600", st.Mode().Perm())
			}
			r2, err := Open(Options{Devices: []Backing{b}})
			if err != nil {
				t.Fatalf("reopen: %v", err)
			}
			defer r2.Close()
			if got := r2.Info(); got.UUID != info.UUID || got.Geometry != g || !got.Created.Equal(info.Created) {
				t.Errorf("reopened info %+v, formatted %+v", got, info)
			}
			e, err := r2.DirLookup("blob")
			if err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, e.Size)
			if err := r2.ReadAt(buf, e.Offset); err != nil || string(buf) != "persisted" {
				t.Errorf("after reopen read %q, %v", buf, err)
			}
			if u := r2.Usage(); u.UsedChunks != 1 || u.SharedChunks != 1 {
				t.Errorf("usage after reopen %+v, want the one shared chunk", u)
			}
		})
	}
}

func TestAnonBacking(t *testing.T) {
	r := formatTest(t, testGeometry(), Backing{Kind: BackingAnon})
	c := attachTest(t, r, 0)
	h := NewHeap(c)
	off, err := h.Alloc(100)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.WriteAt([]byte{1, 2, 3}, off); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Devices: []Backing{{Kind: BackingAnon}}}); !errors.Is(err, ErrNoBacking) {
		t.Errorf("reopen anon: %v, want ErrNoBacking", err)
	}
}

// corrupt formats a region, closes it, applies edit to the file and reopens.
func corrupt(t *testing.T, edit func(path string, data []byte) []byte, opts Options) error {
	t.Helper()
	b := fileBacking(t)
	r, err := Format(Options{Devices: []Backing{b}, Geometry: testGeometry()})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	data, err := os.ReadFile(b.Path)
	if err != nil {
		t.Fatal(err)
	}
	if data = edit(b.Path, data); data != nil {
		if err := os.WriteFile(b.Path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	opts.Devices = []Backing{b}
	r2, err := Open(opts)
	if err == nil {
		r2.Close()
	}
	return err
}

// resum recomputes the header checksum after an edit, so the edit is what
// gets detected rather than the checksum.
func resum(data []byte) []byte {
	binary.LittleEndian.PutUint32(data[headerLen-4:], crcOf(data[:headerLen-4]))
	return data
}

func TestOpenRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(string, []byte) []byte
		opts Options
		want error
	}{
		{"bad magic", func(_ string, d []byte) []byte { d[0] = 'X'; return d }, Options{}, ErrBadMagic},
		{"newer version", func(_ string, d []byte) []byte {
			binary.LittleEndian.PutUint32(d[8:], FormatVersion+1)
			return resum(d)
		}, Options{}, ErrVersion},
		{"bad checksum", func(_ string, d []byte) []byte { d[40] ^= 1; return d }, Options{}, ErrChecksum},
		{"inconsistent geometry", func(_ string, d []byte) []byte {
			binary.LittleEndian.PutUint64(d[56:], 3) // chunk count
			return resum(d)
		}, Options{}, ErrCorrupt},
		{"damaged area header", func(_ string, d []byte) []byte {
			l, _ := computeLayout(testGeometry())
			d[l.LockOff] ^= 0xff
			return d
		}, Options{}, ErrCorrupt},
		{"truncated below header", func(p string, _ []byte) []byte {
			if err := os.Truncate(p, 100); err != nil {
				t.Fatal(err)
			}
			return nil
		}, Options{}, ErrTruncated},
		{"truncated", func(p string, d []byte) []byte { return d[:len(d)-4096] }, Options{}, ErrTruncated},
		{"grown", func(p string, d []byte) []byte { return append(d, make([]byte, 4096)...) }, Options{}, ErrSizeMismatch},
		{"expected size differs", func(_ string, d []byte) []byte { return d }, Options{ExpectDeviceSize: 64 << 20}, ErrSizeMismatch},
		{"group writable", func(p string, _ []byte) []byte {
			if err := os.Chmod(p, 0o660); err != nil {
				t.Fatal(err)
			}
			return nil
		}, Options{}, ErrPermission},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := corrupt(t, tc.edit, tc.opts)
			if !errors.Is(err, tc.want) {
				t.Fatalf("open: %v, want %v", err, tc.want)
			}
			t.Logf("refused: %v", err)
		})
	}
}

func TestOpenMissingAndTooSmall(t *testing.T) {
	_, err := Open(Options{Devices: []Backing{{Kind: BackingShm, Path: "/dev/shm/cxltier-does-not-exist"}}})
	if !errors.Is(err, ErrNoBacking) {
		t.Errorf("missing: %v, want ErrNoBacking", err)
	}
	g := testGeometry()
	g.DeviceSize = 1 << 20 // control area rounds up to one stripe: nothing left
	_, err = Format(Options{Devices: []Backing{shmBacking(t)}, Geometry: g})
	if !errors.Is(err, ErrTooSmall) {
		t.Errorf("too small: %v, want ErrTooSmall", err)
	}
	b := shmBacking(t)
	formatTest(t, testGeometry(), b)
	if _, err := Format(Options{Devices: []Backing{b}, Geometry: testGeometry()}); !errors.Is(err, ErrExists) {
		t.Errorf("format over existing: %v, want ErrExists", err)
	}
}

func TestGeometryRefusals(t *testing.T) {
	for _, edit := range []func(*Geometry){
		func(g *Geometry) { g.ChunkSize = 3000 },
		func(g *Geometry) { g.Stripe = g.ChunkSize / 2 },
		func(g *Geometry) { g.Nodes = 0 },
		func(g *Geometry) { g.Nodes = maxNodes + 1 },
		func(g *Geometry) { g.LockSlots = 0 },
		func(g *Geometry) { g.DirEntries = 0 },
		func(g *Geometry) { g.ClientsPerNode = 0 },
		func(g *Geometry) { g.LeaseTimeout = time.Millisecond },
		func(g *Geometry) { g.DeviceSize = -1 },
	} {
		g := testGeometry()
		edit(&g)
		if _, err := computeLayout(g); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("geometry %+v: %v, want ErrInvalidConfig", g, err)
		}
	}
}

func TestStripedDevices(t *testing.T) {
	g := testGeometry()
	devs := []Backing{shmBacking(t), shmBacking(t), shmBacking(t)}
	r := formatTest(t, g, devs...)
	if r.NumDevices() != 3 {
		t.Fatalf("devices %d", r.NumDevices())
	}
	// Consecutive stripes land on consecutive devices.
	for s := int64(0); s < 6; s++ {
		off := r.DataStart() + Offset(s*g.Stripe)
		dev, devOff, contig, err := r.Locate(off)
		if err != nil {
			t.Fatal(err)
		}
		if dev != int(s%3) || devOff != r.l.ControlSize+(s/3)*g.Stripe || contig != g.Stripe {
			t.Errorf("stripe %d: dev %d off %d contig %d", s, dev, devOff, contig)
		}
	}
	// A write across a stripe boundary reads back whole; Slice refuses it.
	off := r.DataStart() + Offset(g.Stripe-4)
	if err := r.WriteAt([]byte("12345678"), off); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 8)
	if err := r.ReadAt(got, off); err != nil || string(got) != "12345678" {
		t.Errorf("read across stripe: %q %v", got, err)
	}
	if _, err := r.Slice(off, 8); !errors.Is(err, ErrNotContiguous) {
		t.Errorf("slice across stripe: %v, want ErrNotContiguous", err)
	}
	if _, err := r.Slice(Offset(r.Size()-4), 8); !errors.Is(err, ErrOutOfBounds) {
		t.Errorf("slice past end: %v, want ErrOutOfBounds", err)
	}
	r.Close()
	// Devices given in another order are refused.
	if _, err := Open(Options{Devices: []Backing{devs[1], devs[0], devs[2]}}); !errors.Is(err, ErrDeviceOrder) {
		t.Errorf("reordered devices: %v, want ErrDeviceOrder", err)
	}
	if _, err := Open(Options{Devices: devs[:2]}); !errors.Is(err, ErrDeviceOrder) {
		t.Errorf("missing device: %v, want ErrDeviceOrder", err)
	}
	r2, err := Open(Options{Devices: devs})
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	if err := r2.ReadAt(got, off); err != nil || string(got) != "12345678" {
		t.Errorf("striped data after reopen: %q %v", got, err)
	}
}

func TestReadOnlyOpen(t *testing.T) {
	b := shmBacking(t)
	r := formatTest(t, testGeometry(), b)
	r.Close()
	ro, err := Open(Options{Devices: []Backing{b}, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := ro.Attach(ClientOptions{}); !errors.Is(err, ErrReadOnly) {
		t.Errorf("attach read-only: %v", err)
	}
	if err := ro.WriteAt([]byte{1}, ro.DataStart()); !errors.Is(err, ErrReadOnly) {
		t.Errorf("write read-only: %v", err)
	}
}

func TestProcStat(t *testing.T) {
	if _, ok := procStartTime(strconv.Itoa(os.Getpid())); !ok {
		t.Fatal("own process not alive")
	}
	for _, tc := range []struct {
		raw   string
		start uint64
		ok    bool
	}{
		{"1 (a b) S 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 777 9", 777, true},
		{"1 (x)) Z 0 1 1 0 -1 4194560 1 2 3 4 5 6 7 8 20 0 1 0 777 9", 0, false},
		{"1 (x) S 0", 0, false},
		{"garbage", 0, false},
	} {
		start, ok := parseProcStat([]byte(tc.raw))
		if start != tc.start || ok != tc.ok {
			t.Errorf("%q: %d %v", tc.raw, start, ok)
		}
	}
}

// A backing larger than its file system's free space is refused before
// anything is allocated, with both numbers in the message.
func TestFormatRefusesMoreThanFree(t *testing.T) {
	b := fileBacking(t)
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(b.Path), &st); err != nil {
		t.Skip(err)
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	g := testGeometry()
	g.DeviceSize = (free/g.Stripe + 16) * g.Stripe
	_, err := Format(Options{Devices: []Backing{b}, Geometry: g})
	if !errors.Is(err, ErrTooSmall) || !strings.Contains(err.Error(), "free") {
		t.Fatalf("format beyond the free space: %v", err)
	}
	if _, statErr := os.Stat(b.Path); !os.IsNotExist(statErr) {
		t.Fatalf("the refused backing was created: %v", statErr)
	}
}

// TestSmallTmpfsIsReportedNotASIGBUS: on a tmpfs too small for the tier (a
// container's 64 MiB /dev/shm), format says what to mount, and a tier file
// with unallocated pages that the file system has no room for is refused
// at open instead of killing whichever process first touches such a page.
func TestSmallTmpfsIsReportedNotASIGBUS(t *testing.T) {
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=40m"); err != nil {
		t.Skipf("cannot mount a tmpfs here (needs root): %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	g := testGeometry()
	g.DeviceSize = 64 << 20
	big, _ := ParseBacking("file:" + filepath.Join(dir, "big"))
	if _, err := Format(Options{Devices: []Backing{big}, Geometry: g}); !errors.Is(err, ErrTooSmall) || !strings.Contains(err.Error(), "--shm-size") {
		t.Fatalf("format of 64 MiB on a 40 MiB tmpfs: %v", err)
	}
	g.DeviceSize = 32 << 20
	b, _ := ParseBacking("file:" + filepath.Join(dir, "tier"))
	r, err := Format(Options{Devices: []Backing{b}, Geometry: g})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	f, err := os.OpenFile(b.Path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 16<<20, 16<<20)
	f.Close()
	if err != nil {
		t.Skipf("cannot punch a hole here: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, 20<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err := Open(Options{Devices: []Backing{b}}); err == nil {
		r.Close()
		t.Fatal("a tier whose missing pages do not fit opened")
	} else if !errors.Is(err, ErrTooSmall) || !strings.Contains(err.Error(), "SIGBUS") {
		t.Fatalf("open: %v", err)
	}
	os.Remove(filepath.Join(dir, "filler"))
	r, err = Open(Options{Devices: []Backing{b}})
	if err != nil {
		t.Fatalf("open once the missing pages fit: %v", err)
	}
	r.Close()
}
