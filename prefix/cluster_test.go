package prefix

import (
	"errors"
	"fmt"
	"testing"
)

// A page filled in place (as the uplink's transfer does) is published only
// when its block holds what the checksum says; the others are aborted and
// their blocks reused, never served.
func TestPublishWrittenChecksBlocks(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 16, 4096)
	keys := keysN(4)
	sizes := []int64{4096, 1000, 4096, 10}
	res, err := s.Reserve(keys, sizes)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]uint32, len(res))
	for i, r := range res {
		b, err := s.Block(r)
		if err != nil {
			t.Fatal(err)
		}
		p := payloadFor(r.Key, int(r.Len))
		want[i] = WireChecksum(r.Key, p)
		copy(b, p)
	}
	b, _ := s.Block(res[1])
	b[500] ^= 1               // damaged in transit
	want[3] = want[3] ^ 0x100 // a trailer from another page
	ok, err := s.PublishWritten(res, want)
	if err != nil {
		t.Fatal(err)
	}
	if !ok[0] || ok[1] || !ok[2] || ok[3] {
		t.Fatalf("published %v, want [true false true false]", ok)
	}
	for i, k := range keys {
		hits, err := s.Lookup([]Key{k})
		if err != nil {
			t.Fatal(err)
		}
		if got := len(hits) == 1; got != ok[i] {
			t.Errorf("key %d: served %v, published %v", i, got, ok[i])
		}
		if len(hits) == 1 {
			if err := s.VerifyHit(hits[0]); err != nil {
				t.Errorf("key %d: %v", i, err)
			}
		}
		s.Release(hits)
	}
	if st := s.Stats(); st.Reserved != 0 {
		t.Errorf("%d reservations left after publish and abort", st.Reserved)
	}
	mustCheck(t, s)
}

// On a current index the checksum a page travels with is the entry's own,
// so the uplink can check a pinned page against either.
func TestWireChecksumIsTheEntryChecksum(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 4, 4096)
	k := keyN(7)
	p := payloadFor(k, 3000)
	if _, err := s.Set([]Key{k}, [][]byte{p}); err != nil {
		t.Fatal(err)
	}
	hits, err := s.Lookup([]Key{k})
	if err != nil || len(hits) != 1 {
		t.Fatalf("lookup: %v, %d hits", err, len(hits))
	}
	defer s.Release(hits)
	got, err := s.Payload(hits[0])
	if err != nil {
		t.Fatal(err)
	}
	if w := WireChecksum(k, got); w != hits[0].CRC {
		t.Errorf("wire checksum %#x, entry %#x", w, hits[0].CRC)
	}
	if WireChecksum(keyN(8), got) == hits[0].CRC {
		t.Error("the wire checksum does not cover the key")
	}
}

// An index's namespace across nodes is its name without a tenant key, and
// differs with the key: tenants of one index name never share pages.
func TestNamespaceCarriesTheTenant(t *testing.T) {
	cases := []struct{ name, key string }{{"m", ""}, {"m", "k1"}, {"m", "k2"}, {"n", "k1"}}
	seen := map[string]int{}
	for i, tc := range cases {
		ns := namespace(tc.name, tc.key)
		if tc.key == "" && ns != tc.name {
			t.Errorf("%q without key: namespace %q", tc.name, ns)
		}
		if j, dup := seen[ns]; dup {
			t.Errorf("cases %d and %d share namespace %q", j, i, ns)
		}
		seen[ns] = i
	}
	_, c := testTier(t, 1)
	s, err := Create(c, Config{Name: "t", Blocks: 4, BlockBytes: 4096, Key: "secret"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Namespace() != namespace("t", "secret") {
		t.Errorf("namespace %q, want %q", s.Namespace(), namespace("t", "secret"))
	}
}

// A reservation's block is refused once it is not reserved, and Fenced
// reports a lost lease.
func TestBlockOnlyWhileReserved(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 4, 4096)
	res, err := s.Reserve(keysN(1), []int64{100})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Block(res[0]); err != nil {
		t.Fatal(err)
	}
	res[0].Status = Exists
	if _, err := s.Block(res[0]); !errors.Is(err, ErrBadConfig) {
		t.Errorf("block of a non-reservation: %v", err)
	}
	if err := s.Fenced(); err != nil {
		t.Errorf("fenced with a live lease: %v", err)
	}
}

// What leaves the node is checked first: a payload damaged in the tier is
// refused by WirePayload, on a current index and on one of layout 4,
// whose entry checksum is not the wire's.
func TestWirePayloadChecksTheEntry(t *testing.T) {
	for _, version := range []uint32{4, indexVersion} {
		t.Run(fmt.Sprintf("layout%d", version), func(t *testing.T) {
			_, c := testTier(t, 1)
			s, err := create(c, Config{Name: "m", Blocks: 8, BlockBytes: 4096}, version)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			keys := keysN(2)
			if _, err := s.Set(keys, [][]byte{payloadFor(keys[0], 2000), payloadFor(keys[1], 2000)}); err != nil {
				t.Fatal(err)
			}
			hits, err := s.Lookup(keys)
			if err != nil || len(hits) != 2 {
				t.Fatalf("lookup: %v, %d hits", err, len(hits))
			}
			defer s.Release(hits)
			b, wire, err := s.WirePayload(hits[0])
			if err != nil || wire != WireChecksum(keys[0], payloadFor(keys[0], 2000)) || len(b) != 2000 {
				t.Fatalf("good payload: %v, wire %#x", err, wire)
			}
			raw, _ := s.Payload(hits[1])
			raw[7] ^= 0x40
			if _, _, err := s.WirePayload(hits[1]); !errors.Is(err, ErrChecksum) {
				t.Errorf("damaged payload: %v", err)
			}
			// A page filled in place on this index is published with the
			// index's own checksum, so a plain read verifies it.
			k := keyN(99)
			p := payloadFor(k, 1500)
			res, err := s.Reserve([]Key{k}, []int64{1500})
			if err != nil {
				t.Fatal(err)
			}
			blk, _ := s.Block(res[0])
			copy(blk, p)
			if ok, err := s.PublishWritten(res, []uint32{WireChecksum(k, p)}); err != nil || !ok[0] {
				t.Fatalf("publish written: %v %v", ok, err)
			}
			dst := [][]byte{make([]byte, 1500)}
			if n, err := s.Get([]Key{k}, dst); n != 1 || err != nil {
				t.Errorf("read back: %d, %v", n, err)
			}
		})
	}
}
