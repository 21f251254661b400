package main

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cxltier/cxltier/internal/errkind"
	"github.com/cxltier/cxltier/tier"
)

// callGuard counts the calls in flight on one attached tier, so that a
// detach waits for them before it unmaps the tier: a call still reading
// the mapping would fault, which no recover can catch, and SGLang's
// scheduler and cache threads do detach while others still call at
// shutdown. Entering is two atomic operations and no lock: a call adds
// itself and then looks for a detach; a detach marks itself and then
// waits for the count to drain. Go's atomics are sequentially consistent,
// so either the call sees the detach and backs out, or the detach sees the
// call and waits for it.
type callGuard struct {
	inflight  atomic.Int64
	detaching atomic.Bool
}

// errDetaching is what a call on a tier being detached gets;
// errCallsRunning what a detach gets when calls do not finish in time.
var (
	errDetaching    = fmt.Errorf("%w: the tier is being detached", tier.ErrClosed)
	errCallsRunning = errkind.New(errkind.Busy, "calls still running on the tier")
)

func (g *callGuard) enter() error {
	g.inflight.Add(1)
	if g.detaching.Load() {
		g.inflight.Add(-1)
		return errDetaching
	}
	return nil
}

func (g *callGuard) leave() { g.inflight.Add(-1) }

// detachWait is how long a detach waits for calls in flight: longer than
// any call may take (a lock wait is 60 s at most).
const detachWait = 2 * time.Minute

// drain turns new calls away and waits up to wait for those in flight to
// finish. If they do not, it lets calls in again and reports how many
// were left: the tier stays attached rather than unmapped under them.
func (g *callGuard) drain(wait time.Duration) error {
	g.detaching.Store(true)
	deadline := time.Now().Add(wait)
	for pause := time.Microsecond; g.inflight.Load() > 0; pause = min(2*pause, 10*time.Millisecond) {
		if time.Now().After(deadline) {
			n := g.inflight.Load()
			g.detaching.Store(false)
			return fmt.Errorf("detach: %w: %d after %v; the tier stays attached", errCallsRunning, n, wait)
		}
		time.Sleep(pause)
	}
	return nil
}
