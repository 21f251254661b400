package prefix

import (
	"fmt"
	"sync"
	"testing"
)

// TestConcurrentInserts: goroutines of one process insert, delete and
// check at once through one handle (the Store is documented as safe for
// that); every call succeeds and the index checks afterwards.
func TestConcurrentInserts(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 256, 64)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				k := []Key{StringKey(fmt.Sprintf("%d/%d", g, i))}
				if _, err := s.Set(k, payloadsFor(k, 64)); err != nil {
					t.Errorf("goroutine %d set %d: %v", g, i, err)
					return
				}
				if i%7 == 0 {
					if _, err := s.Delete(k); err != nil {
						t.Errorf("goroutine %d delete %d: %v", g, i, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	mustCheck(t, s)
}
