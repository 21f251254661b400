package prefix

import (
	"errors"
	"testing"
	"time"

	"github.com/cxltier/cxltier/tier"
)

// A panic inside a shard's critical section (a bug, which the C library
// recovers into an error) gives the shard's tier lock back at once, leaves
// the shard marked for repair, and poisons the handle; another client then
// works on the shard without waiting out a lock timeout.
func TestPanicInMutationReleasesTheShard(t *testing.T) {
	r, c := testTier(t, 1)
	s := testStoreShards(t, c, 16, 64, 1)
	keys := keysN(6)
	if _, err := s.Set(keys[:3], payloadsFor(keys[:3], 64)); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("the mutation did not panic")
			}
		}()
		s.locked(&s.shards[0], func() {
			s.shards[0].add(slReady, 1) // half a change: a count with no entry behind it
			panic("a bug mid-mutation")
		})
	}()
	c2, err := r.Attach(tier.ClientOptions{Name: "other"})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	s2, err := Open(c2, "m")
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	start := time.Now()
	if st, err := s2.Set(keys[3:5], payloadsFor(keys[3:5], 64)); err != nil || st[1] != Reserved {
		t.Fatalf("another client's insert after the panic: %v %v", st, err)
	}
	if took := time.Since(start); took > tier.LockWait/4 {
		t.Fatalf("the insert waited %v for the shard's lock", took)
	}
	if findings, err := s2.Check(true); err != nil || len(findings) != 0 {
		t.Fatalf("the shard after its repair: %v %v", findings, err)
	}
	if st := s2.Stats(); st.Ready != 5 {
		t.Fatalf("%d entries ready after the repair, want 5 (the panicking call's count dropped)", st.Ready)
	}
	if _, err := s.Set(keys[5:], payloadsFor(keys[5:], 64)); !errors.Is(err, ErrPoisoned) {
		t.Fatalf("the handle that panicked: %v, want ErrPoisoned", err)
	}
}
