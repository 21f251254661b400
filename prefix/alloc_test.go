package prefix

import (
	"fmt"
	"sync/atomic"
	"testing"
)

// TestFreedBlocksStayFindable: a block freed just behind the scan hint
// moves the hint back to it, and one freed far from the hint goes to the
// shard's stray list, which the next allocation takes first. Before, both
// were found only by a scan round the whole shard once every block ahead
// of the hint was taken (a two-process insert run walked ~2000 owner words
// on 2.5% of its allocations).
func TestFreedBlocksStayFindable(t *testing.T) {
	const blocks = 1024
	_, c := testTier(t, 1)
	s := testStoreShards(t, c, blocks, 64, 1)
	sh := &s.shards[0]
	keyOfBlock := map[uint32]Key{}
	for i := 0; i < blocks; i += 64 {
		keys := make([]Key, 64)
		for j := range keys {
			keys[j] = StringKey(fmt.Sprint("findable ", i+j))
		}
		res := mustReserve(t, s, keys, 64)
		for _, r := range res {
			keyOfBlock[r.Block] = r.Key
		}
		mustPublishZeros(t, s, res)
	}
	if hint := sh.count(slBlockHint); hint != 0 {
		t.Fatalf("hint after filling the shard: %d, want 0 (wrapped)", hint)
	}
	del := func(b uint32) {
		t.Helper()
		if n, err := s.Delete([]Key{keyOfBlock[b]}); n != 1 || err != nil {
			t.Fatalf("delete the key of block %d: %d %v", b, n, err)
		}
	}
	del(blocks - 10) // just behind the hint
	if hint := sh.count(slBlockHint); hint != blocks-10 {
		t.Fatalf("hint after freeing block %d: %d, want it moved back to the block", blocks-10, hint)
	}
	del(500) // far from it
	if n, b := atomic.LoadUint32(sh.u32(slStrays)), atomic.LoadUint32(sh.u32(slStray)); n != 1 || b != 500 {
		t.Fatalf("stray list after freeing block 500: %d words, first %d; want 1, 500", n, b)
	}
	for _, want := range []uint32{500, blocks - 10} {
		res := mustReserve(t, s, []Key{StringKey(fmt.Sprint("after ", want))}, 64)
		if res[0].Block != want {
			t.Fatalf("allocated block %d, want %d", res[0].Block, want)
		}
		mustPublishZeros(t, s, res)
	}
	mustCheck(t, s)
}

// TestDamagedStrayList: the stray list is a hint in shared memory; a count
// beyond its room and words naming blocks of no shard, or taken blocks,
// are passed over, and inserts go on.
func TestDamagedStrayList(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStoreShards(t, c, 64, 64, 1)
	sh := &s.shards[0]
	keys := make([]Key, 40)
	for i := range keys {
		keys[i] = StringKey(fmt.Sprint("stray ", i))
	}
	res := mustReserve(t, s, keys[:20], 64)
	mustPublishZeros(t, s, res)
	atomic.StoreUint32(sh.u32(slStrays), 1<<31)
	for k, b := range []uint32{1 << 31, res[3].Block, 64, 0xffffffff, res[0].Block, 7000} {
		atomic.StoreUint32(sh.u32(slStray+4*k), b)
	}
	res = mustReserve(t, s, keys[20:], 64)
	taken := map[uint32]bool{}
	for _, r := range res {
		if r.Status != Reserved || r.Block >= 64 || taken[r.Block] {
			t.Fatalf("reservation %+v after the stray list was damaged", r)
		}
		taken[r.Block] = true
	}
	mustPublishZeros(t, s, res)
	mustCheck(t, s)
}

func mustReserve(t *testing.T, s *Store, keys []Key, size int64) []Reservation {
	t.Helper()
	sizes := make([]int64, len(keys))
	for i := range sizes {
		sizes[i] = size
	}
	res, err := s.Reserve(keys, sizes)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res {
		if r.Status != Reserved {
			t.Fatalf("reserve %v: %v", r.Key, r.Status)
		}
	}
	return res
}

// mustPublishZeros publishes reservations of fresh blocks, whose payloads
// are still zero bytes, with the checksum of those bytes.
func mustPublishZeros(t *testing.T, s *Store, res []Reservation) {
	t.Helper()
	crcs := make([]uint32, len(res))
	for i, r := range res {
		crcs[i] = s.Checksum(r.Key, make([]byte, r.Len))
	}
	if err := s.Publish(res, crcs); err != nil {
		t.Fatal(err)
	}
}
