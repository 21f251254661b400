package prefix

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cxltier/cxltier/tier"
)

// Status is what a batch insert did with one key.
type Status uint8

const (
	Reserved Status = iota // a block is reserved for the key's payload
	Exists                 // the key is ready or being inserted already
	NoSpace                // no block could be freed for it
)

func (st Status) String() string {
	return [...]string{"reserved", "exists", "no space"}[min(int(st), 2)]
}

// Reservation is a block reserved for one key's payload. Write the payload
// at Offset, then Publish; or Abort.
type Reservation struct {
	Key    Key
	Status Status
	Len    int64
	Offset tier.Offset // where the payload goes (Status Reserved only)
	Block  uint32

	entry uint32
	word  uint64
}

// locked runs fn under the index lock. A dirty flag left set means the last
// holder died mid-mutation: repair the index from its entries first.
func (s *Store) locked(fn func()) error {
	if err := s.c.Lock(s.g.LockID); err != nil {
		return fmt.Errorf("prefix: %q: %w", s.name, err)
	}
	if err := s.current(); err != nil {
		s.c.Unlock(s.g.LockID)
		return err
	}
	s.refreshMeta(hdrDirty&^(lineSize-1), lineSize)
	dirty := s.hdrU64(hdrDirty)
	if atomic.LoadUint64(dirty) != 0 {
		s.repairLocked()
	}
	atomic.StoreUint64(dirty, s.c.Token())
	s.publishMeta(hdrDirty&^(lineSize-1), lineSize)
	s.freed = s.freed[:0]
	fn()
	if s.lruDamaged {
		s.repairLocked()
	}
	if 4*int64(atomic.LoadUint32(s.hdrU32(hdrTombstones))) > s.g.Entries {
		s.sweepTombstones()
	}
	atomic.StoreUint64(dirty, 0)
	s.publishMeta(hdrDirty&^(lineSize-1), lineSize)
	if err := s.c.Unlock(s.g.LockID); err != nil {
		return fmt.Errorf("prefix: %q: %w", s.name, err)
	}
	return nil
}

func (s *Store) hdrAdd(off int, d int32) {
	p := s.hdrU32(off)
	atomic.StoreUint32(p, uint32(int32(atomic.LoadUint32(p))+d))
}

// Reserve reserves a block for each key's payload of sizes[i] bytes,
// evicting least recently used unpinned entries when blocks run out. Keys
// present already (or twice in the batch) come back as Exists.
func (s *Store) Reserve(keys []Key, sizes []int64) ([]Reservation, error) {
	if err := s.entries("reserve"); err != nil {
		return nil, err
	}
	if len(sizes) != len(keys) {
		return nil, fmt.Errorf("prefix: %q: reserve: %d keys but %d sizes: %w", s.name, len(keys), len(sizes), ErrBadConfig)
	}
	for n, sz := range sizes {
		if sz < 0 || sz > s.g.BlockBytes {
			return nil, fmt.Errorf("prefix: %q: reserve key %d (%v): %d bytes: %w (%d)", s.name, n, keys[n], sz, ErrTooLarge, s.g.BlockBytes)
		}
	}
	out := make([]Reservation, len(keys))
	var ferr error
	err := s.locked(func() {
		now := uint64(time.Now().UnixNano())
		for n := range keys {
			out[n] = Reservation{Key: keys[n], Len: sizes[n]}
			if ferr = s.reserveOne(&out[n], len(keys)-n, now); ferr != nil {
				for m := n; m < len(keys); m++ {
					out[m] = Reservation{Key: keys[m], Len: sizes[m], Status: NoSpace}
				}
				return
			}
		}
	})
	if err == nil {
		err = ferr
	}
	return out, err
}

