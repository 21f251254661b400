package procmaps

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		line string
		want Mapping
		err  bool
	}{
		{line: "7f0000000000-7f0000100000 rw-s 00001000 fd:01 1234 /var/lib/tier/dev0",
			want: Mapping{Start: 0x7f0000000000, End: 0x7f0000100000, Perms: "rw-s", Offset: 0x1000, Major: 0xfd, Minor: 1, Inode: 1234, Path: "/var/lib/tier/dev0"}},
		{line: "7f0000000000-7f0000100000 rw-s 00000000 00:1a 99   /dev/shm/a tier (deleted)",
			want: Mapping{Start: 0x7f0000000000, End: 0x7f0000100000, Perms: "rw-s", Major: 0, Minor: 0x1a, Inode: 99, Path: "/dev/shm/a tier", Deleted: true}},
		{line: "55d4c0000000-55d4c0021000 rw-p 00000000 00:00 0                          [heap]",
			want: Mapping{Start: 0x55d4c0000000, End: 0x55d4c0021000, Perms: "rw-p", Path: "[heap]"}},
		{line: "7f0000000000-7f0000100000 rw-p 00000000 00:00 0",
			want: Mapping{Start: 0x7f0000000000, End: 0x7f0000100000, Perms: "rw-p"}},
		{line: "7f0000000000-7f0000100000 rw-p 00000000 00:00", err: true},
		{line: "zz-7f0000100000 rw-p 00000000 00:00 0", err: true},
		{line: "7f0000100000-7f0000000000 rw-p 00000000 00:00 0", err: true}, // ends before it starts
		{line: "7f0000000000-7f0000100000 rw-p 00000000 0000 0", err: true},
		{line: "7f0000000000-7f0000100000 rw-p 00000000 00:00 x", err: true},
		{line: "", err: true},
	} {
		got, err := Parse([]byte(tc.line))
		if (err != nil) != tc.err || (err == nil && got != tc.want) {
			t.Errorf("%q: got %+v, %v; want %+v (error %v)", tc.line, got, err, tc.want, tc.err)
		}
	}
}

func TestEachRefusesADamagedList(t *testing.T) {
	list := "7f0000000000-7f0000100000 rw-p 00000000 00:00 0\nnot a line\n"
	n := 0
	err := Each(strings.NewReader(list), func(Mapping) bool { n++; return true })
	if err == nil || n != 1 {
		t.Fatalf("read %d mappings, error %v; want 1 and an error", n, err)
	}
}

// TestAtFindsARealMapping maps a real file and finds it, its inode and its
// device as stat gives them, in this process's own list.
func TestAtFindsARealMapping(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a file")
	if err := os.WriteFile(path, make([]byte, 1<<16), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, 1<<16, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	m, ok, err := At(uint64(uintptr(unsafe.Pointer(&mem[100]))))
	if err != nil || !ok {
		t.Fatalf("not found: %v", err)
	}
	if m.Path != path || m.Inode != st.Ino || m.Major != unix.Major(st.Dev) || m.Minor != unix.Minor(st.Dev) || !m.Shared() || !m.File() {
		t.Fatalf("found %+v; the file is %s, inode %d, device %d:%d", m, path, st.Ino, unix.Major(st.Dev), unix.Minor(st.Dev))
	}
	if _, ok, _ := At(0); ok {
		t.Fatal("address 0 is mapped")
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("7f0000000000-7f0000100000 rw-s 00000000 fd:01 1234 /a b (deleted)"))
	f.Add([]byte("0-1 r 0 0:0 0"))
	f.Fuzz(func(t *testing.T, line []byte) {
		m, err := Parse(line)
		if err != nil {
			return
		}
		if m.End < m.Start {
			t.Fatalf("%q: range %x-%x", line, m.Start, m.End)
		}
		if m.File() && !strings.HasPrefix(m.Path, "/") {
			t.Fatalf("%q: file path %q", line, m.Path)
		}
	})
}
