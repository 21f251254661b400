package prefix

import (
	"fmt"
	"hash/crc32"
	"sync/atomic"

	"github.com/cxltier/cxltier/tier"
)

// Stats are an index's counts and counters, read without the lock.
type Stats struct {
	Name             string `json:"name"`
	Entries          int64  `json:"entries"`
	Blocks           int64  `json:"blocks"`
	BlockBytes       int64  `json:"block_bytes"`
	Ready            int64  `json:"ready"`
	Reserved         int64  `json:"reserved"`
	UsedBlocks       int64  `json:"used_blocks"`
	Tombstones       int64  `json:"tombstones"`
	Shards           int64  `json:"shards"`
	LayoutVersion    uint32 `json:"layout_version"` // the index's; see docs/abi.md
	PinsHeld         int64  `json:"pins_held"`      // by live clients
	Hits             uint64 `json:"hits"`
	Misses           uint64 `json:"misses"`
	Inserts          uint64 `json:"inserts"`
	Evictions        uint64 `json:"evictions"`
	ChecksumFailures uint64 `json:"checksum_failures"`
	Reclaimed        uint64 `json:"reclaimed"`
	BytesIn          uint64 `json:"bytes_in"`
	BytesOut         uint64 `json:"bytes_out"`
}

// HitRate is hits over lookups of keys, or 0 before any.
func (st Stats) HitRate() float64 {
	if st.Hits+st.Misses == 0 {
		return 0
	}
	return float64(st.Hits) / float64(st.Hits+st.Misses)
}

// Stats reads the index's counts.
func (s *Store) Stats() Stats {
	h, err := s.hold("stats")
	if err != nil { // the geometry only: the counts went with the mapping
		return Stats{Name: s.name, Entries: s.g.Entries, Blocks: s.g.Blocks, BlockBytes: s.g.BlockBytes, Shards: s.g.Shards, LayoutVersion: s.g.Version}
	}
	defer h.Done()
	s.refreshMeta(0, 256)
	c := s.counters()
	st := Stats{Name: s.name, Entries: s.g.Entries, Blocks: s.g.Blocks, BlockBytes: s.g.BlockBytes, Shards: s.g.Shards, LayoutVersion: s.g.Version,
		Hits: c[ctrHits], Misses: c[ctrMisses], Inserts: c[ctrInserts], Evictions: c[ctrEvictions],
		ChecksumFailures: c[ctrChecksumFailures], Reclaimed: c[ctrReclaimed], BytesIn: c[ctrBytesIn], BytesOut: c[ctrBytesOut]}
	for k := range s.shards {
		sh := &s.shards[k]
		s.refreshMeta(sh.stateOff, lineSize)
		st.Ready += sh.count(slReady)
		st.Reserved += sh.count(slReserved)
		st.UsedBlocks += sh.count(slUsedBlocks)
		st.Tombstones += sh.count(slTombstones)
	}
	s.eachLivePin(func(uint64) { st.PinsHeld++ })
	return st
}

// Check verifies the index's invariants, shard by shard under each one's
// lock, and returns every violation it finds: no key twice, every live
// entry reachable from its home and owning a block of its shard, every
// owned block owned by a live entry, the LRU list holding exactly the
// shard's ready entries with consistent links, the counts matching, and
// (if payloads) every ready payload matching its checksum.
func (s *Store) Check(payloads bool) ([]string, error) {
	held, herr := s.hold("check")
	if herr != nil {
		return nil, herr
	}
	defer held.Done()
	var bad []string
	report := func(f string, a ...any) {
		if len(bad) < 100 {
			bad = append(bad, fmt.Sprintf(f, a...))
		}
	}
	err := s.eachShard(func(sh *shard) { s.checkLocked(sh, payloads, report) })
	return bad, err
}

// violations is what checkLocked finds in shard sh (its lock held),
// payloads aside: nil for a sound shard. Invariants builds call it around
// every mutation.
func (s *Store) violations(sh *shard) []string {
	var v []string
	s.checkLocked(sh, false, func(f string, a ...any) {
		if len(v) < 8 {
			v = append(v, fmt.Sprintf(f, a...))
		}
	})
	return v
}