func (s *Store) reserveOne(res *Reservation, left int, now uint64) error {
	i, found, err := s.probeInsert(&res.Key)
	if err != nil {
		return err
	}
	if found {
		res.Status = Exists
		return nil
	}
	b, ok := s.allocBlock()
	if !ok {
		s.evictLocked(left)
		if b, ok = s.allocBlock(); !ok {
			s.reclaimLocked()
			b, ok = s.allocBlock()
		}
		if ok {
			// Eviction dropped entries and may have turned tombstones on
			// k's probe path back into empty entries; the slot found before
			// could now sit behind an empty one, out of reach. Probe again.
			if i, _, err = s.probeInsert(&res.Key); err != nil {
				s.freeBlock(b)
				return err
			}
		}
	}
	if !ok {
		res.Status = NoSpace
		return nil
	}
	e := s.entry(i)
	w := atomic.LoadUint64(u64At(e, entWord))
	if wordState(w) == stDeleted {
		s.hdrAdd(hdrTombstones, -1)
	}
	res.word = mkWord(wordGen(w)+1, stReserved)
	atomic.StoreUint64(u64At(e, entWord), res.word)
	for k := 0; k < 4; k++ {
		atomic.StoreUint64(u64At(e, entKey+8*k), leU64(res.Key[8*k:]))
	}
	atomic.StoreUint32(u32At(e, entLen), uint32(res.Len))
	atomic.StoreUint32(u32At(e, entBlock), b)
	atomic.StoreUint32(u32At(e, entCRC), 0)
	atomic.StoreUint64(u64At(e, entAccess), now)
	atomic.StoreUint64(u64At(e, entOwner), s.c.Token())
	atomic.StoreUint64(u64At(e, entCreated), now)
	atomic.StoreUint32(u32At(e, entPrev), 0)
	atomic.StoreUint32(u32At(e, entNext), 0)
	atomic.StoreUint32(s.owner(b), i+1)
	s.hdrAdd(hdrReserved, 1)
	s.publishEntry(i)
	s.publishOwner(b)
	res.Status, res.entry, res.Block, res.Offset = Reserved, i, b, s.blockAt(b)
	return nil
}

// probeInsert finds k's entry, or the first free entry on its probe path.
func (s *Store) probeInsert(k *Key) (uint32, bool, error) {
	mask := uint32(s.g.Entries - 1)
	i, free := s.home(k), int64(-1)
	for n := int64(0); n < s.g.Entries; n++ {
		e := s.readEntry(i)
		switch wordState(atomic.LoadUint64(u64At(e, entWord))) {
		case stEmpty:
			if free < 0 {
				free = int64(i)
			}
			return uint32(free), false, nil
		case stDeleted:
			if free < 0 {
				free = int64(i)
			}
		default:
			if keyEqual(e, k) {
				return i, true, nil
			}
		}
		i = (i + 1) & mask
	}
	if free >= 0 {
		return uint32(free), false, nil
	}
	return 0, false, fmt.Errorf("%w: %d entries", ErrIndexFull, s.g.Entries)
}

// allocBlock takes a free block, scanning from the shared hint.
func (s *Store) allocBlock() (uint32, bool) {
	if int64(atomic.LoadUint32(s.hdrU32(hdrUsedBlocks))) >= s.g.Blocks {
		return 0, false
	}
	for len(s.freed) > 0 {
		b := s.freed[len(s.freed)-1]
		s.freed = s.freed[:len(s.freed)-1]
		if atomic.LoadUint32(s.owner(b)) == 0 {
			s.hdrAdd(hdrUsedBlocks, 1)
			return b, true
		}
	}
	hint := int64(atomic.LoadUint32(s.hdrU32(hdrBlockHint)))
	for n := int64(0); n < s.g.Blocks; n++ {
		b := uint32((hint + n) % s.g.Blocks)
		if atomic.LoadUint32(s.owner(b)) == 0 {
			atomic.StoreUint32(s.hdrU32(hdrBlockHint), uint32((int64(b)+1)%s.g.Blocks))
			s.hdrAdd(hdrUsedBlocks, 1)
			return b, true
		}
	}
	return 0, false
}

// freeBlock gives back a block allocBlock took that no entry owns yet.
func (s *Store) freeBlock(b uint32) {
	s.hdrAdd(hdrUsedBlocks, -1)
}

