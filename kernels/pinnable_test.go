package kernels

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

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
