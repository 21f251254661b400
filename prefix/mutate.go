package prefix

import (
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
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
	mac   [macBytes]byte // a keyed index's signature of the payload, set by the writer before Publish
}

// locked runs fn under shard sh's lock: its process mutex, then its tier
// lock. A dirty flag left set means the last holder died mid-mutation:
// repair the shard from its entries first.
//
// A panic in fn (a bug; the C library recovers it into an error) must not
// keep the tier lock, which every client on every host would then wait
// for until this process died: the lock goes back with the dirty flag
// still set, so the next holder repairs the shard as if this holder had
// died, and the handle is poisoned (ErrPoisoned) before the panic goes on.
func (s *Store) locked(sh *shard, fn func()) error {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if s.sim != nil {
		s.sim.awaitLock(s.c, sh.lock)
	}
	if err := s.c.Lock(sh.lock); err != nil {
		return fmt.Errorf("prefix: %q: %w", s.name, err)
	}
	if err := s.current(); err != nil {
		s.c.Unlock(sh.lock)
		return err
	}
	done := false
	defer func() {
		if !done {
			s.poisoned.Store(true)
			s.c.Unlock(sh.lock)
		}
	}()
	s.refreshMeta(sh.stateOff, lineSize)
	dirty := u64At(sh.state, slDirty)
	if atomic.LoadUint64(dirty) != 0 || !sh.countsPlausible() {
		s.repairLocked(sh)
	}
	atomic.StoreUint64(dirty, s.c.Token())
	s.publishMeta(sh.stateOff, lineSize)
	sh.freed = sh.freed[:0]
	sound := invariants && s.violations(sh) == nil
	fn()
	if sh.lruDamaged {
		s.repairLocked(sh)
	}
	if 4*sh.count(slTombstones) > sh.entries() {
		s.sweepTombstones(sh)
	}
	if sound {
		if v := s.violations(sh); v != nil {
			panic(fmt.Sprintf("prefix: %q: invariants: shard %d broken by a mutation: %s", s.name, sh.k, strings.Join(v, "; ")))
		}
	}
	atomic.StoreUint64(dirty, 0)
	s.publishMeta(sh.stateOff, lineSize)
	done = true
	if err := s.c.Unlock(sh.lock); err != nil {
		return fmt.Errorf("prefix: %q: %w", s.name, err)
	}
	return nil
}

// eachShard runs fn under each shard's lock in turn.
func (s *Store) eachShard(fn func(sh *shard)) error {
	for k := range s.shards {
		sh := &s.shards[k]
		if err := s.locked(sh, func() { fn(sh) }); err != nil {
			return err
		}
	}
	return nil
}

// Reserve reserves a block for each key's payload of sizes[i] bytes,
// evicting least recently used unpinned entries when blocks run out. Keys
// present already (or twice in the batch) come back as Exists.
func (s *Store) Reserve(keys []Key, sizes []int64) ([]Reservation, error) {
	held, herr := s.hold("reserve")
	if herr != nil {
		return nil, herr
	}
	defer held.Done()
	out, err := s.newReservations(keys, sizes)
	if err != nil {
		return nil, err
	}
	var ferr error
	now := uint64(time.Now().UnixNano()) // once a call: the clock is slow on some machines
	err = s.byKeyShard(keys, func(sh *shard, idx []int) error {
		return s.locked(sh, func() { ferr = errors.Join(ferr, s.reserveLocked(sh, out, idx, now)) })
	})
	if err == nil {
		err = ferr
	}
	return out, err
}

// newReservations checks a reservation's arguments and returns its
// reservations, each NoSpace until a block is found.
func (s *Store) newReservations(keys []Key, sizes []int64) ([]Reservation, error) {
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
	for n := range keys {
		out[n] = Reservation{Key: keys[n], Len: sizes[n], Status: NoSpace}
	}
	return out, nil
}

