package prefix

import (
	"sync/atomic"
	"testing"
)

// TestZeroedLRUTailDoesNotStopEviction: the LRU tail word is shared memory;
// zeroed by a stray write while ready entries remain, eviction relinks the
// list from the entries instead of finding nothing to evict for good.
func TestZeroedLRUTailDoesNotStopEviction(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStoreShards(t, c, 16, 256, 1)
	keys := keysN(40)
	if st, err := s.Set(keys[:16], payloadsFor(keys[:16], 100)); err != nil || st[15] != Reserved {
		t.Fatalf("fill: %v, %v", st, err)
	}
	sh := &s.shards[0]
	atomic.StoreUint32(sh.u32(slLRUHead), 0)
	atomic.StoreUint32(sh.u32(slLRUTail), 0)
	st, err := s.Set(keys[16:24], payloadsFor(keys[16:24], 100))
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range st {
		if x != Reserved {
			t.Fatalf("insert %d into a full index with its LRU list zeroed: %v", i, x)
		}
	}
	mustCheck(t, s)
}

// TestZeroedReservedCountStillReclaims: a dead client's reservations are
// reclaimed when an insert runs out of space, even if the shared count of
// reservations was zeroed (the count is recounted then).
func TestZeroedReservedCountStillReclaims(t *testing.T) {
	r, c := testTier(t, 1)
	s := testStoreShards(t, c, 16, 256, 1)
	z, sz := stalledClient(t, r)
	if _, err := sz.Reserve(keysN(16), sizesOf(16, 100)); err != nil {
		t.Fatal(err)
	}
	reapUntilFenced(t, r, z)
	sh := &s.shards[0]
	atomic.StoreUint32(sh.u32(slReserved), 0)
	keys := keysN(40)[20:28]
	st, err := s.Set(keys, payloadsFor(keys, 100))
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range st {
		if x != Reserved {
			t.Fatalf("insert %d with a dead client's reservations filling the index: %v", i, x)
		}
	}
	if got := sh.count(slReserved); got != 0 {
		t.Fatalf("reserved count %d after the recount, want 0", got)
	}
	mustCheck(t, s)
}

func sizesOf(n int, size int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = size
	}
	return out
}

// TestDamagedReservationBlockWordFreesItsBlock: a dead client's reservation
// whose block word was damaged (naming a block outside the shard, or one
// another entry owns) still gives its own block back when it is reclaimed:
// the owner table, not the damaged word, says which block it held. Before,
// that block stayed owned by a deleted entry: 15 of 16 blocks usable.
func TestDamagedReservationBlockWordFreesItsBlock(t *testing.T) {
	for _, tc := range []struct {
		name string
		word func(sh *shard, own, other uint32) uint32
	}{
		{"outside the shard", func(sh *shard, _, _ uint32) uint32 { return sh.block0 + uint32(sh.blocks) + 3 }},
		{"another entry's block", func(_ *shard, _, other uint32) uint32 { return other }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, c := testTier(t, 1)
			s := testStoreShards(t, c, 16, 256, 1)
			z, sz := stalledClient(t, r)
			if _, err := sz.Reserve(keysN(16), sizesOf(16, 100)); err != nil {
				t.Fatal(err)
			}
			sh := &s.shards[0]
			var reserved []uint32
			for i := sh.entry0; int64(i-sh.entry0) < sh.entries(); i++ {
				if wordState(atomic.LoadUint64(u64At(s.lockedEntry(i), entWord))) == stReserved {
					reserved = append(reserved, i)
				}
			}
			if len(reserved) != 16 {
				t.Fatalf("%d reservations, want 16", len(reserved))
			}
			own := atomic.LoadUint32(u32At(s.lockedEntry(reserved[0]), entBlock))
			other := atomic.LoadUint32(u32At(s.lockedEntry(reserved[1]), entBlock))
			atomic.StoreUint32(u32At(s.lockedEntry(reserved[0]), entBlock), tc.word(sh, own, other))
			reapUntilFenced(t, r, z)
			if _, err := s.Reclaim(); err != nil {
				t.Fatal(err)
			}
			if used := sh.count(slUsedBlocks); used != 0 {
				t.Fatalf("%d blocks still used after every reservation was reclaimed", used)
			}
			keys := keysN(40)[20:36]
			st, err := s.Set(keys, payloadsFor(keys, 100))
			if err != nil {
				t.Fatal(err)
			}
			for i, x := range st {
				if x != Reserved {
					t.Fatalf("insert %d of 16 into an index whose 16 blocks were all reclaimed: %v", i, x)
				}
			}
			mustCheck(t, s)
		})
	}
}
