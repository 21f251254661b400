package prefetch

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestLinesReturns: hints over any span return, leave memory as it was,
// and do not fault on memory that may not be read.
func TestLinesReturns(t *testing.T) {
	buf := make([]byte, 4096+63)
	for i := range buf {
		buf[i] = byte(i)
	}
	for _, tc := range []struct{ off, n int }{{0, 0}, {0, 1}, {1, 64}, {63, 2}, {5, 4096}, {0, len(buf)}} {
		Lines(&buf[tc.off], uintptr(tc.n))
	}
	Line(&buf[100])
	Words([]uint64{1, 2, 3})
	Words(nil)
	// A page no access is allowed to: the hint must not fault.
	none, err := unix.Mmap(-1, 0, 4096, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	Lines(&none[0], 4096)
	Line(&none[100])
	if err := unix.Munmap(none); err != nil {
		t.Fatal(err)
	}
	for i := range buf {
		if buf[i] != byte(i) {
			t.Fatalf("byte %d changed to %d", i, buf[i])
		}
	}
}
