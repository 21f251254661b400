package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/cxltier/cxltier/prefix"
)

func TestArgumentChecks(t *testing.T) {
	key := make([]byte, 64)
	if ks, err := keysAt(unsafe.Pointer(&key[0]), 2); err != nil || len(ks) != 2 {
		t.Fatalf("two keys: %v %v", ks, err)
	}
	for _, n := range []int64{-1, maxKeys + 1} {
		if _, err := keysAt(unsafe.Pointer(&key[0]), n); !errors.Is(err, errBadArg) {
			t.Errorf("%d keys: %v", n, err)
		}
	}
	if _, err := keysAt(nil, 1); !errors.Is(err, errBadArg) {
		t.Errorf("nil keys: %v", err)
	}
	if ks, err := keysAt(nil, 0); err != nil || ks != nil {
		t.Errorf("no keys: %v %v", ks, err)
	}

	buf := make([]byte, 10)
	ptrs := []unsafe.Pointer{unsafe.Pointer(&buf[0]), nil}
	for _, tc := range []struct {
		sizes []int64
		ok    bool
	}{
		{[]int64{10, 0}, true},
		{[]int64{-1, 0}, false},
		{[]int64{10, 5}, false}, // size with no pointer
		{[]int64{maxBuffer + 1, 0}, false},
	} {
		bs, err := buffersAt(unsafe.Pointer(&ptrs[0]), unsafe.Pointer(&tc.sizes[0]), 2)
		if tc.ok != (err == nil) || (tc.ok && (len(bs[0]) != 10 || len(bs[1]) != 0)) {
			t.Errorf("sizes %v: %v %v", tc.sizes, bs, err)
		}
	}
	if _, err := buffersAt(nil, nil, 1); !errors.Is(err, errBadArg) {
		t.Errorf("no buffer arrays: %v", err)
	}

	ids := []int64{1, 2, 3, 4, 5}
	lens := []int64{2, 0, 3}
	seqs, err := sequencesAt(unsafe.Pointer(&ids[0]), unsafe.Pointer(&lens[0]), 3)
	if err != nil || len(seqs) != 3 || len(seqs[0]) != 2 || len(seqs[1]) != 0 || seqs[2][2] != 5 {
		t.Fatalf("sequences %v %v", seqs, err)
	}
	for _, bad := range [][]int64{{-1}, {maxSeqIDs + 1}, {maxSeqIDs, 1}} {
		if _, err := sequencesAt(unsafe.Pointer(&ids[0]), unsafe.Pointer(&bad[0]), int64(len(bad))); !errors.Is(err, errBadArg) {
			t.Errorf("lens %v: %v", bad, err)
		}
	}
	if _, err := sequencesAt(nil, unsafe.Pointer(&lens[0]), 3); !errors.Is(err, errBadArg) {
		t.Errorf("lens without ids: %v", err)
	}
}

// FuzzSequences: lengths from the wire split a buffer of ids or are
// refused; the views never reach past the ids the lengths add up to.
func FuzzSequences(f *testing.F) {
	f.Add([]byte{2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0})
	f.Add([]byte{255, 255, 255, 255, 255, 255, 255, 255})
	f.Fuzz(func(t *testing.T, raw []byte) {
		var lens []int64
		var total int64
		for i := 0; i+8 <= len(raw) && len(lens) < 16; i += 8 {
			n := int64(binary.LittleEndian.Uint64(raw[i:]))
			if n >= 1<<16 && n <= maxSeqIDs {
				return // a length the check accepts but this test does not allocate for
			}
			lens = append(lens, n)
			if n > 0 && n < 1<<16 { // larger ones are refused before any read
				total += n
			}
		}
		if len(lens) == 0 {
			return
		}
		ids := make([]int64, total+1)
		seqs, err := sequencesAt(unsafe.Pointer(&ids[0]), unsafe.Pointer(&lens[0]), int64(len(lens)))
		if err != nil {
			return
		}
		var got int64
		for i, s := range seqs {
			if int64(len(s)) != lens[i] {
				t.Fatalf("sequence %d has %d ids, want %d", i, len(s), lens[i])
			}
			got += int64(len(s))
		}
		if got > total {
			t.Fatalf("%d ids viewed, %d given", got, total)
		}
	})
}

func TestStepArguments(t *testing.T) {
	lens := []int64{5, 6, 7}
	for _, tc := range []struct {
		name  string
		reqs  []int64
		batch int64
		ok    bool
	}{
		{"in range", []int64{0, 3, 1}, 3, true},
		{"request at the limit", []int64{0, 4, 1}, 3, false},
		{"negative request", []int64{-1, 0, 1}, 3, false},
		{"negative batch", []int64{0, 0, 0}, -1, false},
		{"batch beyond the pool", []int64{0, 0, 0}, 5, false},
		{"empty", []int64{0}, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, ls, err := stepAt(unsafe.Pointer(&tc.reqs[0]), unsafe.Pointer(&lens[0]), tc.batch, 4)
			if tc.ok != (err == nil) {
				t.Fatalf("got %v", err)
			}
			if err != nil && !errors.Is(err, errBadArg) {
				t.Fatalf("refused without errBadArg: %v", err)
			}
			if tc.ok && (int64(len(rs)) != tc.batch || int64(len(ls)) != tc.batch || (tc.batch > 0 && rs[1] != int(tc.reqs[1]))) {
				t.Fatalf("viewed %v %v", rs, ls)
			}
		})
	}
	if _, _, err := stepAt(nil, nil, 1, 4); !errors.Is(err, errBadArg) {
		t.Fatalf("no arrays: %v", err)
	}
}

