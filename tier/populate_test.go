package tier

import (
	"errors"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// threadFaults counts the minor faults of the calling thread while fn runs.
func threadFaults(t *testing.T, fn func()) int64 {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before, after unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &before); err != nil {
		t.Fatal(err)
	}
	fn()
	if err := unix.Getrusage(unix.RUSAGE_THREAD, &after); err != nil {
		t.Fatal(err)
	}
	return after.Minflt - before.Minflt
}

// writeEachPage stores a zero into every 4 KiB page of the data area
// (a fresh test tier's, which nothing uses).
func writeEachPage(r *Region) int {
	data := r.Device(0)[r.DataStart():]
	n := 0
	for i := 0; i < len(data); i += 4096 {
		data[i] = 0
		n++
	}
	return n
}

// A process that populated the tier writes each page without a fault;
// one that did not faults on about every page (shm: 4 KiB pages; write
// faults are not batched as read faults are).
func TestPopulateTakesTheFaultsUpFront(t *testing.T) {
	cold := formatTest(t, testGeometry())
	var pages int
	coldFaults := threadFaults(t, func() { pages = writeEachPage(cold) })

	warm := formatTest(t, testGeometry())
	n, err := warm.Populate()
	if err != nil {
		t.Fatalf("populate: %v", err)
	}
	if n != warm.Size() && n != int64(len(warm.Device(0))) {
		t.Fatalf("populate covered %d bytes of a %d-byte tier", n, warm.Size())
	}
	warmFaults := threadFaults(t, func() { writeEachPage(warm) })
	t.Logf("%d pages: %d faults cold, %d after Populate", pages, coldFaults, warmFaults)
	if coldFaults < int64(pages)/2 {
		t.Skipf("writing %d cold pages took only %d faults: this machine maps them in larger pages", pages, coldFaults)
	}
	if warmFaults > int64(pages)/16 {
		t.Fatalf("after Populate, %d pages took %d faults (cold: %d)", pages, warmFaults, coldFaults)
	}
}

func TestPopulateAfterCloseFails(t *testing.T) {
	r := formatTest(t, testGeometry())
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Populate(); !errors.Is(err, ErrClosed) {
		t.Fatalf("populate of a closed region: %v, want ErrClosed", err)
	}
}
