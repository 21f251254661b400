package prefix

import "sync/atomic"

func storeWord(s *Store, i uint32, w uint64) { atomic.StoreUint64(u64At(s.entry(i), entWord), w) }
func storeOwner(s *Store, e []byte, v uint32) {
	b := atomic.LoadUint32(u32At(e, entBlock))
	for k := range s.shards {
		if sh := &s.shards[k]; sh.holdsBlock(b) {
			atomic.StoreUint32(s.owner(sh, b), v)
		}
	}
}
func storeU32(b []byte, off int, v uint32) { atomic.StoreUint32(u32At(b, off), v) }
func storeU64(b []byte, off int, v uint64) { atomic.StoreUint64(u64At(b, off), v) }

// mustFind is the entry of k, which must be in the index.
func (s *Store) mustFind(t interface{ Fatalf(string, ...any) }, k Key) uint32 {
	i, _, ok := s.find(&k)
	if !ok {
		t.Fatalf("key %v not in the index", k)
	}
	return i
}

// simulateHost gives s caches of its own (cacheSim): from now on it sees
// other handles' metadata writes only where it refreshes, and they see its
// writes only where it publishes. s must be on a one-device tier opened
// non-coherent.
func (s *Store) simulateHost(t interface{ Fatalf(string, ...any) }) {
	if s.one == nil || !s.shared {
		t.Fatalf("simulateHost: want a one-device non-coherent tier")
	}
	sim := newCacheSim(s.one)
	s.sim, s.one = sim, sim.Private()
	s.hdr = s.metaSlice(0, headerBytes)
	s.ents = s.metaSlice(s.g.EntriesOff, s.g.Entries*entryBytes)
	for k := range s.shards {
		sh := &s.shards[k]
		sh.state = s.hdr[sh.stateOff : sh.stateOff+lineSize]
	}
	off := s.g.PinsOff + int64(s.slot)*s.g.PinStride
	s.myPins = s.metaSlice(off, pinHeaderSize)
	s.myRecs = s.metaSlice(off+s.g.pinHeader(), s.g.Pins*pinRecordSize)
	if s.perClient {
		s.myCounters = s.metaSlice(off+pinCounters, lineSize)
	}
}
