package prefix

import (
	"slices"
	"sync/atomic"
	"time"
)

// evictLocked frees at least need blocks if it can by evicting the least
// recently used ready entries that no client has pinned. Entries hit since
// they were linked get a second chance at the head instead (lookups only
// stamp an access time, so they never take the lock). It returns how many
// it freed. Reserve asks for the rest of its batch at once, so the pin scan
// (every live client's pin table) is paid once per batch, not per key.
func (s *Store) evictLocked(sh *shard, need int) int {
	want := need
	freed := 0
	budget := 2*sh.count(slReady) + int64(want)
	cands, pinned := sh.cands, sh.pinned
	relinked := false
	for freed < need && budget > 0 {
		clear(cands)
		for len(cands) < want-freed && budget > 0 {
			budget--
			tail := atomic.LoadUint32(sh.u32(slLRUTail))
			if tail == 0 {
				// An empty list with ready entries counted is a damaged
				// list (a stray write of 0 would stop eviction for good):
				// relink it from the entries, once a call.
				if !relinked && sh.count(slReady) > 0 {
					relinked = true
					s.repairLocked(sh)
					continue
				}
				break
			}
			i, ok := s.linkedEntry(sh, tail)
			if !ok || sh.lruDamaged { // rebuild the list from the entries, then go on
				s.repairLocked(sh)
				continue
			}
			e := s.lockedEntry(i)
			w := atomic.LoadUint64(u64At(e, entWord))
			if wordState(w) != stReady {
				s.unlink(i) // only ready entries belong on the list
				continue
			}
			s.unlink(i)
			if atomic.LoadUint64(u64At(e, entAccess)) > atomic.LoadUint64(u64At(e, entLinkedAt)) {
				s.linkHead(i, uint64(time.Now().UnixNano()))
				continue
			}
			atomic.StoreUint64(u64At(e, entWord), mkWord(wordGen(w), stEvicting))
			s.publishEntry(i)
			cands[pinValue(i, w)] = i
		}
		if len(cands) == 0 {
			break
		}
		s.scanPins(cands, pinned)
		for v, i := range cands {
			if pinned[v] {
				p := u64At(s.lockedEntry(i), entWord)
				atomic.StoreUint64(p, mkWord(wordGen(atomic.LoadUint64(p)), stReady))
				s.linkHead(i, uint64(time.Now().UnixNano()))
				s.publishEntry(i)
				continue
			}
			// dropLocked unlinks only what is linked; the entry is off the list.
			s.dropLocked(i)
			freed++
		}
	}
	s.count(ctrEvictions, uint64(freed))
	return freed
}

// scanPins sets pinned to which of cands (pin values) a live client has
// pinned.
func (s *Store) scanPins(cands map[uint64]uint32, pinned map[uint64]bool) {
	clear(pinned)
	if len(cands) == 0 {
		return
	}
	s.eachLivePin(func(v uint64) {
		if _, ok := cands[v]; ok {
			pinned[v] = true
		}
	})
}

// eachLivePin calls fn with every pin record that a client that may still
// run holds (tier.Region.TokenRuns: its lease is live and its process not
// proven gone, so a client killed with no daemon to reap it pins nothing),
// each pin table's header and records in use reloaded first on a
// non-coherent tier.
func (s *Store) eachLivePin(fn func(v uint64)) {
	for slot := 0; int64(slot) < s.g.Clients; slot++ {
		off := s.g.PinsOff + int64(slot)*s.g.PinStride
		s.refreshMeta(off, pinHeaderSize)
		h := s.metaSlice(off, pinHeaderSize)
		// A table whose mark is zero holds no pin: skipped before the
		// lease lookup, as most slots are (free, or clients that insert).
		hw := int64(atomic.LoadUint32(u32At(h, pinHdrHighWater)))
		if hw == 0 {
			continue
		}
		tok := atomic.LoadUint64(u64At(h, pinHdrToken))
		if tok == 0 || !s.r.TokenRuns(tok) {
			continue
		}
		hw = min(hw, s.g.Pins)
		s.refreshMeta(off+s.g.pinHeader(), hw*pinRecordSize) // the records in use, not the whole table
		for j := int64(0); j < hw; j++ {
			if v := atomic.LoadUint64(s.pinRecord(slot, j)); v != 0 {
				fn(v)
			}
		}
	}
}

// Reclaim drops reservations whose clients died before publishing, and
// returns how many. The daemon calls it after reaping clients; inserts call
// it when they find no space.
func (s *Store) Reclaim() (int, error) {
	held, herr := s.hold("reclaim")
	if herr != nil {
		return 0, herr
	}
	defer held.Done()
	n := 0
	err := s.eachShard(func(sh *shard) { n += s.reclaimLocked(sh, false) })
	return n, err
}

// reclaimLocked drops the reservations of dead clients in sh. Its count
// of reservations lets the daemon's pass skip a shard that has none; an
// insert out of space (full) scans whatever the count says, since the
// count is shared memory a stray write can zero, and it recounts: the
// reservations left are the count from then on.
func (s *Store) reclaimLocked(sh *shard, full bool) int {
	if !full && sh.count(slReserved) == 0 {
		return 0
	}
	n, left := 0, 0
	// Whether an owner runs is asked once per owner and pass (it reads
	// procfs): a large batch's own reservations would otherwise cost a
	// procfs read each, at every reclaim of the batch (quadratic). Our
	// own reservations are never taken.
	runs := map[uint64]bool{s.c.Token(): true}
	for i := sh.entry0; int64(i-sh.entry0) < sh.entries(); i++ {
		e := s.lockedEntry(i)
		if wordState(atomic.LoadUint64(u64At(e, entWord))) != stReserved {
			continue
		}
		owner := atomic.LoadUint64(u64At(e, entOwner))
		alive, asked := runs[owner]
		if !asked {
			alive = s.r.TokenRuns(owner)
			runs[owner] = alive
		}
		if !alive {
			s.dropLocked(i)
			n++
		} else {
			left++
		}
	}
	if full && sh.count(slReserved) != int64(left) {
		atomic.StoreUint32(sh.u32(slReserved), uint32(left))
		s.publishMeta(sh.stateOff&^(lineSize-1), lineSize)
	}
	s.count(ctrReclaimed, uint64(n))
	return n
}

