package tokentrace

import (
	"encoding/binary"
	"errors"
	"slices"
	"testing"
)

func encode(docs ...[]uint32) []byte {
	var b []byte
	for _, d := range docs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(d)))
		for _, id := range d {
			b = binary.LittleEndian.AppendUint32(b, id)
		}
	}
	return b
}

func TestParse(t *testing.T) {
	tr, err := Parse(encode([]uint32{5, 6, 7}, []uint32{9}))
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Docs) != 2 || tr.Tokens != 4 || tr.MaxID != 9 || !slices.Equal(tr.Docs[0], []int64{5, 6, 7}) {
		t.Fatalf("%+v", tr)
	}
	for name, b := range map[string][]byte{
		"ragged":        encode([]uint32{1})[:6],
		"overlong":      binary.LittleEndian.AppendUint32(nil, 3),
		"empty doc":     encode([]uint32{}),
		"no docs":       nil,
		"huge length":   binary.LittleEndian.AppendUint32(nil, 1<<31),
		"short at tail": append(encode([]uint32{1, 2}), 2, 0, 0, 0, 7, 0, 0, 0),
	} {
		if _, err := Parse(b); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestReplay: requests decode their documents in order with histories
// from their own document, take the next document when done, and the
// replay ends when one has none left.
func TestReplay(t *testing.T) {
	tr, _ := Parse(encode([]uint32{1, 2, 3}, []uint32{10, 11}, []uint32{20}, []uint32{30, 31, 32, 33}))
	r, err := NewReplay(tr, 2, 2)
	if err != nil {
		t.Fatal(err)
	}
	type step struct {
		hist [][]int64
		ids  []int64
	}
	want := []step{
		{[][]int64{{}, {}}, []int64{1, 10}},
		{[][]int64{{1}, {10}}, []int64{2, 11}},
		{[][]int64{{1, 2}, {}}, []int64{3, 20}}, // request 1 took document 2
	}
	for i, w := range want {
		hist, ids, ok := r.Step()
		if !ok {
			t.Fatalf("step %d ended the replay", i)
		}
		for b := range ids {
			if ids[b][0] != w.ids[b] || !slices.Equal(hist[b], w.hist[b]) {
				t.Fatalf("step %d request %d: history %v id %d, want %v %d", i, b, hist[b], ids[b][0], w.hist[b], w.ids[b])
			}
		}
	}
	// Request 0 takes document 3; request 1 has none left.
	if _, _, ok := r.Step(); ok {
		t.Fatal("a replay went on with a request out of documents")
	}
	if n := tr.Steps(2); n != 3 {
		t.Fatalf("Steps(2) = %d, want 3", n)
	}
	if _, err := NewReplay(tr, 5, 0); err == nil {
		t.Fatal("a batch larger than the trace's documents was accepted")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(encode([]uint32{1, 2, 3}, []uint32{4}))
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		tr, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error without ErrFormat: %v", err)
			}
			return
		}
		if !slices.Equal(encodeTrace(tr), b) {
			t.Fatal("a parsed trace does not encode to its bytes")
		}
	})
}

func encodeTrace(tr *Trace) []byte {
	var docs [][]uint32
	for _, d := range tr.Docs {
		u := make([]uint32, len(d))
		for i, v := range d {
			u[i] = uint32(v)
		}
		docs = append(docs, u)
	}
	return encode(docs...)
}
