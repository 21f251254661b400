package prefix

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
)

// parallelGrain is the least work, in keys, worth a goroutine of its own.
// HiCache's batch_exists asks for tens of thousands of keys at once, on the
// scheduler's time, and every probe waits on memory: on a machine with
// cores to spare such a batch is split into runs probed side by side.
const parallelGrain = 4096

// runs splits n items into runs of at least parallelGrain, one per
// available core at most, and returns the run length and count (1 run:
// do it inline).
func runs(n int) (per, count int) {
	if n <= parallelGrain {
		return n, 1
	}
	count = max(1, min(runtime.GOMAXPROCS(0), n/parallelGrain))
	per = (n + count - 1) / count
	return per, (n + per - 1) / per
}

// inParallel calls fn on the runs of [0, n), concurrently when there are
// several, and returns when all are done.
func inParallel(n int, fn func(lo, hi int)) {
	per, count := runs(n)
	inRuns(n, per, count, fn)
}

// moveGrain is the least payload, in bytes, worth a goroutine of its own
// in a batch's block moves: one core's copy (with its checksum) does not
// reach the memory's bandwidth, and a batch of whole pages is megabytes.
const moveGrain = 8 << 20

// eachInParallel calls fn(i) for every i in [0, n), whose work comes to
// bytes in all, on several goroutines when there is enough of it (at least
// moveGrain a goroutine, one per core at most), and returns when all are
// done. fn must touch nothing another i does.
func eachInParallel(n int, bytes int64, fn func(i int)) { eachInParallelBy(n, bytes, moveGrain, fn) }

// signGrain is moveGrain for signing pages (mac.go): HMAC-SHA256 runs at
// a fraction of a copy's speed, so a goroutine pays for itself on far
// fewer bytes.
const signGrain = 256 << 10

// eachInParallelBy is eachInParallel with a goroutine per grain bytes.
func eachInParallelBy(n int, bytes, grain int64, fn func(i int)) {
	if n <= 0 {
		return
	}
	count := int(max(1, min(int64(runtime.GOMAXPROCS(0)), int64(n), bytes/grain)))
	per := (n + count - 1) / count
	inRuns(n, per, (n+per-1)/per, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			fn(i)
		}
	})
}

// inRuns calls fn on count runs of per items covering [0, n), the first on
// the calling goroutine.
func inRuns(n, per, count int, fn func(lo, hi int)) {
	if count == 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	for r := 1; r < count; r++ {
		wg.Go(func() { fn(r*per, min((r+1)*per, n)) })
	}
	fn(0, min(per, n))
	wg.Wait()
}

// leadingInParallel is how many leading items of [0, n) pass, where
// leading(lo, hi, stop) counts the leading items of [lo, hi) that pass,
// giving up when stop() says an earlier run already failed (its count
// then no longer matters). A batch done in one run gets a nil stop.
func leadingInParallel(n int, leading func(lo, hi int, stop func() bool) int) int {
	per, count := runs(n)
	if count == 1 {
		return leading(0, n, nil)
	}
	counts := make([]int, count)
	var firstFail atomic.Int64
	firstFail.Store(math.MaxInt64)
	inParallel(n, func(lo, hi int) {
		c := leading(lo, hi, func() bool { return firstFail.Load() < int64(lo) })
		counts[lo/per] = c
		if c < hi-lo {
			for f := firstFail.Load(); int64(lo+c) < f && !firstFail.CompareAndSwap(f, int64(lo+c)); f = firstFail.Load() {
			}
		}
	})
	total := 0
	for r, c := range counts {
		total += c
		if c < min(per, n-r*per) {
			break
		}
	}
	return total
}
