package prefix

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/cxltier/cxltier/tier"
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

// TestNonCoherentTier: on a tier mapped as non-coherent (every metadata
// access flushed or invalidated: one host here, so the lines are right
// either way, but every publish and refresh path runs) a sharded index
// inserts, evicts, looks up with pins held, deletes, counts and checks.
func TestNonCoherentTier(t *testing.T) {
	r, _ := testTier(t, 2)
	nc := openNonCoherent(t, r)
	c, err := nc.Attach(tier.ClientOptions{Name: "non-coherent"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := testStoreShards(t, c, 32, 256, 2)
	keys := keysN(100)
	var held []Hit
	for i := 0; i < len(keys); i += 4 {
		if _, err := s.Set(keys[i:i+4], payloadsFor(keys[i:i+4], 256)); err != nil {
			t.Fatal(err)
		}
		if i == 40 {
			if held, err = s.Lookup(keys[40:44]); err != nil || len(held) != 4 {
				t.Fatalf("lookup: %d, %v", len(held), err)
			}
		}
	}
	dst := make([][]byte, 4)
	for i := range dst {
		dst[i] = make([]byte, 256)
	}
	if n, err := s.Get(keys[40:44], dst); err != nil || n != 4 || !bytes.Equal(dst[3], payloadFor(keys[43], 256)) {
		t.Fatalf("pinned keys after evictions: %d, %v", n, err)
	}
	s.Release(held)
	if _, err := s.Delete(keys[96:]); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Inserts != 100 || st.Evictions == 0 || st.PinsHeld != 0 {
		t.Errorf("stats %+v", st)
	}
	mustCheck(t, s)
}

// TestStoreAfterRegionClose: a handle used after its Region closed (a
// deferred Close in the wrong order) returns ErrClosed instead of
// faulting on the unmapped memory.
func TestStoreAfterRegionClose(t *testing.T) {
	r, c := testTier(t, 1)
	s := testStoreShards(t, c, 16, 64, 2)
	keys := []Key{keyN(1)}
	if _, err := s.Set(keys, payloadsFor(keys, 64)); err != nil {
		t.Fatal(err)
	}
	hits, err := s.Lookup(keys)
	if err != nil || len(hits) != 1 {
		t.Fatalf("lookup: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	s.Release(hits)
	if _, err := s.Lookup(keys); !errors.Is(err, tier.ErrClosed) {
		t.Errorf("lookup: %v", err)
	}
	if n := s.Exists(keys); n != 0 {
		t.Errorf("exists: %d", n)
	}
	if _, err := s.Set(keys, payloadsFor(keys, 64)); !errors.Is(err, tier.ErrClosed) {
		t.Errorf("set: %v", err)
	}
	if _, err := s.Get(keys, [][]byte{make([]byte, 64)}); !errors.Is(err, tier.ErrClosed) {
		t.Errorf("get: %v", err)
	}
	if _, err := s.Check(false); !errors.Is(err, tier.ErrClosed) {
		t.Errorf("check: %v", err)
	}
	if st := s.Stats(); st.Ready != 0 || st.Blocks != 16 {
		t.Errorf("stats: %+v", st)
	}
	if err := s.Close(); !errors.Is(err, tier.ErrClosed) {
		t.Errorf("close: %v", err)
	}
}

// TestOwnerLinesPerShard: from version 4 no line of the owner table holds
// words of two shards (two hosts without shared caches, each holding one
// shard's lock, would undo each other's write-backs of such a line), and
// every shard's words lie in the table. An index of version 3, whose table
// is one run of words, is still served.
func TestOwnerLinesPerShard(t *testing.T) {
	for _, tc := range []struct{ blocks, shards int64 }{{24, 2}, {100, 4}, {1000, 8}, {17, 1}, {4099, 8}} {
		t.Run(fmt.Sprintf("%dblocks/%dshards", tc.blocks, tc.shards), func(t *testing.T) {
			_, c := testTier(t, 1)
			s := testStoreShards(t, c, tc.blocks, 64, int(tc.shards))
			lineOf := map[int64]int{}
			for k := range s.shards {
				sh := &s.shards[k]
				first, last := sh.ownerOff, sh.ownerOff+4*int64(sh.blocks)-1
				if first < s.g.OwnersOff || last >= s.g.PinsOff {
					t.Fatalf("shard %d: owner words at %d-%d, the table is %d-%d", k, first, last, s.g.OwnersOff, s.g.PinsOff)
				}
				for line := first &^ (lineSize - 1); line <= last; line += lineSize {
					if j, ok := lineOf[line]; ok && j != k {
						t.Fatalf("owner line at %d holds words of shards %d and %d", line, j, k)
					}
					lineOf[line] = k
				}
			}
			keys := keysN(int(3 * tc.blocks))
			if _, err := s.Set(keys, payloadsFor(keys, 64)); err != nil {
				t.Fatal(err)
			}
			mustCheck(t, s)
		})
	}
	t.Run("version3", func(t *testing.T) {
		_, c := testTier(t, 1)
		s, err := create(c, Config{Name: "m", Blocks: 100, BlockBytes: 64, PinsPerClient: 256, Shards: 4}, 3)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if got, want := s.shards[1].ownerOff, s.g.OwnersOff+4*25; got != want {
			t.Fatalf("shard 1's owner words at %d in a version 3 index, want %d", got, want)
		}
		keys := keysN(300)
		for i := 0; i < len(keys); i += 10 {
			if _, err := s.Set(keys[i:i+10], payloadsFor(keys[i:i+10], 64)); err != nil {
				t.Fatal(err)
			}
		}
		if n := s.Exists(keys[290:]); n != 10 {
			t.Fatalf("%d of the last 10 keys present", n)
		}
		mustCheck(t, s)
	})
}
