package cluster

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/cxltier/cxltier/prefix"
)

func keys(n int) []prefix.Key {
	out := make([]prefix.Key, n)
	for i := range out {
		out[i] = prefix.StringKey(string(rune('a' + i%26)))
		out[i][0] = byte(i)
	}
	return out
}

func TestRequestRoundTrip(t *testing.T) {
	for _, r := range []Request{
		{Op: OpFill, Index: "llama", Keys: keys(1)},
		{Op: OpFill, Index: strings.Repeat("x", MaxName), Keys: keys(MaxFillKeys)},
		{Op: OpStored, Index: "m~0123", Keys: keys(MaxNoticeKey)},
	} {
		b, err := r.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ParseRequest(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.Op != r.Op || got.Index != r.Index || len(got.Keys) != len(r.Keys) || got.Keys[len(r.Keys)-1] != r.Keys[len(r.Keys)-1] {
			t.Errorf("round trip of %v %q (%d keys) gave %v %q (%d keys)", r.Op, r.Index, len(r.Keys), got.Op, got.Index, len(got.Keys))
		}
	}
}

func TestBadRequests(t *testing.T) {
	good, _ := (&Request{Op: OpFill, Index: "m", Keys: keys(2)}).AppendBinary(nil)
	cases := map[string]Request{
		"no keys":        {Op: OpFill, Index: "m"},
		"too many fills": {Op: OpFill, Index: "m", Keys: keys(MaxFillKeys + 1)},
		"too many notes": {Op: OpStored, Index: "m", Keys: keys(MaxNoticeKey + 1)},
		"no name":        {Op: OpFill, Keys: keys(1)},
		"long name":      {Op: OpFill, Index: strings.Repeat("x", MaxName+1), Keys: keys(1)},
		"unknown op":     {Op: 9, Index: "m", Keys: keys(1)},
	}
	for name, r := range cases {
		if _, err := r.AppendBinary(nil); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: encoded (%v)", name, err)
		}
	}
	raw := map[string][]byte{
		"empty":     nil,
		"short":     good[:headerBytes-1],
		"magic":     append([]byte("XXXX"), good[4:]...),
		"truncated": good[:len(good)-1],
		"trailing":  append(bytes.Clone(good), 0),
		"op":        append(append(bytes.Clone(good[:4]), 7), good[5:]...),
	}
	for name, b := range raw {
		if _, err := ParseRequest(b); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s: parsed (%v)", name, err)
		}
	}
}

func TestReply(t *testing.T) {
	for _, r := range []Reply{{Filled: 0}, {Filled: 7, Failed: true}, {Filled: 2048}} {
		got, err := ParseReply(r.AppendBinary(nil), 2048)
		if err != nil || got != r {
			t.Errorf("reply %+v came back %+v (%v)", r, got, err)
		}
	}
	if _, err := ParseReply(Reply{Filled: 9}.AppendBinary(nil), 8); !errors.Is(err, ErrBadMessage) {
		t.Errorf("9 filled of 8 asked: %v", err)
	}
	if _, err := ParseReply([]byte("CXR1\x02\x00\x00\x00\x00\x00\x00\x00"), 8); !errors.Is(err, ErrBadMessage) {
		t.Errorf("status 2: %v", err)
	}
}

// FuzzParseRequest: whatever a peer sends, parsing never panics, and what
// parses encodes back to the same bytes.
func FuzzParseRequest(f *testing.F) {
	good, _ := (&Request{Op: OpStored, Index: "m", Keys: keys(3)}).AppendBinary(nil)
	f.Add(good)
	f.Add([]byte("CXU1\x01\x00\x01\x00\x01\x00\x00\x00m"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			return
		}
		again, err := r.AppendBinary(nil)
		if err != nil {
			t.Fatalf("parsed request does not encode: %v", err)
		}
		again[5] = b[5] // the reserved byte is the only freedom
		if !bytes.Equal(again, b) {
			t.Fatalf("re-encoding differs:\n%x\n%x", again, b)
		}
	})
}
