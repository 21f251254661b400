package kernels

import "fmt"

// laterQueue holds the thens of Launch.ReadLater whose Runs are queued
// but not yet waited for, in Run order: a Run's data is final once its
// kernels are done, and thens that join checksums onto a caller's words
// must see the Runs in the order they were queued (layer i's join before
// layer i+1's). An engine keeps one, under its lock.
type laterQueue struct {
	seq     uint64 // of the last Run that queued a then
	pending []laterThen
}

type laterThen struct {
	seq uint64
	run func()
}

// add queues run as the then of the Run being ended and returns its
// sequence number.
func (q *laterQueue) add(run func()) uint64 {
	q.seq++
	q.pending = append(q.pending, laterThen{seq: q.seq, run: run})
	return q.seq
}

// runUpTo runs, in order, the thens of every Run up to seq: a wait for a
// Run's end covers every Run queued before it on the same stream.
func (q *laterQueue) runUpTo(seq uint64) { q.take(seq, true) }

// dropUpTo forgets the thens up to seq unrun: their Runs' work failed, so
// what they would hand on cannot be trusted (a caller's checksums stay
// unjoined and fail their check).
func (q *laterQueue) dropUpTo(seq uint64) { q.take(seq, false) }

// take removes the thens up to seq, running them first if run.
func (q *laterQueue) take(seq uint64, run bool) {
	n := 0
	for n < len(q.pending) && q.pending[n].seq <= seq {
		if run {
			q.pending[n].run()
		}
		q.pending[n] = laterThen{}
		n++
	}
	q.pending = q.pending[n:]
}

// drop forgets every then: the engine closed.
func (q *laterQueue) drop() { q.dropUpTo(q.seq) }

// laterArgs checks a ReadLater call: once per Run, a then, and n bytes at
// src inside the Run's stage of stageBytes bytes at stage.
func laterArgs(again bool, stage uint64, stageBytes int, src uint64, n int, then func([]byte)) error {
	switch {
	case again:
		return fmt.Errorf("%w: a second ReadLater", ErrNotInRun)
	case then == nil || n <= 0:
		return fmt.Errorf("%w: read later of %d bytes with then %v", ErrBadRequest, n, then != nil)
	case stage == 0 || src < stage || src-stage > uint64(stageBytes) || uint64(n) > uint64(stageBytes)-(src-stage):
		return fmt.Errorf("%w: read later of %d bytes at %#x: not inside the Run's stage (%d bytes at %#x)",
			ErrBadRequest, n, src, stageBytes, stage)
	}
	return nil
}
