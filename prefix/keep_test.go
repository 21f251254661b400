package prefix

import (
	"errors"
	"testing"
)

// TestKeepHoldsStoredEntriesAgainstEviction: in a full index whose older
// entries were each read once (so eviction's second chance passes them
// over first), a writer's fresh entries are the first victims of its own
// next inserts, as a prefill's published pages were before its decode read
// them. Kept, they survive; keeping counts no hit and needs no prefix of
// present keys.
func TestKeepHoldsStoredEntriesAgainstEviction(t *testing.T) {
	for _, keep := range []bool{false, true} {
		_, c := testTier(t, 1)
		s := testStore(t, c, 8, 256)
		set := func(from, to int) {
			t.Helper()
			for i := from; i < to; i++ {
				if st, err := s.Set([]Key{keyN(i)}, [][]byte{payloadFor(keyN(i), 200)}); err != nil || st[0] != Reserved {
					t.Fatalf("set %d: %v %v", i, st, err)
				}
			}
		}
		set(0, 6)
		for i := range 6 { // every old entry read once
			hits, err := s.Lookup([]Key{keyN(i)})
			if err != nil || len(hits) != 1 {
				t.Fatalf("lookup %d: %d, %v", i, len(hits), err)
			}
			s.Release(hits)
		}
		set(100, 102) // the writer's first part: the index is full now
		var kept []Hit
		if keep {
			hitsBefore := s.Stats().Hits
			present := make([]bool, 3)
			var err error
			kept, err = s.Keep([]Key{keyN(100), keyN(999), keyN(101)}, present)
			if err != nil || len(kept) != 2 || !present[0] || present[1] || !present[2] {
				t.Fatalf("Keep = %d hits, %v, %v; want the two stored, the missing one between them skipped", len(kept), present, err)
			}
			if s.Stats().Hits != hitsBefore {
				t.Errorf("keep counted hits: %d, then %d", hitsBefore, s.Stats().Hits)
			}
		}
		set(102, 104) // its next part evicts
		left := s.Exists([]Key{keyN(100), keyN(101)})
		switch {
		case keep && left != 2:
			t.Fatalf("kept entries evicted: %d of 2 left", left)
		case !keep && left != 0:
			t.Fatalf("unkept, %d of the fresh entries outlived the old ones: this test no longer shows what keep is for", left)
		}
		s.Release(kept)
	}
}

func TestKeepRefusesBadArguments(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 8, 256)
	if _, err := s.Keep([]Key{keyN(1), keyN(2)}, make([]bool, 1)); !errors.Is(err, ErrBadConfig) {
		t.Errorf("short answers: %v", err)
	}
	hits, err := s.Keep(nil, nil)
	if err != nil || len(hits) != 0 {
		t.Errorf("no keys: %d, %v", len(hits), err)
	}
}
