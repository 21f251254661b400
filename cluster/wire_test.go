package cluster

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
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

func TestTrailerRoundTrip(t *testing.T) {
	for _, tr := range []Trailer{{Length: 7, CRC: 0xdeadbeef}, {Length: 1 << 20, CRC: 1, MAC: [MACBytes]byte{1, 2, 3}, Signed: true}} {
		b := make([]byte, TrailerBytes)
		tr.Put(b)
		got, err := ParseTrailer(b, int64(tr.Length))
		if err != nil || got != tr {
			t.Errorf("%+v came back as %+v, %v", tr, got, err)
		}
		if _, err := ParseTrailer(b, int64(tr.Length)+1); !errors.Is(err, ErrBadMessage) {
			t.Errorf("a trailer of another length: %v", err)
		}
	}
	b := make([]byte, TrailerBytes)
	Trailer{Length: 3}.Put(b)
	for name, damage := range map[string]func([]byte){
		"magic": func(b []byte) { b[0] = 'X' }, "version": func(b []byte) { b[4] = 1 }, "flags": func(b []byte) { b[6] = 4 },
	} {
		c := append([]byte(nil), b...)
		damage(c)
		if _, err := ParseTrailer(c, 3); !errors.Is(err, ErrBadMessage) {
			t.Errorf("%s damaged: %v", name, err)
		}
	}
	if _, err := ParseTrailer(b[:TrailerBytes-1], 3); !errors.Is(err, ErrBadMessage) {
		t.Errorf("a short trailer: %v", err)
	}
}

func FuzzParseTrailer(f *testing.F) {
	b := make([]byte, TrailerBytes)
	Trailer{Length: 10, CRC: 5, Signed: true}.Put(b)
	f.Add(b, int64(10))
	f.Fuzz(func(t *testing.T, b []byte, length int64) {
		tr, err := ParseTrailer(b, length)
		if err != nil {
			return
		}
		out := make([]byte, TrailerBytes)
		tr.Put(out)
		if !bytes.Equal(out, b[:TrailerBytes]) {
			t.Fatalf("%x parsed to %+v, which writes %x", b[:TrailerBytes], tr, out)
		}
	})
}

