package prefix

import "sync/atomic"

func storeWord(s *Store, i uint32, w uint64) { atomic.StoreUint64(u64At(s.entry(i), entWord), w) }
func storeOwner(s *Store, e []byte, v uint32) {
	atomic.StoreUint32(s.owner(atomic.LoadUint32(u32At(e, entBlock))), v)
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