// Publish makes reserved entries visible: call it after their payloads are
// completely written (and, on a non-coherent tier, flushed), with each
// payload's CRC-32C. It fails with ErrLost for reservations a reaper took
// back, after publishing the others.
func (s *Store) Publish(res []Reservation, crcs []uint32) error {
	if len(crcs) != len(res) {
		return fmt.Errorf("prefix: %q: publish: %d reservations but %d checksums: %w", s.name, len(res), len(crcs), ErrBadConfig)
	}
	var lost error
	var bytes, n uint64
	err := s.locked(func() {
		now := uint64(time.Now().UnixNano())
		for k := range res {
			r := &res[k]
			if r.Status != Reserved {
				continue
			}
			e := s.entry(r.entry)
			if atomic.LoadUint64(u64At(e, entWord)) != r.word || atomic.LoadUint64(u64At(e, entOwner)) != s.c.Token() {
				lost = fmt.Errorf("prefix: %q: publish %v: %w", s.name, r.Key, ErrLost)
				continue
			}
			atomic.StoreUint32(u32At(e, entCRC), crcs[k])
			atomic.StoreUint64(u64At(e, entAccess), now)
			s.linkHead(r.entry, now)
			atomic.StoreUint64(u64At(e, entWord), mkWord(wordGen(r.word), stReady))
			s.publishEntry(r.entry)
			s.hdrAdd(hdrReserved, -1)
			s.hdrAdd(hdrReady, 1)
			bytes += uint64(r.Len)
			n++
		}
	})
	s.count(ctrInserts, n)
	s.count(ctrBytesIn, bytes)
	if err != nil {
		return err
	}
	return lost
}

// Abort gives back reservations that will not be published.
func (s *Store) Abort(res []Reservation) error {
	return s.locked(func() {
		for k := range res {
			r := &res[k]
			if r.Status != Reserved {
				continue
			}
			e := s.entry(r.entry)
			if atomic.LoadUint64(u64At(e, entWord)) == r.word && atomic.LoadUint64(u64At(e, entOwner)) == s.c.Token() {
				s.dropLocked(r.entry)
			}
		}
	})
}

// Delete removes keys' ready entries. Keys not present are skipped; an
// entry pinned by a reader is left in place and reported with ErrPinned.
func (s *Store) Delete(keys []Key) (int, error) {
	if err := s.entries("delete"); err != nil {
		return 0, err
	}
	deleted := 0
	var ferr error
	err := s.locked(func() {
		cands := map[uint64]uint32{}
		for n := range keys {
			i, w, ok := s.find(&keys[n])
			if !ok || wordState(w) != stReady {
				continue
			}
			if atomic.CompareAndSwapUint64(u64At(s.entry(i), entWord), w, mkWord(wordGen(w), stEvicting)) {
				cands[pinValue(i, w)] = i
			}
		}
		pinned := s.scanPins(cands)
		for v, i := range cands {
			if pinned[v] {
				s.unmarkEvicting(i)
				ferr = fmt.Errorf("prefix: %q: delete %v: %w", s.name, Key(s.keyOf(i)), ErrPinned)
				continue
			}
			s.dropLocked(i)
			deleted++
		}
	})
	if err == nil {
		err = ferr
	}
	return deleted, err
}

func (s *Store) keyOf(i uint32) Key {
	var k Key
	e := s.entry(i)
	for w := 0; w < 4; w++ {
		putLeU64(k[8*w:], atomic.LoadUint64(u64At(e, entKey+8*w)))
	}
	return k
}

func (s *Store) unmarkEvicting(i uint32) {
	p := u64At(s.entry(i), entWord)
	w := atomic.LoadUint64(p)
	atomic.StoreUint64(p, mkWord(wordGen(w), stReady))
	s.unlink(i)
	s.linkHead(i, uint64(time.Now().UnixNano()))
	s.publishEntry(i)
}

