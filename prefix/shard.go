package prefix

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/cxltier/cxltier/tier"
)

// shard is one part of an index: a run of entries that no probe leaves, a
// run of blocks, its own LRU list and counts in its own state line, and its
// own tier lock. A key's hash picks its shard, so processes inserting at
// once mostly take different locks and write different lines; an index
// before version 3 is one shard.
type shard struct {
	k        int
	lock     int    // tier lock id
	state    []byte // its state line in the header
	stateOff int64  // the line's offset in the metadata run
	entry0   uint32 // first entry
	mask     uint32 // entries - 1 (a power of two)
	block0   uint32 // first block
	blocks   uint32
	ownerOff int64 // the metadata offset of block0's owner word

	// mu orders this process's goroutines before the tier lock, which
	// knows clients, not goroutines; the fields below are the holder's.
	mu sync.Mutex
	// freed lists blocks the holder freed, for its next allocations.
	freed []uint32
	// lruDamaged: a link word of the list named no entry of the shard; the
	// holder rebuilds the list before it lets go.
	lruDamaged bool
	// cands and pinned: an eviction's or a delete's candidates (by pin
	// value) and those a client has pinned, kept to spare allocations.
	cands  map[uint64]uint32
	pinned map[uint64]bool
}

func (sh *shard) u32(off int) *uint32 { return u32At(sh.state, off) }

func (sh *shard) add(off int, d int32) {
	p := sh.u32(off)
	atomic.StoreUint32(p, uint32(int32(atomic.LoadUint32(p))+d))
}

func (sh *shard) count(off int) int64 { return int64(atomic.LoadUint32(sh.u32(off))) }

// countsPlausible reports whether the shard's counts can be true: no more
// blocks used than it has, no more entries live or dead than it has, and
// no more live entries than blocks. A damaged word outside these bounds
// (one bad count of used blocks made every insert evict everything and
// then fail) is recounted from the entries by the next holder.
func (sh *shard) countsPlausible() bool {
	entries, blocks := sh.entries(), int64(sh.blocks)
	live := sh.count(slReady) + sh.count(slReserved)
	return sh.count(slUsedBlocks) <= blocks && live <= blocks && live+sh.count(slTombstones) <= entries
}

// holds reports whether entry i is one of the shard's.
func (sh *shard) holds(i uint32) bool { return i-sh.entry0 <= sh.mask }

// holdsBlock reports whether block b is one of the shard's.
func (sh *shard) holdsBlock(b uint32) bool { return b-sh.block0 < sh.blocks }

// next is the entry after i on a probe path, wrapping within the shard.
func (sh *shard) next(i uint32) uint32 { return sh.entry0 + (i-sh.entry0+1)&sh.mask }

func (sh *shard) entries() int64 { return int64(sh.mask) + 1 }

// stateLine is the header offset of shard k's state line.
func stateLine(k int) int64 {
	if k == 0 {
		return hdrState
	}
	return hdrShard1 + int64(k-1)*lineSize
}

// shardLock is shard k's tier lock: the index's lock and those after it,
// wrapping within the user locks. Distinct for every shard of an index
// (configGeometry keeps Shards within the user locks), so a holder of all
// of them at once (Destroy) never meets itself.
func shardLock(g *geometry, locks, k int) int {
	users := locks - tier.FirstUserLock
	return tier.FirstUserLock + (g.LockID-tier.FirstUserLock+k)%users
}

// initShards lays the shards out over the entries and blocks.
func (s *Store) initShards() error {
	locks := s.r.Info().Geometry.LockSlots
	if s.g.Shards > int64(locks-tier.FirstUserLock) {
		return fmt.Errorf("%w: %d shards, the tier has %d user locks", ErrBadIndex, s.g.Shards, locks-tier.FirstUserLock)
	}
	per := s.g.Entries / s.g.Shards
	s.shardShift = uint(64 - bits.TrailingZeros64(uint64(s.g.Shards)))
	s.shards = make([]shard, s.g.Shards)
	for k := range s.shards {
		sh := &s.shards[k]
		sh.k, sh.lock = k, shardLock(&s.g, locks, k)
		sh.stateOff = stateLine(k)
		sh.state = s.hdr[sh.stateOff : sh.stateOff+lineSize]
		sh.entry0, sh.mask = uint32(int64(k)*per), uint32(per-1)
		b0, b1 := int64(k)*s.g.Blocks/s.g.Shards, int64(k+1)*s.g.Blocks/s.g.Shards
		sh.block0, sh.blocks = uint32(b0), uint32(b1-b0)
		sh.ownerOff = s.g.OwnersOff + 4*b0
		if stride := s.g.ownerStride(); stride > 0 {
			sh.ownerOff = s.g.OwnersOff + int64(k)*stride
		}
		sh.freed = make([]uint32, 0, 256)
		sh.cands, sh.pinned = map[uint64]uint32{}, map[uint64]bool{}
	}
	return nil
}

// shardOfEntry is the shard holding entry i (i < Entries).
func (s *Store) shardOfEntry(i uint32) *shard {
	return &s.shards[int64(i)/(s.g.Entries/s.g.Shards)]
}

// shardOfKey is the shard k hashes to.
func (s *Store) shardOfKey(k *Key) *shard { return &s.shards[keyHash(k)>>s.shardShift] }

// byShard groups the indices 0..n-1 by the shard shardOf names for each,
// keeping their order within a shard, and calls fn once per shard that
// has any. fn takes and lets go of its shard's lock, so a caller never
// holds two and the order is free: each batch starts its round at a shard
// of its own (a golden-ratio step from the last). Batches that all went
// from shard 0 up would follow each other round in a convoy, each waiting
// at every shard for the one just ahead of it. A shard whose lock another
// client holds when the round reaches it is left to the end of the round,
// when it has most likely been let go, rather than waited on while other
// shards are free.
func (s *Store) byShard(n int, shardOf func(int) *shard, fn func(sh *shard, idx []int) error) error {
	order := make([]int, n)
	if len(s.shards) == 1 {
		for i := range order {
			order[i] = i
		}
		return fn(&s.shards[0], order)
	}
	var count [maxShards + 1]int
	ks := make([]uint8, n)
	for i := range n {
		ks[i] = uint8(shardOf(i).k)
		count[ks[i]+1]++
	}
	for k := 1; k <= len(s.shards); k++ {
		count[k] += count[k-1] // count[k]: where shard k's indices start
	}
	start := count
	for i := range n {
		order[count[ks[i]]] = i
		count[ks[i]]++
	}
	first := int(s.shardTurn.Add(0x9e3779b9) >> (32 - bits.TrailingZeros(uint(len(s.shards)))))
	left := 0 // shards with work still to visit in the round
	for k := range s.shards {
		if start[k+1] > start[k] {
			left++
		}
	}
	var busy [maxShards]int
	nbusy := 0
	for j := range s.shards {
		k := (first + j) & (len(s.shards) - 1)
		idx := order[start[k]:start[k+1]]
		if len(idx) == 0 {
			continue
		}
		left--
		// Only worth a look at the lock when there is other work to do first.
		if left > 0 && s.c.LockBusy(s.shards[k].lock) {
			busy[nbusy], nbusy = k, nbusy+1 // another process is in it: come back last
			continue
		}
		if err := fn(&s.shards[k], idx); err != nil {
			return err
		}
	}
	for _, k := range busy[:nbusy] {
		if err := fn(&s.shards[k], order[start[k]:start[k+1]]); err != nil {
			return err
		}
	}
	return nil
}
