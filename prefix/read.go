package prefix

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cxltier/cxltier/internal/prefetch"
	"github.com/cxltier/cxltier/tier"
)

// Hit is one entry a lookup found and pinned. Its payload stays in place
// until Release.
type Hit struct {
	Key    Key
	Len    int64       // payload bytes
	CRC    uint32      // the entry's CRC-32C: of the key's 32 bytes then the payload (layout 5; the payload alone before), see Store.Checksum
	Offset tier.Offset // payload in the tier
	Block  uint32      // payload block index

	entry uint32
	word  uint64
	pin   int32
	mac   [macBytes]byte // a keyed index's signature of the page, read once pinned
}

// readEntry is entry i, refreshed first on a non-coherent tier.
func (s *Store) readEntry(i uint32) []byte {
	e := s.entry(i)
	if s.shared {
		s.refreshMeta(s.g.EntriesOff+int64(i)*entryBytes, lineSize)
	}
	return e
}

func keyEqual(e []byte, k *Key) bool {
	for w := 0; w < 4; w++ {
		if atomic.LoadUint64(u64At(e, entKey+8*w)) != binary.LittleEndian.Uint64(k[8*w:]) {
			return false
		}
	}
	return true
}

// keyHash mixes a key into the word that picks its shard (top bits) and
// its home in the shard (low bits). Page keys are SHA-256 digests, but
// callers may pass keys of their own with little entropy in any one word,
// so all four words are folded and mixed: keys that differ anywhere spread
// out.
func keyHash(k *Key) uint64 {
	le := binary.LittleEndian
	x := le.Uint64(k[0:]) ^ le.Uint64(k[8:])*0x9e3779b97f4a7c15 ^
		le.Uint64(k[16:])*0xc2b2ae3d27d4eb4f ^ le.Uint64(k[24:])*0x165667b19e3779f9
	x ^= x >> 31
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 29
	return x
}

// homeOf is k's shard and first probe slot in it, from one hash. It stays
// within the compiler's inlining budget (find and probeInsert call it per
// key): mind its cost when changing it.
func (s *Store) homeOf(k *Key) (sh *shard, i uint32) {
	x := keyHash(k)
	sh = &s.shards[x>>s.shardShift]
	return sh, sh.entry0 + uint32(x)&sh.mask
}

// home is k's first probe slot, in its shard.
func (s *Store) home(k *Key) uint32 {
	_, i := s.homeOf(k)
	return i
}

// find probes for k without the lock. It returns the entry holding k (in
// any live state) and the state word read before the key compare, which a
// caller re-checks after it reads more fields.
func (s *Store) find(k *Key) (uint32, uint64, bool) {
	sh, i := s.homeOf(k)
	for n := int64(0); n <= int64(sh.mask); {
		e := s.readEntry(i)
		w := atomic.LoadUint64(u64At(e, entWord))
		switch wordState(w) {
		case stEmpty:
			return 0, 0, false
		case stDeleted:
		default:
			match := keyEqual(e, k)
			if atomic.LoadUint64(u64At(e, entWord)) != w {
				continue // changed while we compared: look again
			}
			if match {
				return i, w, true
			}
		}
		i = sh.next(i)
		n++
	}
	return 0, 0, false
}

// touchAhead is how many keys' home entries a batch prefetches ahead:
// the core overlaps the misses a key-by-key probe would wait for one
// after another. 8 to 64 were measured; 16 was best, by a little.
//
// Prefetches, not loads: a load that misses holds its place in the
// reorder window until its data comes, so a run of them stalled the core
// after a few keys, where prefetches retire at once and the misses
// overlap (60k keys in a 16 MiB index on the 2-core Zen 4 VM: 2.5-3x
// faster probes than touching each home with a load).
const touchAhead = 16

// touchHomes prefetches the line of each key's home entry, to have the
// lines in the core's cache when the probes come.
func (s *Store) touchHomes(keys []Key) {
	for n := range keys {
		prefetch.Line(&s.entry(s.home(&keys[n]))[entWord])
	}
}