// byKeyShard is byShard over keys, each key's home entry loaded before its
// shard's lock is taken, so that the probes' first misses are not paid
// while holding it. Loads, not touchHomes' prefetches: the lines must be
// in when the lock is taken, and a shard's share of a batch is a few keys,
// whose loads the core overlaps.
func (s *Store) byKeyShard(keys []Key, fn func(sh *shard, idx []int) error) error {
	return s.byShard(len(keys), func(n int) *shard { return s.shardOfKey(&keys[n]) }, func(sh *shard, idx []int) error {
		for _, n := range idx {
			atomic.LoadUint64(u64At(s.entry(s.home(&keys[n])), entWord))
		}
		return fn(sh, idx)
	})
}

// reserveLocked reserves out[n] for each n of idx, all of shard sh, whose
// lock the caller holds.
func (s *Store) reserveLocked(sh *shard, out []Reservation, idx []int, now uint64) error {
	for m, n := range idx {
		if err := s.reserveOne(sh, &out[n], len(idx)-m, now); err != nil {
			out[n].Status = NoSpace
			return err
		}
	}
	return nil
}

// evictAheadOf: an eviction frees at least 1/evictAheadOf of the shard's
// blocks. A batch's keys spread over the shards, a few to each, and an
// eviction pays one scan of every client's pins however many it frees, so
// the next inserts into the shard find blocks ready instead of paying
// again; the blocks left free for a moment cost under 1% of the capacity.
// (Small shards evict exactly what they need.)
const evictAheadOf = 128

