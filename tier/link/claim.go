package link

import (
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cxltier/cxltier/internal/words"
)

func load(b []byte, off int64) uint64     { return atomic.LoadUint64(words.U64At(b, off)) }
func store(b []byte, off int64, v uint64) { atomic.StoreUint64(words.U64At(b, off), v) }
func add(b []byte, off int64, v uint64)   { atomic.AddUint64(words.U64At(b, off), v) }

// Claim announces a transfer of this process due by deadline: until Done,
// the bulk movers of every process on the link wait between their pieces.
// Claims of one process overlap freely; the slot shows the earliest due.
func (l *Link) Claim(deadline time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.due = append(l.due, deadline)
	l.started = append(l.started, time.Now())
	l.showLocked()
}

// Done ends the oldest open claim: missed says its transfer was ready past
// its deadline. A claim never ended stops counting at its deadline.
func (l *Link) Done(missed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || len(l.due) == 0 {
		return
	}
	held := time.Since(l.started[0])
	l.due, l.started = l.due[1:], l.started[1:]
	add(l.mine, offClaims, 1)
	add(l.mine, offClaimed, uint64(held))
	if missed {
		add(l.mine, offMisses, 1)
	}
	l.showLocked()
}

// showLocked writes the earliest open deadline into the slot (0: none) and
// publishes the line.
func (l *Link) showLocked() {
	var d uint64
	if len(l.due) > 0 {
		d = uint64(slices.MinFunc(l.due, time.Time.Compare).UnixNano())
	}
	store(l.mine, offDeadline, d)
	_ = l.r.Publish(l.slotOff(l.slot), line) // a no-op on one host; a failed flush shows as a later claim
}

// livenessEvery is how often a bulk mover asks again whether a slot's
// owner still runs (the answer may read /proc).
const livenessEvery = 50 * time.Millisecond

// Turn is called by a bulk mover before a piece of n bytes: it returns at
// once unless a claim of some process on the link is due, and otherwise
// when no claim it obeys is left (each is withdrawn, passes its deadline,
// or spends its owner's share of the window).
func (l *Link) Turn(n int64) {
	var waited time.Duration
	for try := 0; ; try++ {
		now := time.Now()
		i := l.dueClaim(now)
		if i < 0 {
			break
		}
		yield(try)
		dt := time.Since(now)
		waited += dt
		l.mu.Lock()
		l.peers[i].waited += dt
		l.mu.Unlock()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	add(l.mine, offBytes, uint64(max(n, 0)))
	if waited > 0 {
		add(l.mine, offWaits, 1)
		add(l.mine, offWaited, uint64(waited))
	}
}

// yield gives the core away while a claim is due: the deadline transfer
// may be another process's on this very core.
func yield(try int) {
	if try < 4 {
		runtime.Gosched()
		return
	}
	_, _, _ = unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
}

// dueClaim is the slot of a claim the bulk mover must wait for at now, or
// -1: a deadline ahead of now and within the horizon, of a slot whose
// owner runs and has not spent its share of the window.
func (l *Link) dueClaim(now time.Time) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return -1
	}
	if now.Sub(l.window) >= l.cfg.Window {
		l.window = now
		for i := range l.peers {
			l.peers[i].waited = 0
		}
	}
	share := time.Duration(l.cfg.Share * float64(l.cfg.Window))
	ns, horizon := uint64(now.UnixNano()), uint64(now.Add(l.cfg.Horizon).UnixNano())
	for i := range l.peers {
		b, err := l.line(i)
		if err != nil {
			return -1 // a table this process cannot read holds no one up
		}
		d := load(b, offDeadline)
		if d <= ns || d > horizon || l.peers[i].waited >= share {
			continue
		}
		if l.runs(i, load(b, offOwner), now) {
			return i
		}
	}
	return -1
}

// runs reports whether slot i's owner token names a running client,
// asking the region at most every livenessEvery per token.
func (l *Link) runs(i int, token uint64, now time.Time) bool {
	p := &l.peers[i]
	if token == 0 {
		return false
	}
	if token != p.token || now.Sub(p.checked) >= livenessEvery {
		p.token, p.runs, p.checked = token, token == l.c.Token() || l.r.TokenRuns(token), now
	}
	return p.runs
}