// Exists returns how many leading keys have ready entries (HiCache's
// batch_exists). It takes no lock and pins nothing; a large batch is probed
// by several goroutines.
func (s *Store) Exists(keys []Key) int {
	held, herr := s.hold("exists")
	if herr != nil {
		return 0
	}
	defer held.Done()
	if s.maint || s.current() != nil {
		return 0
	}
	if len(keys) <= parallelGrain { // one run: no closure to allocate
		return s.leadingReady(keys, nil)
	}
	return leadingInParallel(len(keys), func(lo, hi int, stop func() bool) int {
		return s.leadingReady(keys[lo:hi], stop)
	})
}

// ExistsPages is Exists over the parts of pages (HiCache's batch_exists on
// part keys): how many leading pages have every part — pages[i] under each
// of masks, as PartKey makes them — ready. It derives each key as it
// probes instead of building the batch's keys first, and stops at the
// first page with a part missing.
func (s *Store) ExistsPages(pages []string, masks []Key) int {
	held, herr := s.hold("exists")
	if herr != nil {
		return 0
	}
	defer held.Done()
	if s.maint || len(masks) == 0 || s.current() != nil {
		return 0
	}
	return leadingInParallel(len(pages), func(lo, hi int, stop func() bool) int {
		return s.leadingPages(pages[lo:hi], masks, stop)
	})
}

// leadingPages is ExistsPages over one run of pages: the keys of a few
// pages at a time are made, their homes read ahead, then probed.
func (s *Store) leadingPages(pages []string, masks []Key, stop func() bool) int {
	m := len(masks)
	group := max(1, touchAhead/m)
	keys := make([]Key, group*m)
	for p0 := 0; p0 < len(pages); p0 += group {
		if stop != nil && stop() {
			return p0
		}
		n := min(group, len(pages)-p0)
		for i := range n {
			pageParts(keys[i*m:(i+1)*m], pages[p0+i], masks)
		}
		s.touchHomes(keys[:n*m])
		for i := range n {
			for j := range m {
				if _, w, ok := s.find(&keys[i*m+j]); !ok || wordState(w) != stReady {
					return p0 + i
				}
			}
		}
	}
	return len(pages)
}

// leadingReady is how many leading keys have ready entries, or fewer once
// stop (if not nil) says so, which it asks every touchAhead keys.
func (s *Store) leadingReady(keys []Key, stop func() bool) int {
	for n := range keys {
		if n%touchAhead == 0 && len(keys) > 1 {
			if stop != nil && stop() {
				return n
			}
			s.touchHomes(keys[n:min(n+touchAhead, len(keys))])
		}
		if _, w, ok := s.find(&keys[n]); !ok || wordState(w) != stReady {
			return n
		}
	}
	return len(keys)
}

// Lookup finds the longest prefix of keys whose entries are ready, pins
// them and returns them in order. Every hit must be given back with Release.
func (s *Store) Lookup(keys []Key) ([]Hit, error) {
	return s.LookupAppend(make([]Hit, 0, len(keys)), keys)
}

// LookupAppend is Lookup appending the hits to dst, so that a caller
// reusing dst allocates nothing per call. On an error dst comes back as
// it came, with no pin taken.
func (s *Store) LookupAppend(dst []Hit, keys []Key) ([]Hit, error) {
	held, herr := s.hold("lookup")
	if herr != nil {
		return dst, herr
	}
	defer held.Done()
	if err := s.entries("lookup"); err != nil {
		return dst, err
	}
	base := len(dst)
	dst = slices.Grow(dst, len(keys))
	for n := range keys {
		if n%touchAhead == 0 && len(keys) > 1 {
			s.touchHomes(keys[n:min(n+touchAhead, len(keys))])
		}
		// Filled in place: a Hit is twelve words, worth not copying twice.
		dst = dst[:len(dst)+1]
		ok, err := s.lookupOne(&dst[len(dst)-1], &keys[n])
		if err != nil {
			s.Release(dst[base : len(dst)-1])
			return dst[:base], fmt.Errorf("prefix: %q: lookup key %d (%v): %w", s.name, n, keys[n], err)
		}
		if !ok {
			dst = dst[:len(dst)-1]
			break
		}
	}
	hits := len(dst) - base
	s.count(ctrHits, uint64(hits))
	s.count(ctrMisses, uint64(len(keys)-hits))
	return dst, nil
}