// TestPageAuth: a page signed with the cluster key passes its check on a
// node with the same key; a page signed with another cluster key, for
// another index or tenant, unsigned, or with a payload changed is refused,
// and a node without the key checks the CRC alone.
func TestPageAuth(t *testing.T) {
	secret := []byte("a cluster secret of some length")
	a, err := NewPageAuth(secret, "m", nil)
	if err != nil {
		t.Fatal(err)
	}
	k, payload := prefix.StringKey("page"), bytes.Repeat([]byte("kv"), 100000)
	crc, mac := a.Seal(k, payload)
	if crc != prefix.WireChecksum(k, payload) {
		t.Fatalf("the sealed checksum %#x is not the wire checksum", crc)
	}
	good := Trailer{Length: uint32(len(payload)), CRC: crc, MAC: mac, Signed: true}
	if got, err := a.Check(good, k, payload); err != nil || got != crc {
		t.Fatalf("a good page: %#x, %v", got, err)
	}
	var none *PageAuth
	if _, err := none.Check(Trailer{Length: good.Length, CRC: crc}, k, payload); err != nil {
		t.Fatalf("no key, an unsigned page with a good checksum: %v", err)
	}
	other, _ := NewPageAuth([]byte("another cluster's secret key"), "m", nil)
	otherIndex, _ := NewPageAuth(secret, "n", nil)
	tenant, _ := NewPageAuth(secret, "m", []byte("acme"))
	changed := append([]byte(nil), payload...)
	changed[12345] ^= 1
	changedCRC := prefix.WireChecksum(k, changed)
	// A signed page moved under another key: its CRC covers the key, so a
	// mover fixes it; the MAC covers the key too, which no mover can fix.
	moved := prefix.StringKey("another page")
	movedCRC := prefix.WireChecksum(moved, payload)
	for name, tc := range map[string]struct {
		auth    *PageAuth
		tr      Trailer
		key     prefix.Key
		payload []byte
		want    error
	}{
		"another cluster's key":          {other, good, k, payload, ErrAuth},
		"another index":                  {otherIndex, good, k, payload, ErrAuth},
		"another tenant":                 {tenant, good, k, payload, ErrAuth},
		"unsigned":                       {a, Trailer{Length: good.Length, CRC: crc}, k, payload, ErrAuth},
		"a changed payload, CRC fixed":   {a, Trailer{Length: good.Length, CRC: changedCRC, MAC: mac, Signed: true}, k, changed, ErrAuth},
		"a changed payload":              {a, good, k, changed, prefix.ErrChecksum},
		"moved under another key":        {a, good, moved, payload, prefix.ErrChecksum},
		"moved under another key, fixed": {a, Trailer{Length: good.Length, CRC: movedCRC, MAC: mac, Signed: true}, moved, payload, ErrAuth},
	} {
		if _, err := tc.auth.Check(tc.tr, tc.key, tc.payload); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if _, err := NewPageAuth([]byte("short"), "m", nil); err == nil {
		t.Error("a 5-byte cluster key was taken")
	}
}

// wirePython parses, with the uplink's own Python (python/cxltier/cluster/uplink.py),
// each request given as hex, and makes the replies asked for: what the
// other side of this wire reads and writes.
const wirePython = `
import json, sys
from cxltier.cluster import uplink
job = json.load(sys.stdin)
out = {"requests": [], "replies": []}
for raw in job["requests"]:
    try:
        op, name, keys = uplink.parse_request(bytes.fromhex(raw))
        out["requests"].append({"op": op, "name": name, "keys": [k.hex() for k in keys]})
    except ValueError as e:
        out["requests"].append({"error": str(e)})
for filled, failed in job["replies"]:
    out["replies"].append(uplink.reply(filled, failed).hex())
json.dump(out, sys.stdout)
`

// TestWireAgreesWithThePython: requests Go builds are what the uplink's
// Python parses, field by field; damaged ones it refuses; and the replies
// the Python builds are what Go parses. (The Python test of the parser
// built its messages itself, and so checked nothing of Go's.)
func TestWireAgreesWithThePython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	reqs := []Request{
		{Op: OpFill, Index: "m", Keys: keys(3)},
		{Op: OpStored, Index: strings.Repeat("n", MaxName), Keys: keys(MaxNoticeKey)},
		{Op: OpFill, Index: "ümlaut", Keys: keys(1)},
	}
	var job struct {
		Requests []string `json:"requests"`
		Replies  [][2]any `json:"replies"`
	}
	for _, r := range reqs {
		b, err := r.AppendBinary(nil)
		if err != nil {
			t.Fatal(err)
		}
		job.Requests = append(job.Requests, hex.EncodeToString(b))
	}
	good, _ := reqs[0].AppendBinary(nil)
	job.Requests = append(job.Requests, hex.EncodeToString(good[:len(good)-1]), hex.EncodeToString(append([]byte("XXXX"), good[4:]...)))
	replies := []Reply{{Filled: 0}, {Filled: 7, Failed: true}, {Filled: MaxFillKeys}}
	for _, r := range replies {
		job.Replies = append(job.Replies, [2]any{r.Filled, r.Failed})
	}
	in, _ := json.Marshal(job)
	cmd := exec.Command(py, "-c", wirePython)
	cmd.Env = append(os.Environ(), "PYTHONPATH=../python")
	cmd.Stdin = bytes.NewReader(in)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the uplink's Python: %v", err)
	}
	var got struct {
		Requests []struct {
			Op    int      `json:"op"`
			Name  string   `json:"name"`
			Keys  []string `json:"keys"`
			Error string   `json:"error"`
		} `json:"requests"`
		Replies []string `json:"replies"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	for i, r := range reqs {
		g := got.Requests[i]
		if g.Error != "" || g.Op != int(r.Op) || g.Name != r.Index || len(g.Keys) != len(r.Keys) {
			t.Fatalf("request %d: Python read %+v", i, g)
		}
		for j, k := range r.Keys {
			if g.Keys[j] != hex.EncodeToString(k[:]) {
				t.Fatalf("request %d key %d: Python read %s", i, j, g.Keys[j])
			}
		}
	}
	for _, g := range got.Requests[len(reqs):] {
		if g.Error == "" {
			t.Errorf("the Python took a damaged request: %+v", g)
		}
	}
	for i, raw := range got.Replies {
		b, _ := hex.DecodeString(raw)
		r, err := ParseReply(b, MaxFillKeys)
		if err != nil || r != replies[i] {
			t.Errorf("reply %d: Go read %+v, %v from the Python's %s", i, r, err, raw)
		}
	}
}
