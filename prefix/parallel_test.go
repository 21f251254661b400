package prefix

import (
	"fmt"
	"runtime"
	"testing"
)

// TestLeadingInParallel: split into runs or not, the count of leading
// passing items is the index of the first failure, wherever the failures
// fall (inside a run, at a run's edges, several in several runs).
func TestLeadingInParallel(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	for _, n := range []int{0, 1, parallelGrain - 1, 2 * parallelGrain, 3*parallelGrain + 7, 50000} {
		per, _ := runs(n)
		for _, fails := range [][]int{nil, {0}, {per - 1}, {per}, {per + 1}, {n - 1}, {n / 2, n - 1}, {per + 3, 2 * per, 3*per - 1}} {
			failed := map[int]bool{}
			want := n
			for _, f := range fails {
				if f >= 0 && f < n {
					failed[f] = true
					want = min(want, f)
				}
			}
			t.Run(fmt.Sprintf("n%d/fails%v", n, fails), func(t *testing.T) {
				got := leadingInParallel(n, func(lo, hi int, stop func() bool) int {
					for i := lo; i < hi; i++ {
						if failed[i] || (i%64 == 0 && stop != nil && stop()) {
							return i - lo
						}
					}
					return hi - lo
				})
				if got != want {
					t.Fatalf("%d leading, want %d", got, want)
				}
			})
		}
	}
}

// TestExistsLargeBatch: a batch long enough to be probed in runs counts
// up to its first missing key, and all of it when none is missing.
func TestExistsLargeBatch(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	_, c := testTier(t, 1)
	const n = 3 * parallelGrain
	s := testStore(t, c, 2*n, 8) // sharded: room for n keys in every shard
	keys := benchKeys(n + 1)
	ps := make([][]byte, n)
	for i := range ps {
		ps[i] = make([]byte, 8)
	}
	if st, err := s.Set(keys[:n], ps); err != nil || st[n-1] != Reserved {
		t.Fatalf("set: %v", err)
	}
	if got := s.Exists(keys[:n]); got != n {
		t.Errorf("all present: %d, want %d", got, n)
	}
	for _, miss := range []int{0, 5000, parallelGrain, n - 1} {
		batch := append(append(append([]Key{}, keys[:miss]...), keys[n]), keys[miss:n-1]...)
		if got := s.Exists(batch); got != miss {
			t.Errorf("missing key at %d: %d", miss, got)
		}
	}
}