func (s *Store) reserveOne(sh *shard, res *Reservation, left int, now uint64) error {
	i, found, err := s.probeInsert(&res.Key)
	if err != nil {
		return err
	}
	if found && s.deadReservation(i) {
		// Its reserver is proven gone (an uplink killed mid-fill, with no
		// daemon to reclaim what it held): the key is this insert's now,
		// or no one would ever fill it.
		s.dropLocked(i)
		s.count(ctrReclaimed, 1)
		if i, found, err = s.probeInsert(&res.Key); err != nil {
			return err
		}
	}
	if found {
		res.Status = Exists
		return nil
	}
	b, ok := s.allocBlock(sh)
	if !ok {
		s.evictLocked(sh, max(left, int(sh.blocks/evictAheadOf)))
		if b, ok = s.allocBlock(sh); !ok {
			s.reclaimLocked(sh, true)
			b, ok = s.allocBlock(sh)
		}
		if ok {
			// Eviction dropped entries and may have turned tombstones on
			// k's probe path back into empty entries; the slot found before
			// could now sit behind an empty one, out of reach. Probe again.
			if i, _, err = s.probeInsert(&res.Key); err != nil {
				s.freeBlock(sh, b)
				return err
			}
		}
	}
	if !ok {
		res.Status = NoSpace
		return nil
	}
	e := s.lockedEntry(i)
	w := atomic.LoadUint64(u64At(e, entWord))
	if wordState(w) == stDeleted {
		sh.add(slTombstones, -1)
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
	atomic.StoreUint32(s.owner(sh, b), i+1)
	sh.add(slReserved, 1)
	s.publishEntry(i)
	s.publishOwner(sh, b)
	res.Status, res.entry, res.Block, res.Offset = Reserved, i, b, s.blockAt(b)
	return nil
}

// probeInsert finds k's entry, or the first free entry on its probe path.
func (s *Store) probeInsert(k *Key) (uint32, bool, error) {
	sh, i := s.homeOf(k)
	free := int64(-1)
	for n := int64(0); n <= int64(sh.mask); n++ {
		e := s.lockedEntry(i)
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
		i = sh.next(i)
	}
	if free >= 0 {
		return uint32(free), false, nil
	}
	return 0, false, fmt.Errorf("%w: %d entries in shard %d", ErrIndexFull, sh.entries(), sh.k)
}

// allocBlock takes a free block of the shard, scanning from its hint.
func (s *Store) allocBlock(sh *shard) (uint32, bool) {
	if sh.count(slUsedBlocks) >= int64(sh.blocks) {
		return 0, false
	}
	for len(sh.freed) > 0 {
		b := sh.freed[len(sh.freed)-1]
		sh.freed = sh.freed[:len(sh.freed)-1]
		if sh.holdsBlock(b) && atomic.LoadUint32(s.owner(sh, b)) == 0 {
			sh.add(slUsedBlocks, 1)
			return b, true
		}
	}
	for {
		b, ok := s.popStray(sh)
		if !ok {
			break
		}
		if sh.holdsBlock(b) && atomic.LoadUint32(s.owner(sh, b)) == 0 {
			sh.add(slUsedBlocks, 1)
			return b, true
		}
	}
	hint := sh.count(slBlockHint)
	for n := int64(0); n < int64(sh.blocks); n++ {
		b := sh.block0 + uint32((hint+n)%int64(sh.blocks))
		if atomic.LoadUint32(s.owner(sh, b)) == 0 {
			atomic.StoreUint32(sh.u32(slBlockHint), uint32((int64(b-sh.block0)+1)%int64(sh.blocks)))
			sh.add(slUsedBlocks, 1)
			return b, true
		}
	}
	return 0, false
}

// nearHint: how far from the scan hint a freed block is still expected.
// Evictions free the oldest entries, whose blocks were allocated one scan
// round ago and so lie at the hint, give or take the few places by which
// their publish order differs from their allocation order (two processes
// interleave their reserves and publishes). A block freed just behind the
// hint would be found only by a walk round the whole shard, once every
// block ahead is taken: in a two-process insert run 2.5% of allocations
// walked ~2000 owner words before the hint learned to step back.
const nearHint = 64

// noteFreed makes block b, just freed, easy for the next allocation to
// find: a block just behind the scan hint moves the hint back to it (the
// scan then walks at most nearHint used blocks forward again); a block far
// from the hint, one whose entry was published long after its allocation,
// goes to the shard's stray list while the list has room.
func (s *Store) noteFreed(sh *shard, b uint32) {
	n := int64(sh.blocks)
	hint, at := sh.count(slBlockHint)%n, int64(b-sh.block0)
	ahead := (at - hint + n) % n
	switch {
	case ahead <= nearHint:
	case n-ahead <= nearHint:
		atomic.StoreUint32(sh.u32(slBlockHint), uint32(at))
	default:
		if k := atomic.LoadUint32(sh.u32(slStrays)); k < strayWords {
			atomic.StoreUint32(sh.u32(slStray+4*int(k)), b)
			atomic.StoreUint32(sh.u32(slStrays), k+1)
		}
	}
}

// popStray takes the last block named in the shard's stray list (see
// noteFreed). The words are a hint that may be stale or damaged: the
// caller checks the block is the shard's and free.
func (s *Store) popStray(sh *shard) (uint32, bool) {
	n := min(atomic.LoadUint32(sh.u32(slStrays)), strayWords)
	if n == 0 {
		return 0, false
	}
	n--
	atomic.StoreUint32(sh.u32(slStrays), n)
	return atomic.LoadUint32(sh.u32(slStray + 4*int(n))), true
}

// freeBlock gives back a block allocBlock took that no entry owns yet.
func (s *Store) freeBlock(sh *shard, b uint32) {
	sh.add(slUsedBlocks, -1)
}

// Checksum is the CRC-32C that Publish takes and Hit.CRC holds for key k
// and payload: of the key's 32 bytes then the payload on an index of
// layout 5 or later, of the payload alone before.
func (s *Store) Checksum(k Key, payload []byte) uint32 {
	return crc32.Update(s.g.crcSeed(&k), castagnoli, payload)
}

// Publish makes reserved entries visible: call it after their payloads are
// completely written (and, on a non-coherent tier, flushed), with each
// entry's checksum as Checksum computes it. It fails with ErrLost for
// reservations a reaper took back, after publishing the others.
func (s *Store) Publish(res []Reservation, crcs []uint32) error {
	held, herr := s.hold("publish")
	if herr != nil {
		return herr
	}
	defer held.Done()
	if len(crcs) != len(res) {
		return fmt.Errorf("prefix: %q: publish: %d reservations but %d checksums: %w", s.name, len(res), len(crcs), ErrBadConfig)
	}
	var lost error
	var bytes, n uint64
	now := uint64(time.Now().UnixNano())
	err := s.byShard(len(res), func(k int) *shard { return s.shardOfKey(&res[k].Key) }, func(sh *shard, idx []int) error {
		return s.locked(sh, func() {
			for _, k := range idx {
				switch ok, err := s.publishOne(sh, &res[k], crcs[k], now); {
				case err != nil:
					lost = err
				case ok:
					bytes += uint64(res[k].Len)
					n++
				}
			}
		})
	})
	s.count(ctrInserts, n)
	s.count(ctrBytesIn, bytes)
	if errors.Is(err, tier.ErrLeaseLost) {
		// A client without its lease has had every reservation reclaimed.
		return fmt.Errorf("prefix: %q: publish: %w: %w", s.name, ErrLost, err)
	}
	if err != nil {
		return err
	}
	return lost
}

// publishOne makes r's entry ready with checksum crc, under the lock of
// its shard sh; it reports whether it did, and ErrLost when a reaper took
// the reservation back.
func (s *Store) publishOne(sh *shard, r *Reservation, crc uint32, now uint64) (bool, error) {
	if r.Status != Reserved {
		return false, nil
	}
	if !sh.holds(r.entry) {
		return false, s.lost(r)
	}
	e := s.lockedEntry(r.entry)
	if atomic.LoadUint64(u64At(e, entWord)) != r.word || atomic.LoadUint64(u64At(e, entOwner)) != s.c.Token() {
		return false, s.lost(r)
	}
	atomic.StoreUint32(u32At(e, entCRC), crc)
	if s.mac != nil {
		storeMAC(e, r.mac)
	}
	s.linkHead(r.entry, now) // stamps the access word too
	atomic.StoreUint64(u64At(e, entWord), mkWord(wordGen(r.word), stReady))
	s.publishEntry(r.entry)
	sh.add(slReserved, -1)
	sh.add(slReady, 1)
	return true, nil
}

func (s *Store) lost(r *Reservation) error {
	return fmt.Errorf("prefix: %q: publish %v: %w", s.name, r.Key, ErrLost)
}

// Abort gives back reservations that will not be published.
func (s *Store) Abort(res []Reservation) error {
	held, herr := s.holdToRelease("abort")
	if herr != nil {
		return herr
	}
	defer held.Done()
	return s.byShard(len(res), func(k int) *shard { return s.shardOfKey(&res[k].Key) }, func(sh *shard, idx []int) error {
		return s.locked(sh, func() {
			for _, k := range idx {
				r := &res[k]
				if r.Status != Reserved || !sh.holds(r.entry) {
					continue
				}
				e := s.lockedEntry(r.entry)
				if atomic.LoadUint64(u64At(e, entWord)) == r.word && atomic.LoadUint64(u64At(e, entOwner)) == s.c.Token() {
					s.dropLocked(r.entry)
				}
			}
		})
	})
}

// Delete removes keys' ready entries. Keys not present are skipped; an
// entry pinned by a reader is left in place and reported with ErrPinned.
func (s *Store) Delete(keys []Key) (int, error) {
	held, herr := s.hold("delete")
	if herr != nil {
		return 0, herr
	}
	defer held.Done()
	if err := s.entries("delete"); err != nil {
		return 0, err
	}
	deleted := 0
	var ferr error
	err := s.byShard(len(keys), func(n int) *shard { return s.shardOfKey(&keys[n]) }, func(sh *shard, idx []int) error {
		return s.locked(sh, func() {
			cands, pinned := sh.cands, sh.pinned
			clear(cands)
			for _, n := range idx {
				i, w, ok := s.find(&keys[n])
				if !ok || wordState(w) != stReady {
					continue
				}
				if atomic.CompareAndSwapUint64(u64At(s.lockedEntry(i), entWord), w, mkWord(wordGen(w), stEvicting)) {
					s.publishEntry(i) // before the pin scan: readers must see the mark
					cands[pinValue(i, w)] = i
				}
			}
			s.scanPins(cands, pinned)
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
	p := u64At(s.lockedEntry(i), entWord)
	w := atomic.LoadUint64(p)
	atomic.StoreUint64(p, mkWord(wordGen(w), stReady))
	s.unlink(i)
	s.linkHead(i, uint64(time.Now().UnixNano()))
	s.publishEntry(i)
}

// dropLocked frees entry i (reserved, ready or evicting) and its block, and
// leaves a tombstone that probes walk past, or an empty entry where no
// probe needs to. The caller holds i's shard.
func (s *Store) dropLocked(i uint32) {
	sh := s.shardOfEntry(i)
	e := s.lockedEntry(i)
	w := atomic.LoadUint64(u64At(e, entWord))
	switch wordState(w) {
	case stReady, stEvicting:
		s.unlink(i)
		sh.add(slReady, -1)
	case stReserved:
		sh.add(slReserved, -1)
	default:
		return
	}
	if b := atomic.LoadUint32(u32At(e, entBlock)); sh.holdsBlock(b) && atomic.LoadUint32(s.owner(sh, b)) == i+1 {
		s.freeBlockLocked(sh, b)
	} else {
		s.freeOwnedByLocked(sh, i)
	}
	atomic.StoreUint64(u64At(e, entWord), mkWord(wordGen(w)+1, stDeleted))
	sh.add(slTombstones, 1)
	s.publishEntry(i)
	s.clearTombstones(sh, i)
}

// freeBlockLocked gives block b of sh back to the allocator.
func (s *Store) freeBlockLocked(sh *shard, b uint32) {
	atomic.StoreUint32(s.owner(sh, b), 0)
	sh.add(slUsedBlocks, -1)
	s.publishOwner(sh, b)
	// The next allocations take the blocks just freed: an insert
	// that evicted finds its block at once instead of scanning a
	// full owner table (and pulling its lines from other cores).
	if len(sh.freed) < cap(sh.freed) {
		sh.freed = append(sh.freed, b)
	}
	s.noteFreed(sh, b)
}

// freeOwnedByLocked frees the blocks the owner table gives entry i when
// the entry's own block word does not name one of them: that word is
// shared memory a stray write can change, and trusting it left the
// entry's real block owned by a deleted entry for good. The scan of the
// owner table runs only on such damage.
func (s *Store) freeOwnedByLocked(sh *shard, i uint32) {
	for b := sh.block0; b-sh.block0 < sh.blocks; b++ {
		if atomic.LoadUint32(s.owner(sh, b)) == i+1 {
			s.freeBlockLocked(sh, b)
		}
	}
}

// clearTombstones turns the run of tombstones ending at i back into empty
// entries when no probe needs to walk past i: no key stored between i and
// the next empty entry has its home at or before i. (A probe path never
// crosses an empty entry, so keys beyond that one cannot need i, nor the
// tombstones just before it.) Without it tombstones pile up under churn
// until sweepTombstones, a pass over the whole shard under its lock, runs.
func (s *Store) clearTombstones(sh *shard, i uint32) {
	if s.pathCrosses(sh, i) {
		return
	}
	for n := int64(0); n < sh.entries(); n++ {
		p := u64At(s.lockedEntry(i), entWord)
		w := atomic.LoadUint64(p)
		if wordState(w) != stDeleted {
			return
		}
		atomic.StoreUint64(p, mkWord(wordGen(w)+1, stEmpty))
		sh.add(slTombstones, -1)
		s.publishEntry(i)
		i = sh.entry0 + (i-sh.entry0-1)&sh.mask
	}
}

// pathCrosses reports whether the probe path of a key stored after entry
// i, up to the next empty entry, runs through i. A key whose home is not
// in the shard (damage: Check reports it) counts as crossing: keeping a
// tombstone is always safe.
func (s *Store) pathCrosses(sh *shard, i uint32) bool {
	at := i - sh.entry0 // offsets within the shard, for cyclic distances
	q := sh.next(i)
	for n := int64(1); n < sh.entries(); n, q = n+1, sh.next(q) {
		switch wordState(atomic.LoadUint64(u64At(s.lockedEntry(q), entWord))) {
		case stEmpty:
			return false
		case stDeleted:
			continue
		}
		k := s.keyOf(q)
		h := s.home(&k)
		if !sh.holds(h) {
			return true
		}
		// Does the path [h, q) hold i? Distances are counted forward
		// from h, round the shard's ring.
		if (at-(h-sh.entry0))&sh.mask < (q-h)&sh.mask {
			return true
		}
	}
	return true // no empty entry at all: every path may wrap through i
}

// linkedEntry resolves an LRU link word of shard sh (entry index + 1, 0
// for none). A word naming no entry of the shard is damage, not a reason
// to fault: it marks the list for rebuilding from the entries
// (repairLocked, before the lock holder lets go) and reads as no link.
func (s *Store) linkedEntry(sh *shard, v uint32) (uint32, bool) {
	if v == 0 {
		return 0, false
	}
	if !sh.holds(v - 1) {
		sh.lruDamaged = true
		return 0, false
	}
	return v - 1, true
}

// linkHead puts entry i at the most recent end of its shard's LRU list.
func (s *Store) linkHead(i uint32, now uint64) {
	sh := s.shardOfEntry(i)
	e := s.lockedEntry(i)
	head := atomic.LoadUint32(sh.u32(slLRUHead))
	atomic.StoreUint32(u32At(e, entPrev), 0)
	atomic.StoreUint32(u32At(e, entNext), head)
	at := now &^ 1 // even: the first hit after this makes entAccess odd and greater (touch)
	atomic.StoreUint64(u64At(e, entLinkedAt), at)
	atomic.StoreUint64(u64At(e, entAccess), at)
	if h, ok := s.linkedEntry(sh, head); ok {
		atomic.StoreUint32(u32At(s.lockedEntry(h), entPrev), i+1)
		s.publishEntry(h)
	} else if head == 0 {
		atomic.StoreUint32(sh.u32(slLRUTail), i+1)
	}
	atomic.StoreUint32(sh.u32(slLRUHead), i+1)
	s.publishEntry(i)
}

func (s *Store) unlink(i uint32) {
	sh := s.shardOfEntry(i)
	e := s.lockedEntry(i)
	prev, next := atomic.LoadUint32(u32At(e, entPrev)), atomic.LoadUint32(u32At(e, entNext))
	if p, ok := s.linkedEntry(sh, prev); ok {
		atomic.StoreUint32(u32At(s.lockedEntry(p), entNext), next)
		s.publishEntry(p)
	} else if atomic.LoadUint32(sh.u32(slLRUHead)) == i+1 {
		atomic.StoreUint32(sh.u32(slLRUHead), next)
	}
	if n, ok := s.linkedEntry(sh, next); ok {
		atomic.StoreUint32(u32At(s.lockedEntry(n), entPrev), prev)
		s.publishEntry(n)
	} else if atomic.LoadUint32(sh.u32(slLRUTail)) == i+1 {
		atomic.StoreUint32(sh.u32(slLRUTail), prev)
	}
	atomic.StoreUint32(u32At(e, entPrev), 0)
	atomic.StoreUint32(u32At(e, entNext), 0)
	s.publishEntry(i)
}

// deadReservation reports whether entry i is a reservation of a client
// other than this one that no longer runs (tier.Region.TokenRuns: its
// lease ended, or its process is proven gone). The caller holds the
// entry's shard lock.
func (s *Store) deadReservation(i uint32) bool {
	e := s.lockedEntry(i)
	if wordState(atomic.LoadUint64(u64At(e, entWord))) != stReserved {
		return false
	}
	owner := atomic.LoadUint64(u64At(e, entOwner))
	return owner != s.c.Token() && !s.r.TokenRuns(owner)
}
