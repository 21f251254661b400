package kernels

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMapsLineFile(t *testing.T) {
	for _, tc := range []struct {
		line     string
		addr     uintptr
		path     string
		contains bool
	}{
		{"7f0000000000-7f0000100000 rw-s 00000000 fd:01 1234 /var/lib/tier/dev0", 0x7f0000000000, "/var/lib/tier/dev0", true},
		{"7f0000000000-7f0000100000 rw-s 00000000 fd:01 1234 /var/lib/tier/dev0", 0x7f00000fffff, "/var/lib/tier/dev0", true},
		{"7f0000000000-7f0000100000 rw-s 00000000 fd:01 1234 /var/lib/tier/dev0", 0x7f0000100000, "", false},
		{"7f0000000000-7f0000100000 rw-s 00000000 fd:01 1234 /var/lib/tier/dev0", 0x6fffffffffff, "", false},
		{"7f0000000000-7f0000100000 rw-s 00000000 00:1a 99   /dev/shm/a tier (deleted)", 0x7f0000000010, "/dev/shm/a tier", true},
		{"7f0000000000-7f0000100000 rw-p 00000000 00:00 0 ", 0x7f0000000010, "", true},
		{"7f0000000000-7f0000100000 rw-p 00000000 00:00 0 [heap]", 0x7f0000000010, "", true},
		{"7f0000000000-7f0000100000 rw-p", 0x7f0000000010, "", false},
		{"zz-7f0000100000 rw-p 00000000 00:00 0", 0x7f0000000010, "", false},
		{"", 0, "", false},
	} {
		path, ok := mapsLineFile([]byte(tc.line), tc.addr)
		if path != tc.path || ok != tc.contains {
			t.Errorf("%q at %#x: got (%q, %v), want (%q, %v)", tc.line, tc.addr, path, ok, tc.path, tc.contains)
		}
	}
}

func FuzzMapsLineFile(f *testing.F) {
	f.Add([]byte("7f0000000000-7f0000100000 rw-s 00000000 fd:01 1234 /a b"), uint64(0x7f0000000001))
	f.Add([]byte("0-1 r 0 0 0 /"), uint64(0))
	f.Fuzz(func(t *testing.T, line []byte, addr uint64) {
		path, _ := mapsLineFile(line, uintptr(addr))
		if path != "" && !strings.HasPrefix(path, "/") {
			t.Fatalf("path %q does not start at /", path)
		}
	})
}

// TestPinHintOfRealMappings maps real files and anonymous memory and holds
// the hint to the file system each lives on.
func TestPinHintOfRealMappings(t *testing.T) {
	anon, err := unix.Mmap(-1, 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(anon)
	if h := pinHint(anon); h != "" {
		t.Errorf("anonymous memory: hint %q", h)
	}
	dirs := []string{t.TempDir()}
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		d, err := os.MkdirTemp("/dev/shm", "cxltier-pinhint")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(d)
		dirs = append(dirs, d)
	}
	for _, dir := range dirs {
		var fs unix.Statfs_t
		if err := unix.Statfs(dir, &fs); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "dev 0")
		mem := mapFile(t, path, 1<<16)
		h := pinHint(mem)
		wantHint := fs.Type != 0x01021994 && fs.Type != 0x958458f6
		if wantHint != (h != "") {
			t.Errorf("%s (%s): hint %q", path, fsName(int64(fs.Type)), h)
		}
		if wantHint && (!strings.Contains(h, path) || !strings.Contains(h, "tmpfs")) {
			t.Errorf("hint %q does not name the file and what to use", h)
		}
		unix.Munmap(mem)
	}
}

func mapFile(t *testing.T, path string, n int) []byte {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(int64(n)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	return mem
}