func (s *Store) checkLocked(sh *shard, payloads bool, report func(string, ...any)) {
	keys := map[Key]uint32{}
	owned := map[uint32]uint32{}
	var ready, reserved, tomb int64
	var scratch []byte
	for i := sh.entry0; int64(i-sh.entry0) < sh.entries(); i++ {
		e := s.lockedEntry(i)
		w := atomic.LoadUint64(u64At(e, entWord))
		switch wordState(w) {
		case stEmpty:
			continue
		case stDeleted:
			tomb++
			continue
		case stReady:
			ready++
		case stReserved:
			reserved++
		default:
			report("entry %d: state %d outside a mutation", i, wordState(w))
			continue
		}
		k := s.keyOf(i)
		if j, dup := keys[k]; dup {
			report("key %v in entries %d and %d", k, j, i)
		}
		keys[k] = i
		if j, _, ok := s.find(&k); !ok || j != i {
			report("entry %d (%v): out of reach of a probe from its home", i, k)
		}
		b := atomic.LoadUint32(u32At(e, entBlock))
		if !sh.holdsBlock(b) || atomic.LoadUint32(s.owner(sh, b)) != i+1 {
			report("entry %d: block %d not owned by it (shard %d holds blocks %d to %d)", i, b, sh.k, sh.block0, sh.block0+sh.blocks-1)
			continue
		}
		owned[b] = i
		if payloads && wordState(w) == stReady {
			n := int64(atomic.LoadUint32(u32At(e, entLen)))
			if n > s.g.BlockBytes {
				report("entry %d: payload of %d bytes in blocks of %d", i, n, s.g.BlockBytes)
				continue
			}
			scratch = append(scratch[:0], make([]byte, n)...)
			if err := s.r.ReadAt(scratch, s.blockAt(b)); err != nil {
				report("entry %d: read payload: %v", i, err)
			} else if crc32.Update(s.g.crcSeed(&k), castagnoli, scratch) != atomic.LoadUint32(u32At(e, entCRC)) {
				report("entry %d (%v): payload does not match its checksum", i, k)
			}
		}
	}
	for b := sh.block0; b-sh.block0 < sh.blocks; b++ {
		if o := atomic.LoadUint32(s.owner(sh, b)); o != 0 {
			if i, ok := owned[b]; !ok || i+1 != o {
				report("block %d owned by entry %d, which does not hold it", b, int64(o)-1)
			}
		}
	}
	s.checkLRU(sh, ready, report)
	for _, c := range []struct {
		name string
		off  int
		want int64
	}{{"ready", slReady, ready}, {"reserved", slReserved, reserved},
		{"tombstones", slTombstones, tomb}, {"used blocks", slUsedBlocks, int64(len(owned))}} {
		if got := sh.count(c.off); got != c.want {
			report("shard %d counts %d %s, entries say %d", sh.k, got, c.name, c.want)
		}
	}
}

// checkLRU walks the list from the head: every ready entry once, links
// consistent both ways, tail where the walk ends.
func (s *Store) checkLRU(sh *shard, ready int64, report func(string, ...any)) {
	var n int64
	prev := uint32(0)
	for cur := atomic.LoadUint32(sh.u32(slLRUHead)); cur != 0; {
		if n > sh.entries() {
			report("shard %d: LRU list has a cycle", sh.k)
			return
		}
		if !sh.holds(cur - 1) {
			report("shard %d: LRU link %d names no entry of the shard (it holds %d to %d)", sh.k, int64(cur)-1, sh.entry0, int64(sh.entry0)+sh.entries()-1)
			return
		}
		e := s.lockedEntry(cur - 1)
		if wordState(atomic.LoadUint64(u64At(e, entWord))) != stReady {
			report("LRU list holds entry %d, which is not ready", cur-1)
		}
		if p := atomic.LoadUint32(u32At(e, entPrev)); p != prev {
			report("entry %d: prev link %d, walked from %d", cur-1, int64(p)-1, int64(prev)-1)
		}
		prev, cur = cur, atomic.LoadUint32(u32At(e, entNext))
		n++
	}
	if t := atomic.LoadUint32(sh.u32(slLRUTail)); t != prev {
		report("LRU tail %d, walk ended at %d", int64(t)-1, int64(prev)-1)
	}
	if n != ready {
		report("LRU list has %d entries, %d are ready", n, ready)
	}
}

// Destroy removes the index from the directory and frees its chunks, with
// or without a key (an operator's act). No client may use it afterwards;
// the caller makes sure none does.
func Destroy(c *tier.Client, name string) error {
	s, err := Maintain(c, name)
	if err != nil {
		return err
	}
	s.Close()
	// Under every shard's lock (taken in order; a mutation holds one),
	// clear the magic: every other handle's next locked call or lookup then
	// reports ErrStale instead of working on memory the index no longer
	// owns.
	for k := range s.shards {
		if err := c.Lock(s.shards[k].lock); err != nil {
			for j := range k {
				c.Unlock(s.shards[j].lock)
			}
			return fmt.Errorf("prefix: destroy %q: %w", name, err)
		}
	}
	atomic.StoreUint64(u64At(s.hdr, hdrMagic), 0)
	s.publishMeta(0, lineSize)
	for k := range s.shards {
		if err := c.Unlock(s.shards[k].lock); err != nil {
			return fmt.Errorf("prefix: destroy %q: %w", name, err)
		}
	}
	if err := c.DirDelete(DirName(name)); err != nil {
		return fmt.Errorf("prefix: destroy %q: %w", name, err)
	}
	if err := c.FreeChunks(tier.Offset(s.g.PayloadOff), s.g.PayloadChunks); err != nil {
		return fmt.Errorf("prefix: destroy %q: payload: %w", name, err)
	}
	if err := c.FreeChunks(s.meta, s.g.MetaChunks); err != nil {
		return fmt.Errorf("prefix: destroy %q: metadata: %w", name, err)
	}
	return nil
}
