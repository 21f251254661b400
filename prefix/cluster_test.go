package prefix

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/tier"
)

// A page filled in place (as the uplink's transfer does) is published only
// when its block holds what the checksum says; the others are aborted and
// their blocks reused, never served.
func TestFillChecksBlocks(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 16, 4096)
	keys := keysN(5)
	sizes := []int64{4096, 1000, 4096, 10, 300}
	f, blocks, want := filledAsTransferred(t, s, keys, sizes)
	blocks[1][500] ^= 1                                                                                                 // damaged in transit
	want[3] = want[3] ^ 0x100                                                                                           // a trailer from another page
	ok, err := f.Commit([]bool{true, true, true, true, false}, WantChecksums(func(i int) Key { return keys[i] }, want)) // the last: the transfer failed
	if err != nil {
		t.Fatal(err)
	}
	if !ok[0] || ok[1] || !ok[2] || ok[3] || ok[4] {
		t.Fatalf("published %v, want [true false true false false]", ok)
	}
	if _, err := f.Commit(make([]bool, 5), WantChecksums(func(i int) Key { return keys[i] }, want)); !errors.Is(err, ErrFillOver) {
		t.Errorf("a second commit: %v", err)
	}
	if _, err := f.Blocks(); !errors.Is(err, ErrFillOver) {
		t.Errorf("blocks after the commit: %v", err)
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

// A fill hands out blocks only for the keys it reserved, and Close aborts
// whatever it did not commit.
func TestFillCloseAborts(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 4, 4096)
	if _, err := s.Set(keysN(1), [][]byte{payloadFor(keyN(0), 100)}); err != nil {
		t.Fatal(err)
	}
	f, err := s.BeginFill(keysN(3), []int64{100, 100, 100})
	if err != nil {
		t.Fatal(err)
	}
	if st := f.Statuses(); st[0] != Exists || st[1] != Reserved || st[2] != Reserved {
		t.Fatalf("statuses %v", st)
	}
	blocks, err := f.Blocks()
	if err != nil || blocks[0] != nil || len(blocks[1]) != 100 {
		t.Fatalf("blocks: %v, first %v, second %d bytes", err, blocks[0] != nil, len(blocks[1]))
	}
	if st := s.Stats(); st.Reserved != 2 {
		t.Fatalf("%d reserved", st.Reserved)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Reserved != 0 {
		t.Errorf("%d reservations left after the fill closed", st.Reserved)
	}
	if err := f.Close(); err != nil {
		t.Errorf("a second close: %v", err)
	}
	mustCheck(t, s)
}

// A block that cannot be flushed aborts every reservation the commit had
// not published: none is left behind. (It returned with the rest still
// reserved.)
func TestFillFlushFailureAbortsTheRest(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 8, 4096)
	keys := keysN(3)
	f, err := s.BeginFill(keys, []int64{100, 100, 100})
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := f.Blocks()
	if err != nil {
		t.Fatal(err)
	}
	want := make([]uint32, 3)
	for i, b := range blocks {
		p := payloadFor(keys[i], 100)
		copy(b, p)
		want[i] = WireChecksum(keys[i], p)
	}
	flushes := 0
	f.flush = func(off tier.Offset, n int64) error {
		if flushes++; flushes == 2 {
			return errors.New("flush failed")
		}
		return nil
	}
	if _, err := f.Commit([]bool{true, true, true}, WantChecksums(func(i int) Key { return keys[i] }, want)); err == nil {
		t.Fatal("commit with a failing flush succeeded")
	}
	if st := s.Stats(); st.Reserved != 0 || st.Ready != 0 {
		t.Errorf("after the failed commit: %d reserved, %d ready", st.Reserved, st.Ready)
	}
	mustCheck(t, s)
}

