package prefix

import (
	"fmt"
	"sync"
	"testing"
)

// TestConcurrentInserts: goroutines of one process insert, delete and
// check at once through one handle (the Store is documented as safe for
// that); every call succeeds and the index checks afterwards. Before each
// shard had a process mutex, the second goroutine to reach the tier lock
// failed: the lock knows clients, not goroutines.
func TestConcurrentInserts(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 256, 64)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				k := []Key{StringKey(fmt.Sprintf("%d/%d", g, i))}
				if _, err := s.Set(k, payloadsFor(k, 64)); err != nil {
					t.Errorf("goroutine %d set %d: %v", g, i, err)
					return
				}
				if i%7 == 0 {
					if _, err := s.Delete(k); err != nil {
						t.Errorf("goroutine %d delete %d: %v", g, i, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	mustCheck(t, s)
}

// TestShards: keys spread over the shards, each shard evicts within its own
// share of the blocks, damage to one shard's state is repaired by the next
// holder of that shard, and Destroy takes every shard's lock.
func TestShards(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStoreShards(t, c, 64, 64, 4)
	keys := make([]Key, 200)
	for i := range keys {
		keys[i] = StringKey(fmt.Sprint("shard key ", i))
	}
	for i := 0; i < len(keys); i += 10 {
		if st, err := s.Set(keys[i:i+10], payloadsFor(keys[i:i+10], 64)); err != nil || st[9] != Reserved {
			t.Fatalf("set %d: %v %v", i, st, err)
		}
	}
	perShard := map[int]int{}
	for i := range keys {
		if s.Exists(keys[i:i+1]) == 1 {
			perShard[s.shardOfKey(&keys[i]).k]++
		}
	}
	for k := range s.shards {
		if n := perShard[k]; n == 0 || n > int(s.shards[k].blocks) {
			t.Errorf("shard %d holds %d keys in %d blocks", k, n, s.shards[k].blocks)
		}
	}
	if st := s.Stats(); st.UsedBlocks != 64 || st.Ready != 64 || st.Shards != 4 {
		t.Errorf("stats after filling: %+v", st)
	}
	mustCheck(t, s)

	// A holder of shard 2 died mid-mutation: its counts are off and its
	// dirty word set. The next mutation there repairs it; no other shard is
	// touched.
	sh := &s.shards[2]
	storeU32(sh.state, slReady, 999)
	storeU64(sh.state, slDirty, 77)
	other := s.shards[1].count(slReady)
	var k2 Key
	for i := 0; ; i++ {
		if k2 = StringKey(fmt.Sprint("for shard 2: ", i)); s.shardOfKey(&k2) == sh {
			break
		}
	}
	if _, err := s.Set([]Key{k2}, payloadsFor([]Key{k2}, 64)); err != nil {
		t.Fatal(err)
	}
	if got := sh.count(slReady); got > int64(sh.blocks) {
		t.Errorf("shard 2 counts %d ready after its repair", got)
	}
	if got := s.shards[1].count(slReady); got != other {
		t.Errorf("shard 1's count moved from %d to %d", other, got)
	}
	mustCheck(t, s)
	s.Close()
	if err := Destroy(c, "m"); err != nil {
		t.Fatal(err)
	}
	for k := range s.shards {
		if err := c.Lock(s.shards[k].lock); err != nil {
			t.Errorf("shard %d's lock after Destroy: %v", k, err)
		} else {
			c.Unlock(s.shards[k].lock)
		}
	}
}
