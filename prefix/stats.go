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
	PinsHeld         int64  `json:"pins_held"` // by live clients
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
	s.refreshMeta(0, 256)
	c := s.counters()
	u32 := func(off int) int64 { return int64(atomic.LoadUint32(s.hdrU32(off))) }
	st := Stats{Name: s.name, Entries: s.g.Entries, Blocks: s.g.Blocks, BlockBytes: s.g.BlockBytes,
		Ready: u32(hdrReady), Reserved: u32(hdrReserved), UsedBlocks: u32(hdrUsedBlocks), Tombstones: u32(hdrTombstones),
		Hits: c[ctrHits], Misses: c[ctrMisses], Inserts: c[ctrInserts], Evictions: c[ctrEvictions],
		ChecksumFailures: c[ctrChecksumFailures], Reclaimed: c[ctrReclaimed], BytesIn: c[ctrBytesIn], BytesOut: c[ctrBytesOut]}
	for slot := 0; int64(slot) < s.g.Clients; slot++ {
		h := s.metaSlice(s.g.PinsOff+int64(slot)*s.g.PinStride, pinHeaderSize)
		tok := atomic.LoadUint64(u64At(h, 0))
		if tok == 0 || !s.r.LeaseLive(tok) {
			continue
		}
		for j := int64(0); j < min(int64(atomic.LoadUint32(u32At(h, 8))), s.g.Pins); j++ {
			if atomic.LoadUint64(s.pinRecord(slot, j)) != 0 {
				st.PinsHeld++
			}
		}
	}
	return st
}

// Check verifies the index's invariants under its lock and returns every
// violation it finds: no key twice, every live entry owning its block and
// every owned block owned by a live entry, the LRU list holding exactly the
// ready entries with consistent links, the counts matching, and (if
// payloads) every ready payload matching its checksum.
func (s *Store) Check(payloads bool) ([]string, error) {
	var bad []string
	err := s.locked(func() { bad = s.checkLocked(payloads) })
	return bad, err
}

func (s *Store) checkLocked(payloads bool) []string {
	var bad []string
	report := func(f string, a ...any) {
		if len(bad) < 100 {
			bad = append(bad, fmt.Sprintf(f, a...))
		}
	}
	keys := map[Key]uint32{}
	owned := map[uint32]uint32{}
	var ready, reserved, tomb int64
	var scratch []byte
	for i := uint32(0); int64(i) < s.g.Entries; i++ {
		e := s.entry(i)
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
		if int64(b) >= s.g.Blocks || atomic.LoadUint32(s.owner(b)) != i+1 {
			report("entry %d: block %d not owned by it", i, b)
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
			} else if crc32.Checksum(scratch, castagnoli) != atomic.LoadUint32(u32At(e, entCRC)) {
				report("entry %d (%v): payload does not match its checksum", i, k)
			}
		}
	}
	for b := uint32(0); int64(b) < s.g.Blocks; b++ {
		if o := atomic.LoadUint32(s.owner(b)); o != 0 {
			if i, ok := owned[b]; !ok || i+1 != o {
				report("block %d owned by entry %d, which does not hold it", b, int64(o)-1)
			}
		}
	}
	s.checkLRU(ready, report)
	for _, c := range []struct {
		name string
		off  int
		want int64
	}{{"ready", hdrReady, ready}, {"reserved", hdrReserved, reserved},
		{"tombstones", hdrTombstones, tomb}, {"used blocks", hdrUsedBlocks, int64(len(owned))}} {
		if got := int64(atomic.LoadUint32(s.hdrU32(c.off))); got != c.want {
			report("header counts %d %s, entries say %d", got, c.name, c.want)
		}
	}
	return bad
}

// checkLRU walks the list from the head: every ready entry once, links
// consistent both ways, tail where the walk ends.
func (s *Store) checkLRU(ready int64, report func(string, ...any)) {
	var n int64
	prev := uint32(0)
	for cur := atomic.LoadUint32(s.hdrU32(hdrLRUHead)); cur != 0; {
		if n > s.g.Entries {
			report("LRU list has a cycle")
			return
		}
		if int64(cur) > s.g.Entries {
			report("LRU link %d names no entry (the table has %d)", int64(cur)-1, s.g.Entries)
			return
		}
		e := s.entry(cur - 1)
		if wordState(atomic.LoadUint64(u64At(e, entWord))) != stReady {
			report("LRU list holds entry %d, which is not ready", cur-1)
		}
		if p := atomic.LoadUint32(u32At(e, entPrev)); p != prev {
			report("entry %d: prev link %d, walked from %d", cur-1, int64(p)-1, int64(prev)-1)
		}
		prev, cur = cur, atomic.LoadUint32(u32At(e, entNext))
		n++
	}
	if t := atomic.LoadUint32(s.hdrU32(hdrLRUTail)); t != prev {
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
	// Under the index lock, clear the magic: every other handle's next
	// locked call or lookup then reports ErrStale instead of working on
	// memory the index no longer owns.
	if err := c.Lock(s.g.LockID); err != nil {
		return fmt.Errorf("prefix: destroy %q: %w", name, err)
	}
	atomic.StoreUint64(u64At(s.hdr, hdrMagic), 0)
	s.publishMeta(0, lineSize)
	if err := c.Unlock(s.g.LockID); err != nil {
		return fmt.Errorf("prefix: destroy %q: %w", name, err)
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