// A fill keeps its client open: a Close waits for it (and gives up), and
// goes ahead once the fill ends.
func TestFillHoldsTheClientOpen(t *testing.T) {
	r, _ := testTier(t, 1)
	c, err := r.Attach(tier.ClientOptions{Name: "filler", CloseWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s, err := Create(c, Config{Name: "f", Blocks: 4, BlockBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	f, err := s.BeginFill(keysN(1), []int64{100})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); !errors.Is(err, tier.ErrHoldsInFlight) {
		t.Fatalf("close during a fill: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("close after the fill: %v", err)
	}
}

// A client reaped between its reserve and its transfer (stalled past its
// lease) is told so before it writes, and its commit publishes nothing.
func TestFillAfterAReapWritesNothing(t *testing.T) {
	r, c := testTier(t, 1)
	testStore(t, c, 8, 4096)
	z, sz := stalledClient(t, r)
	f, err := sz.BeginFill(keysN(2), []int64{100, 100})
	if err != nil {
		t.Fatal(err)
	}
	reapUntilFenced(t, r, z)
	if _, err := f.Blocks(); !errors.Is(err, tier.ErrLeaseLost) {
		t.Fatalf("blocks after the reap: %v", err)
	}
	if _, err := f.Commit([]bool{true, true}, func(int, []byte) (uint32, error) { return 0, nil }); !errors.Is(err, ErrLost) {
		t.Fatalf("commit after the reap: %v", err)
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
			b, _, wire, err := s.WirePayload(hits[0])
			if err != nil || wire != WireChecksum(keys[0], payloadFor(keys[0], 2000)) || len(b) != 2000 {
				t.Fatalf("good payload: %v, wire %#x", err, wire)
			}
			raw, _ := s.Payload(hits[1])
			raw[7] ^= 0x40
			if _, _, _, err := s.WirePayload(hits[1]); !errors.Is(err, ErrChecksum) {
				t.Errorf("damaged payload: %v", err)
			}
			// A page filled in place on this index is published with the
			// index's own checksum, so a plain read verifies it.
			k := keyN(99)
			p := payloadFor(k, 1500)
			f, err := s.BeginFill([]Key{k}, []int64{1500})
			if err != nil {
				t.Fatal(err)
			}
			blk, _ := f.Blocks()
			copy(blk[0], p)
			if ok, err := f.Commit([]bool{true}, WantChecksums(func(int) Key { return k }, []uint32{WireChecksum(k, p)})); err != nil || !ok[0] {
				t.Fatalf("fill commit: %v %v", ok, err)
			}
			dst := [][]byte{make([]byte, 1500)}
			if n, err := s.Get([]Key{k}, dst); n != 1 || err != nil {
				t.Errorf("read back: %d, %v", n, err)
			}
		})
	}
}

// A fill of megabytes is checked on several goroutines (checkWritten):
// each damaged payload is still caught alone, whichever run checks it,
// and the rest are published.
func TestFillChecksMegabytesInParallel(t *testing.T) {
	_, c := tiertest.Format(t, 1, 64<<20, 1<<20)
	const n, size = 24, 1 << 20 // 24 MiB: three runs of moveGrain
	s := testStore(t, c, n, size)
	keys := keysN(n)
	sizes := make([]int64, n)
	for i := range sizes {
		sizes[i] = size
	}
	f, blocks, want := filledAsTransferred(t, s, keys, sizes)
	damaged := map[int]bool{0: true, 11: true, 12: true, 23: true}
	for i := range damaged {
		blocks[i][size/2] ^= 0x40
	}
	filled := make([]bool, n)
	for i := range filled {
		filled[i] = true
	}
	ok, err := f.Commit(filled, WantChecksums(func(i int) Key { return keys[i] }, want))
	if err != nil {
		t.Fatal(err)
	}
	for i := range ok {
		if ok[i] == damaged[i] {
			t.Errorf("key %d: published %v, damaged %v", i, ok[i], damaged[i])
		}
	}
	if got := s.Exists(keys[1:11]); got != 10 {
		t.Errorf("%d of the 10 good keys after the first damaged one found", got)
	}
	mustCheck(t, s)
}

// filledAsTransferred begins a fill of keys and writes each reserved block
// as a transfer would (payloadFor of its key and size): the fill, its
// blocks and each page's wire checksum.
func filledAsTransferred(t *testing.T, s *Store, keys []Key, sizes []int64) (*Fill, [][]byte, []uint32) {
	t.Helper()
	f, err := s.BeginFill(keys, sizes)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := f.Blocks()
	if err != nil {
		t.Fatal(err)
	}
	want := make([]uint32, len(keys))
	for i, b := range blocks {
		p := payloadFor(keys[i], int(sizes[i]))
		want[i] = WireChecksum(keys[i], p)
		copy(b, p)
	}
	return f, blocks, want
}

// turnCounter is a kernels.Pacer that counts the turns asked of it.
type turnCounter struct {
	mu           sync.Mutex
	turns, bytes int64
}

func (p *turnCounter) Turn(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.turns++
	p.bytes += n
}

// A paced fill's commit takes a turn for each page it checks, of that
// page's bytes, before it reads it, on one core or several; a page the
// transfer did not fill is not read and takes none.
func TestAPacedFillTakesATurnAPage(t *testing.T) {
	for _, tc := range []struct {
		name  string
		n     int
		size  int64
		unset int // a key the transfer failed
	}{
		{"small", 5, 3000, 2},
		{"megabytes, on several cores", 20, 1 << 20, 19},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, c := tiertest.Format(t, 1, 64<<20, 1<<20)
			s := testStore(t, c, int64(tc.n), tc.size)
			keys := keysN(tc.n)
			sizes := make([]int64, tc.n)
			filled := make([]bool, tc.n)
			for i := range sizes {
				sizes[i], filled[i] = tc.size-int64(i), i != tc.unset
			}
			f, _, want := filledAsTransferred(t, s, keys, sizes)
			p := &turnCounter{}
			f.Pace(p)
			ok, err := f.Commit(filled, WantChecksums(func(i int) Key { return keys[i] }, want))
			if err != nil {
				t.Fatal(err)
			}
			var bytes int64
			for i := range ok {
				if ok[i] != filled[i] {
					t.Errorf("key %d: published %v, filled %v", i, ok[i], filled[i])
				}
				if filled[i] {
					bytes += sizes[i]
				}
			}
			if p.turns != int64(tc.n-1) || p.bytes != bytes {
				t.Errorf("%d turns of %d bytes, want %d of %d", p.turns, p.bytes, tc.n-1, bytes)
			}
		})
	}
}
