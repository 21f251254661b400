package words

import (
	"strings"
	"testing"
)

func TestBounds(t *testing.T) {
	b := make([]uint64, 4) // Go memory stands in for a mapping: 8-aligned
	bytes := unsafeBytes(b)
	for _, tc := range []struct {
		size int
		off  int64
		ok   bool
	}{
		{4, 0, true}, {4, 28, true}, {4, 30, false}, {4, 32, false}, {4, -4, false}, {4, 2, false},
		{8, 0, true}, {8, 24, true}, {8, 28, false}, {8, 32, false}, {8, -8, false}, {8, 4, false},
		{8, 1<<63 - 8, false}, {4, 1<<63 - 4, false},
	} {
		got := func() (err any) {
			defer func() { err = recover() }()
			if tc.size == 4 {
				*U32At(bytes, tc.off) = 7
			} else {
				*U64At(bytes, tc.off) = 7
			}
			return nil
		}()
		if tc.ok != (got == nil) {
			t.Errorf("%d-byte word at %d: panic %v, want ok=%v", tc.size, tc.off, got, tc.ok)
		}
		if e, isErr := got.(error); got != nil && (!isErr || !strings.Contains(e.Error(), "outside or misaligned")) {
			t.Errorf("%d-byte word at %d: panic %v is not the words error", tc.size, tc.off, got)
		}
	}
	if b[3] != 7 {
		t.Errorf("the last word was not written: %#x", b[3])
	}
	if short := bytes[:3]; func() (p any) { defer func() { p = recover() }(); U32At(short, 0); return }() == nil {
		t.Error("a word in a 3-byte slice did not panic")
	}
}
