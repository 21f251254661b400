package prefix

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/cxltier/cxltier/tier"
)

// Keys appends the keys of the index's ready entries to dst, in entry
// order. It takes no lock: an entry that changes while its key is read is
// skipped (it was being inserted, evicted or deleted), so the listing is
// every entry that stayed ready while the scan passed it. The node's KV
// event publisher diffs two listings to find what was stored and removed.
func (s *Store) Keys(dst []Key) ([]Key, error) {
	held, herr := s.hold("keys")
	if herr != nil {
		return dst, herr
	}
	defer held.Done()
	if err := s.entries("keys"); err != nil {
		return dst, err
	}
	for i := uint32(0); int64(i) < s.g.Entries; i++ {
		e := s.readEntry(i)
		w := atomic.LoadUint64(u64At(e, entWord))
		if wordState(w) != stReady {
			continue
		}
		k := s.keyOf(i)
		if atomic.LoadUint64(u64At(e, entWord)) != w {
			continue
		}
		dst = append(dst, k)
	}
	return dst, nil
}

// Has sets present[i] to whether keys[i] has a ready entry, each key on
// its own (Exists stops at the first missing one).
func (s *Store) Has(keys []Key, present []bool) error {
	if len(present) < len(keys) {
		return fmt.Errorf("prefix: %q: has: %d keys, room for %d answers", s.name, len(keys), len(present))
	}
	held, herr := s.hold("has")
	if herr != nil {
		return herr
	}
	defer held.Done()
	if err := s.entries("has"); err != nil {
		return err
	}
	for n := range keys {
		if n%touchAhead == 0 {
			s.touchHomes(keys[n:min(n+touchAhead, len(keys))])
		}
		_, w, ok := s.find(&keys[n])
		present[n] = ok && wordState(w) == stReady
	}
	return nil
}

// Names lists the prefix indexes of the tier r maps, by name.
func Names(r *tier.Region) ([]string, error) {
	list, err := r.DirList()
	if err != nil {
		return nil, fmt.Errorf("prefix: list indexes: %w", err)
	}
	var names []string
	for _, e := range list {
		if name, ok := strings.CutPrefix(e.Name, DirName("")); ok && e.Kind == DirKind && name != "" {
			names = append(names, name)
		}
	}
	return names, nil
}