// lookupOne finds k and, if it is ready, pins it, fills h and marks the
// entry used.
func (s *Store) lookupOne(h *Hit, k *Key) (bool, error) {
	e, ok, err := s.pinOne(h, k)
	if ok {
		s.touch(e)
	}
	return ok, err
}

// pinOne finds k and, if it is ready, pins it and fills h.
func (s *Store) pinOne(h *Hit, k *Key) ([]byte, bool, error) {
	e, ok := s.probeHit(h, k)
	if !ok {
		return nil, false, nil
	}
	pin, err := s.pin(h.entry, h.word)
	if err != nil || pin < 0 {
		return nil, false, err
	}
	h.pin = pin
	if int64(h.Block) >= s.g.Blocks || h.Len > s.g.BlockBytes {
		s.unpin(pin)
		return nil, false, fmt.Errorf("%w: entry %d names block %d of %d bytes", ErrBadIndex, h.entry, h.Block, h.Len)
	}
	h.Offset = s.blockAt(h.Block)
	if s.mac != nil {
		h.mac = s.loadMAC(h.entry) // pinned: the entry holds still for anyone keeping to the protocol
	}
	return e, true, nil
}

// Keep pins the ready entries among keys, each on its own (a missing key
// does not end it, as it ends a lookup's prefix), and sets present[i] for
// the keys it pinned. It counts no hit and does not mark an entry used: a
// writer keeps what it stored until a reader has read it, and eviction
// takes no pinned entry. Give the hits back with Release; on an error
// nothing stays pinned (ErrPinsFull where this client's pin table is full).
func (s *Store) Keep(keys []Key, present []bool) ([]Hit, error) {
	held, herr := s.hold("keep")
	if herr != nil {
		return nil, herr
	}
	defer held.Done()
	if len(present) < len(keys) {
		return nil, fmt.Errorf("prefix: %q: keep: %d keys but %d answers: %w", s.name, len(keys), len(present), ErrBadConfig)
	}
	if err := s.entries("keep"); err != nil {
		return nil, err
	}
	hits := make([]Hit, 0, len(keys))
	for n := range keys {
		hits = hits[:len(hits)+1]
		_, ok, err := s.pinOne(&hits[len(hits)-1], &keys[n])
		if err != nil {
			s.Release(hits[:len(hits)-1])
			return nil, fmt.Errorf("prefix: %q: keep key %d (%v): %w", s.name, n, keys[n], err)
		}
		present[n] = ok
		if !ok {
			hits = hits[:len(hits)-1]
		}
	}
	return hits, nil
}

// probeHit finds k and, if it is ready, fills h from its entry, which it
// returns; nothing is pinned yet, so h holds only what was read.
// (BenchmarkLookupParts times it alone: a hit without its pin.)
func (s *Store) probeHit(h *Hit, k *Key) ([]byte, bool) {
	i, w, ok := s.find(k)
	if !ok || wordState(w) != stReady {
		return nil, false
	}
	e := s.entry(i)
	h.Key, h.entry, h.word = *k, i, w
	h.Len = int64(atomic.LoadUint32(u32At(e, entLen)))
	h.CRC = atomic.LoadUint32(u32At(e, entCRC))
	h.Block = atomic.LoadUint32(u32At(e, entBlock))
	return e, true
}

// touch marks a hit entry as used since it was last linked at the LRU
// head, which is all eviction's second chance asks. Linking leaves
// entAccess even; the first hit after makes it odd and greater, so a hit
// reads only the line it already holds, writes it once per link period
// (the line every reader shares stays clean), and reads no clock after.
// On a non-coherent tier lookups write nothing: a reader's dirty copy of
// the line, written back later, would overwrite the state word with what
// it saw, so there eviction order is insertion order.
func (s *Store) touch(e []byte) {
	if s.shared {
		return
	}
	acc := u64At(e, entAccess)
	if a := atomic.LoadUint64(acc); a&1 == 0 {
		atomic.StoreUint64(acc, max(uint64(time.Now().UnixNano()), a+1)|1)
	}
}

// Release unpins hits returned by Lookup.
func (s *Store) Release(hits []Hit) {
	held, herr := s.holdToRelease("release")
	if herr != nil {
		return // the pin tables went with the client
	}
	defer held.Done()
	if s.r.Closed() { // the pin tables went with the mapping
		return
	}
	for _, h := range hits {
		s.unpin(h.pin)
	}
}