func TestPiecesAndStrings(t *testing.T) {
	buf := make([]byte, 12)
	ptrs := []unsafe.Pointer{unsafe.Pointer(&buf[0]), unsafe.Pointer(&buf[4]), unsafe.Pointer(&buf[8]), unsafe.Pointer(&buf[10])}
	sizes := []int64{4, 4, 2, 2}
	ps, err := piecesAt(unsafe.Pointer(&ptrs[0]), unsafe.Pointer(&sizes[0]), 2, 2)
	if err != nil || len(ps) != 2 || len(ps[1]) != 2 || len(ps[1][0]) != 2 {
		t.Fatalf("2 keys of 2 pieces: %v %v", ps, err)
	}
	if cap(ps[0]) != 2 {
		t.Errorf("a key's pieces reach into the next key's (cap %d)", cap(ps[0]))
	}
	for _, tc := range []struct{ n, per int64 }{{-1, 1}, {1, 0}, {2, maxKeys}, {maxKeys, 2}} {
		if _, err := piecesAt(unsafe.Pointer(&ptrs[0]), unsafe.Pointer(&sizes[0]), tc.n, tc.per); !errors.Is(err, errBadArg) {
			t.Errorf("%d keys of %d pieces: %v", tc.n, tc.per, err)
		}
	}

	text := []byte("abcdefg")
	for _, tc := range []struct {
		ends []int64
		want []string
	}{
		{[]int64{3, 3, 7}, []string{"abc", "", "defg"}},
		{[]int64{4, 2}, nil},       // goes backwards
		{[]int64{-1}, nil},         // negative
		{[]int64{2, 1 << 41}, nil}, // past any buffer
	} {
		got, err := stringsAt(unsafe.Pointer(&text[0]), unsafe.Pointer(&tc.ends[0]), int64(len(tc.ends)))
		if tc.want == nil {
			if !errors.Is(err, errBadArg) {
				t.Errorf("ends %v: %v, want errBadArg", tc.ends, err)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Fatalf("ends %v: %q %v", tc.ends, got, err)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("ends %v: string %d = %q, want %q", tc.ends, i, got[i], tc.want[i])
			}
		}
	}
}

func TestJoinedStrings(t *testing.T) {
	for _, tc := range []struct {
		text string
		n    int64
		want []string // nil: refused
	}{
		{"ab\x00\x00cde", 3, []string{"ab", "", "cde"}},
		{"ab\x00cd\x00ef", 3, []string{"ab", "cd", "ef"}}, // of one length
		{"\x00abcd", 2, []string{"", "abcd"}},             // a length that divides, but not of one length
		{"abc", 1, []string{"abc"}},
		{"\x00", 2, []string{"", ""}},
		{"", 0, []string{}},
		{"ab\x00cd", 3, nil}, // too few strings
		{"ab\x00cd", 1, nil}, // a string holds a NUL
		{"x", 0, nil},        // bytes but no strings
		{"ab", -1, nil},
	} {
		var p unsafe.Pointer
		if len(tc.text) > 0 {
			p = unsafe.Pointer(unsafe.StringData(tc.text))
		}
		got, err := joinedAt(nil, p, int64(len(tc.text)), tc.n)
		if tc.want == nil {
			if !errors.Is(err, errBadArg) {
				t.Errorf("%q as %d strings: %q %v, want errBadArg", tc.text, tc.n, got, err)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Fatalf("%q as %d strings: %q %v", tc.text, tc.n, got, err)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Errorf("%q: string %d = %q, want %q", tc.text, i, got[i], tc.want[i])
			}
		}
	}
	if _, err := joinedAt(nil, nil, 5, 1); !errors.Is(err, errBadArg) {
		t.Errorf("5 bytes at nil: %v", err)
	}
}

// FuzzJoinedStrings: a NUL-joined text from the wire splits into exactly
// the strings asked for, which rejoin to the text, or is refused.
func FuzzJoinedStrings(f *testing.F) {
	f.Add([]byte("ab\x00cd"), int64(2))
	f.Add([]byte("\x00\x00"), int64(3))
	f.Add([]byte("ab\x00cd\x00ef"), int64(3))
	f.Fuzz(func(t *testing.T, text []byte, n int64) {
		var p unsafe.Pointer
		if len(text) > 0 {
			p = unsafe.Pointer(&text[0])
		}
		got, err := joinedAt(nil, p, int64(len(text)), n)
		if err != nil {
			return
		}
		if int64(len(got)) != n {
			t.Fatalf("%d strings, asked for %d", len(got), n)
		}
		if joined := strings.Join(got, "\x00"); joined != string(text) {
			t.Fatalf("rejoined %q, text %q", joined, text)
		}
	})
}

// BenchmarkJoined is the split of a HiCache batch's page strings (30k
// digests, NUL-joined) as the joined calls make it, of one length or not.
func BenchmarkJoined(b *testing.B) {
	for _, even := range []bool{true, false} {
		b.Run(fmt.Sprintf("even=%v", even), func(b *testing.B) {
			pages := make([]string, 30000)
			for i := range pages {
				pages[i] = prefix.StringKey(strconv.Itoa(i)).String()
			}
			if !even {
				pages[0] += "x"
			}
			text := strings.Join(pages, "\x00")
			for b.Loop() {
				err := withJoined(unsafe.Pointer(unsafe.StringData(text)), int64(len(text)), int64(len(pages)), func(got []string) error {
					if len(got) != len(pages) || got[1] != pages[1] {
						return fmt.Errorf("split %d strings", len(got))
					}
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
