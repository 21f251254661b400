package tier

import (
	"fmt"
	"io/fs"
	"syscall"
	"testing"
)

// TestProcGoneNeedsProof: only a missing /proc entry, a zombie or another
// start time prove a client's process gone. A read that failed otherwise
// (the reaper out of file descriptors under load) once had a live client
// reaped within milliseconds of attaching, its memory free for others.
func TestProcGoneNeedsProof(t *testing.T) {
	stat := func(state string, start int) []byte {
		return []byte(fmt.Sprintf("42 (a (b) c) %s 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 %d 20 21", state, start))
	}
	for _, c := range []struct {
		name  string
		raw   []byte
		err   error
		start uint64
		gone  bool
	}{
		{"running, same start", stat("R", 777), nil, 777, false},
		{"running, start unrecorded", stat("S", 777), nil, 0, false},
		{"another process under the pid", stat("S", 778), nil, 777, true},
		{"zombie", stat("Z", 777), nil, 777, true},
		{"no /proc entry", nil, &fs.PathError{Op: "open", Path: "/proc/42/stat", Err: syscall.ENOENT}, 777, true},
		{"out of file descriptors", nil, &fs.PathError{Op: "open", Path: "/proc/42/stat", Err: syscall.EMFILE}, 777, false},
		{"interrupted", nil, &fs.PathError{Op: "read", Path: "/proc/42/stat", Err: syscall.EINTR}, 777, false},
		{"a stat this parser does not follow", []byte("garbage"), nil, 777, false},
	} {
		if got := procGone(c.raw, c.err, c.start); got != c.gone {
			t.Errorf("%s: gone = %v, want %v", c.name, got, c.gone)
		}
	}
}
