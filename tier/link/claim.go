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
func word32(b []byte, off int64) *uint32  { return words.U32At(b, off) }

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

// showLocked writes the earliest open claim's deadline and the earliest
// first-token transfer's into the slot (0: none) and publishes the line.
// The sleepers are woken once no claim is open: a first-token mover obeys
// claims only, and a bulk mover asleep on a first-token transfer is woken
// when it ends, since a slot with no claim wakes at every change. (A bulk
// mover woken by a claim's end while a first-token transfer is in flight
// finds it due and sleeps again.)
func (l *Link) showLocked() {
	var d, f uint64
	if len(l.due) > 0 {
		d = uint64(slices.MinFunc(l.due, time.Time.Compare).UnixNano())
	}
	if len(l.firsts) > 0 {
		f = uint64(slices.MinFunc(l.firsts, func(a, b *First) int { return a.deadline.Compare(b.deadline) }).deadline.UnixNano())
	}
	store(l.mine, offDeadline, d)
	store(l.mine, offFirst, f)
	wake := word32(l.mine, offWake)
	atomic.AddUint32(wake, 1)
	_ = l.r.Publish(l.slotOff(l.slot), line) // a no-op on one host; a failed flush shows as a later claim
	if d == 0 && atomic.LoadUint32(word32(l.mine, offSleepers)) != 0 {
		wakeAll(wake)
	}
}

// livenessEvery is how often a bulk mover asks again whether a slot's
// owner still runs (the answer may read /proc).
const livenessEvery = 50 * time.Millisecond

// Turn is called by a bulk mover before a piece of n bytes: it returns at
// once unless a claim or a first-token transfer of some process on the
// link is due, and otherwise when none it obeys is left (each is
// withdrawn, passes its deadline, or spends its owner's share of the
// window).
func (l *Link) Turn(n int64) {
	waited := l.await(true)
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

// await waits while a claim is due, or (for a bulk mover) a first-token
// transfer, and says for how long.
func (l *Link) await(bulk bool) time.Duration {
	var waited time.Duration
	for try := 0; ; try++ {
		now := time.Now()
		i, left := l.dueClaim(now, bulk)
		if i < 0 {
			return waited
		}
		if yields(try, left) {
			yield(try)
		} else {
			l.sleep(i, min(left, livenessEvery), bulk)
		}
		dt := time.Since(now)
		waited += dt
		l.mu.Lock()
		l.peers[i].waited += dt
		l.mu.Unlock()
	}
}

// spinTries is how often a bulk mover yields before it sleeps on a claim:
// a claim of a few microseconds (an Engram layer's rows) ends within
// them, and a longer one gets the core while the mover sleeps.
const spinTries = 16

// yieldWithin: a mover keeps yielding, not sleeping, on a claim due
// within it. A claim's owner wakes the sleepers when it ends, on its own
// thread and before its caller goes on, and a woken mover can take that
// thread's core at once: at Engram batch 32 (claims of 80-150 µs due in
// 200 µs) ending a claim took 25-47 µs at p99 and up to 13 ms with
// sleepers, and 1-3 µs (at most 0.4 ms) with movers that yielded through
// such claims. A claim due further off is worth a sleep; when it comes
// within this, the mover yields out its end.
const yieldWithin = 500 * time.Microsecond

// yields says whether a mover on its try-th look at a claim due in left
// yields the core (and looks again) rather than sleep on the claim.
func yields(try int, left time.Duration) bool {
	return try < spinTries || left <= yieldWithin
}

// sleep waits on slot i's wake word until its owner changes its claim, or
// for at most d (the claim's deadline, or a sleep quantum where the tier
// spans hosts, whose processes' futexes are not shared). A bulk mover
// sleeps on a first-token transfer as well.
func (l *Link) sleep(i int, d time.Duration, bulk bool) {
	b := l.lines[i]
	if l.shared {
		time.Sleep(min(d, 50*time.Microsecond))
		return
	}
	wake, sleepers := word32(b, offWake), word32(b, offSleepers)
	v := atomic.LoadUint32(wake)
	atomic.AddUint32(sleepers, 1)
	defer atomic.AddUint32(sleepers, ^uint32(0))
	// The claim may have ended since dueClaim looked; its owner bumped the
	// wake word first, so a sleep on v returns at once then.
	if load(b, offDeadline) == 0 && (!bulk || load(b, offFirst) == 0) {
		return
	}
	sleepOn(wake, v, d)
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

// dueClaim is the slot of a claim the mover must wait for at now and how
// long it may wait for it at most (to the deadline, or the end of the
// owner's share), or -1: a deadline ahead of now and within the horizon,
// of a slot whose owner runs and has not spent its share of the window.
// A bulk mover obeys a first-token transfer's deadline as well, within
// its own horizon; the owner's share is one for both.
func (l *Link) dueClaim(now time.Time, bulk bool) (int, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return -1, 0
	}
	if now.Sub(l.window) >= l.cfg.Window {
		l.window = now
		for i := range l.peers {
			l.peers[i].waited = 0
		}
	}
	share := time.Duration(l.cfg.Share * float64(l.cfg.Window))
	ns, horizon := uint64(now.UnixNano()), uint64(now.Add(l.cfg.Horizon).UnixNano())
	firstHorizon := uint64(now.Add(l.cfg.FirstHorizon).UnixNano())
	for i := range l.peers {
		b, err := l.line(i)
		if err != nil {
			return -1, 0 // a table this process cannot read holds no one up
		}
		if l.peers[i].waited >= share {
			continue
		}
		d := load(b, offDeadline)
		due := d > ns && d <= horizon
		if !due && bulk {
			d = load(b, offFirst)
			due = d > ns && d <= firstHorizon
		}
		if !due {
			continue
		}
		if l.runs(i, load(b, offOwner), now) {
			return i, min(time.Duration(d-ns), share-l.peers[i].waited)
		}
	}
	return -1, 0
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
