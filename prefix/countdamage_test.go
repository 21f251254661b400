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