// repairLocked rebuilds everything of shard sh derived from its entries
// after a lock holder died mid-mutation: half-evicted entries return to
// ready, block ownership follows the entries (a block two entries claim
// keeps the first; the other entry is dropped, as is one naming a block of
// another shard), the LRU list is relinked by access time, and the counts
// are recomputed.
func (s *Store) repairLocked(sh *shard) {
	claim := make([]uint32, sh.blocks)
	var ready []uint32
	var nReserved, nTomb int32
	for i := sh.entry0; int64(i-sh.entry0) < sh.entries(); i++ {
		e := s.lockedEntry(i)
		p := u64At(e, entWord)
		w := atomic.LoadUint64(p)
		st := wordState(w)
		if st == stEvicting {
			st = stReady
			atomic.StoreUint64(p, mkWord(wordGen(w), stReady))
		}
		switch st {
		case stDeleted:
			nTomb++
			continue
		case stReady, stReserved:
		default:
			continue
		}
		b := atomic.LoadUint32(u32At(e, entBlock))
		if !sh.holdsBlock(b) || claim[b-sh.block0] != 0 || int64(atomic.LoadUint32(u32At(e, entLen))) > s.g.BlockBytes {
			atomic.StoreUint64(p, mkWord(wordGen(w)+1, stDeleted))
			nTomb++
			continue
		}
		claim[b-sh.block0] = i + 1
		if st == stReady {
			ready = append(ready, i)
		} else {
			nReserved++
		}
		atomic.StoreUint32(u32At(e, entPrev), 0)
		atomic.StoreUint32(u32At(e, entNext), 0)
	}
	var used int32
	for b := range claim {
		if claim[b] != 0 {
			used++
		}
		atomic.StoreUint32(s.owner(sh, sh.block0+uint32(b)), claim[b])
	}
	slices.SortFunc(ready, func(a, b uint32) int {
		ta, tb := atomic.LoadUint64(u64At(s.entry(a), entAccess)), atomic.LoadUint64(u64At(s.entry(b), entAccess))
		switch {
		case ta < tb:
			return -1
		case ta > tb:
			return 1
		}
		return 0
	})
	atomic.StoreUint32(sh.u32(slLRUHead), 0)
	atomic.StoreUint32(sh.u32(slLRUTail), 0)
	sh.lruDamaged = false
	for _, i := range ready {
		s.linkHead(i, atomic.LoadUint64(u64At(s.entry(i), entAccess)))
	}
	atomic.StoreUint32(sh.u32(slReady), uint32(len(ready)))
	atomic.StoreUint32(sh.u32(slReserved), uint32(nReserved))
	atomic.StoreUint32(sh.u32(slTombstones), uint32(nTomb))
	atomic.StoreUint32(sh.u32(slUsedBlocks), uint32(used))
	atomic.StoreUint32(sh.u32(slStrays), 0)
	s.publishMeta(0, s.g.PinsOff)
}

func (s *Store) publishOwner(sh *shard, b uint32) {
	s.publishMeta((sh.ownerOff+4*int64(b-sh.block0))&^(lineSize-1), lineSize)
}

// sweepTombstones turns every tombstone no probe path crosses back into an
// empty entry. Inserts reuse tombstones on their own path only, so under
// churn they pile up until a table has no empty entry left and every miss
// probes all of it. A probe for the key at q starting from its home h
// crosses the entries [h, q); counting those intervals over the ring tells
// which tombstones no live key needs. Nothing moves, so lock-free readers
// and the pins (which name entries by index) stay valid.
func (s *Store) sweepTombstones(sh *shard) {
	n := sh.entries()
	cover := make([]int32, n+1)
	for q := int64(0); q < n; q++ {
		e := s.lockedEntry(sh.entry0 + uint32(q))
		switch wordState(atomic.LoadUint64(u64At(e, entWord))) {
		case stEmpty, stDeleted:
			continue
		}
		k := s.keyOf(sh.entry0 + uint32(q))
		h := int64(s.home(&k) - sh.entry0)
		if h < 0 || h >= n { // a key of another shard: damage Check reports; it needs no path here
			continue
		}
		if h <= q {
			cover[h]++
			cover[q]--
		} else { // the path wraps around the end of the shard
			cover[h]++
			cover[n]--
			cover[0]++
			cover[q]--
		}
	}
	var run int32
	for p := int64(0); p < n; p++ {
		run += cover[p]
		if run != 0 {
			continue
		}
		i := sh.entry0 + uint32(p)
		ptr := u64At(s.lockedEntry(i), entWord)
		if w := atomic.LoadUint64(ptr); wordState(w) == stDeleted {
			atomic.StoreUint64(ptr, mkWord(wordGen(w)+1, stEmpty))
			sh.add(slTombstones, -1)
			s.publishEntry(i)
		}
	}
}
