package link

import (
	"slices"
	"time"
)

// First is a transfer a request's first token waits on: a request's KV
// load, a prefill's pages for its decode. While it is in flight the bulk
// movers of every process on the link (stores, write-behind, cluster
// fills) wait for it between their pieces as they wait for a claim, up to
// its deadline and within its owner's share of each window, and its own
// pieces wait for deadline claims only. Safe for concurrent use.
type First struct {
	l        *Link
	deadline time.Time
}

// BeginFirst shows a first-token transfer due by deadline in flight until
// its End. Its pieces pace with its Turn.
func (l *Link) BeginFirst(deadline time.Time) *First {
	f := &First{l: l, deadline: deadline}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.firsts = append(l.firsts, f)
		l.showLocked()
	}
	return f
}

// Turn is called before a piece of n bytes of the transfer: it returns at
// once unless a claim of some process on the link is due (a bulk piece or
// another first-token transfer never holds it up), and otherwise when none
// it obeys is left.
func (f *First) Turn(n int64) {
	l := f.l
	waited := l.await(false)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	add(l.mine, offFirstB, uint64(max(n, 0)))
	add(l.mine, offFirstW, uint64(waited))
}

// End ends the transfer and counts it, as late when it ends past its
// deadline. Ending it again does nothing.
func (f *First) End() {
	l := f.l
	l.mu.Lock()
	defer l.mu.Unlock()
	i := slices.Index(l.firsts, f)
	if l.closed || i < 0 {
		return
	}
	l.firsts = slices.Delete(l.firsts, i, i+1)
	add(l.mine, offFirsts, 1)
	if time.Now().After(f.deadline) {
		add(l.mine, offFirstMis, 1)
	}
	l.showLocked()
}