// dropLocked frees entry i (reserved, ready or evicting) and its block, and
// leaves a tombstone that probes walk past.
func (s *Store) dropLocked(i uint32) {
	e := s.entry(i)
	w := atomic.LoadUint64(u64At(e, entWord))
	switch wordState(w) {
	case stReady, stEvicting:
		s.unlink(i)
		s.hdrAdd(hdrReady, -1)
	case stReserved:
		s.hdrAdd(hdrReserved, -1)
	default:
		return
	}
	if b := atomic.LoadUint32(u32At(e, entBlock)); int64(b) < s.g.Blocks && atomic.LoadUint32(s.owner(b)) == i+1 {
		atomic.StoreUint32(s.owner(b), 0)
		s.hdrAdd(hdrUsedBlocks, -1)
		s.publishOwner(b)
		// The next allocations take the blocks just freed: an insert
		// that evicted finds its block at once instead of scanning a
		// full owner table (and pulling its lines from other cores).
		if len(s.freed) < cap(s.freed) {
			s.freed = append(s.freed, b)
		}
	}
	atomic.StoreUint64(u64At(e, entWord), mkWord(wordGen(w)+1, stDeleted))
	s.hdrAdd(hdrTombstones, 1)
	s.publishEntry(i)
	s.clearTombstones(i)
}

// clearTombstones turns the run of tombstones ending at i back into empty
// entries when the entry after i is empty: no probe can need to walk past
// them any more.
func (s *Store) clearTombstones(i uint32) {
	mask := uint32(s.g.Entries - 1)
	if wordState(atomic.LoadUint64(u64At(s.entry((i+1)&mask), entWord))) != stEmpty {
		return
	}
	for n := int64(0); n < s.g.Entries; n++ {
		p := u64At(s.entry(i), entWord)
		w := atomic.LoadUint64(p)
		if wordState(w) != stDeleted {
			return
		}
		atomic.StoreUint64(p, mkWord(wordGen(w)+1, stEmpty))
		s.hdrAdd(hdrTombstones, -1)
		s.publishEntry(i)
		i = (i - 1) & mask
	}
}

// linkHead puts entry i at the most recent end of the LRU list.
// linkedEntry resolves an LRU link word (entry index + 1, 0 for none). A
// word beyond the table is damage, not a reason to fault: it marks the
// list for rebuilding from the entries (repairLocked, before the lock
// holder lets go) and reads as no link.
func (s *Store) linkedEntry(v uint32) (uint32, bool) {
	if v == 0 {
		return 0, false
	}
	if int64(v) > s.g.Entries {
		s.lruDamaged = true
		return 0, false
	}
	return v - 1, true
}

func (s *Store) linkHead(i uint32, now uint64) {
	e := s.entry(i)
	head := atomic.LoadUint32(s.hdrU32(hdrLRUHead))
	atomic.StoreUint32(u32At(e, entPrev), 0)
	atomic.StoreUint32(u32At(e, entNext), head)
	at := now &^ 1 // even: the first hit after this makes entAccess odd and greater (touch)
	atomic.StoreUint64(u64At(e, entLinkedAt), at)
	atomic.StoreUint64(u64At(e, entAccess), at)
	if h, ok := s.linkedEntry(head); ok {
		atomic.StoreUint32(u32At(s.entry(h), entPrev), i+1)
	} else if head == 0 {
		atomic.StoreUint32(s.hdrU32(hdrLRUTail), i+1)
	}
	atomic.StoreUint32(s.hdrU32(hdrLRUHead), i+1)
}

func (s *Store) unlink(i uint32) {
	e := s.entry(i)
	prev, next := atomic.LoadUint32(u32At(e, entPrev)), atomic.LoadUint32(u32At(e, entNext))
	if p, ok := s.linkedEntry(prev); ok {
		atomic.StoreUint32(u32At(s.entry(p), entNext), next)
	} else if atomic.LoadUint32(s.hdrU32(hdrLRUHead)) == i+1 {
		atomic.StoreUint32(s.hdrU32(hdrLRUHead), next)
	}
	if n, ok := s.linkedEntry(next); ok {
		atomic.StoreUint32(u32At(s.entry(n), entPrev), prev)
	} else if atomic.LoadUint32(s.hdrU32(hdrLRUTail)) == i+1 {
		atomic.StoreUint32(s.hdrU32(hdrLRUTail), prev)
	}
	atomic.StoreUint32(u32At(e, entPrev), 0)
	atomic.StoreUint32(u32At(e, entNext), 0)
}
