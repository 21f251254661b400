//go:build invariants || race

package prefix

import (
	"fmt"
	"strings"
	"testing"
)

// TestInvariantsCatchABrokenMutation: in invariants builds a mutation that
// leaves a sound shard broken (here one that miscounts its ready entries)
// panics with what broke, before another client can build on it.
func TestInvariantsCatchABrokenMutation(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 16, 64)
	keys := keysN(4)
	if _, err := s.Set(keys, payloadsFor(keys, 64)); err != nil {
		t.Fatal(err)
	}
	sh := s.shardOfEntry(0)
	got := func() (msg string) {
		defer func() { msg = fmt.Sprint(recover()) }()
		s.locked(sh, func() { sh.add(slReady, 1) })
		return ""
	}()
	if !strings.Contains(got, "broken by a mutation") || !strings.Contains(got, "ready") {
		t.Fatalf("a miscounting mutation: panic %q", got)
	}
}
