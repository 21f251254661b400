package tier

import (
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cxltier/cxltier/internal/errkind"
)

// The gate is the one rule for touching tier memory: every operation of a
// library object (a prefix index, a mover, a top-k pool, a prefetcher)
// takes a Hold from its Client first and calls Done when it is over. A
// hold keeps the mapping in place (Region.Close and Client.Close wait for
// the holds in flight before they unmap or free anything) and carries the
// lease check that every write outside a lock makes (Hold.Fenced).
//
// Holds are counted in padded shards picked by where the caller's stack
// is (holdShard), so that two threads working on one tier do not bounce
// one counter's cache line between them: a hold is an add and a load on a
// line no other thread is likely to touch. A closer sets the state first
// and then sums the shards; Go's atomics are sequentially consistent, so a
// hold either sees the state and backs out, or is seen in the sum and
// waited for. Each shard only ever
// counts its own holds, so no shard goes negative and a sum of zero means
// none is in flight.

const holdShards = 32 // a power of two, a few per CPU of a large host

// Gate states: holds for work are taken only while open; holds that give
// back what a client holds (an object's Close, a release of pins) also
// while closing, so that Client.Close can run its closers.
const (
	gateOpen uint32 = iota
	gateClosing
	gateClosed
)

type gate struct {
	state  atomic.Uint32
	_      [124]byte // read by every hold: away from the shards' writes
	shards [holdShards]struct {
		n atomic.Int64
		_ [120]byte // a line and its adjacent-line prefetch partner to itself
	}
}

// ErrHoldsInFlight is what a Close gets when operations on the client do
// not finish in time: nothing was closed, and the client stays usable.
var ErrHoldsInFlight = errkind.New(errkind.Busy, "operations still in flight on the tier")

// CloseWait is how long Client.Close and Region.Close wait for the holds
// in flight: longer than any operation may take (a lock wait is a minute
// at most).
const CloseWait = 2 * time.Minute

// Hold is one operation's claim on a client's tier memory. Done must be
// called exactly once.
type Hold struct {
	c     *Client
	shard *atomic.Int64
}

// Hold is taken by every operation that touches the mapping, inside the
// library: ErrClosed once Close has begun (or the region is closed).
func (c *Client) Hold() (Hold, error) { return c.hold(gateOpen, "hold") }

// HoldToRelease is taken by an operation that gives back what the client
// holds (closing an object, releasing pins, aborting reservations): it is
// granted while the client closes, so that Close's closers can run, and
// refused only once they have.
func (c *Client) HoldToRelease() (Hold, error) { return c.hold(gateClosing, "release") }

func (c *Client) hold(upTo uint32, op string) (Hold, error) {
	s := &c.gate.shards[holdShard()].n
	s.Add(1)
	// Counted first, checked second: a closer that set the state before
	// this check waits for this count; one that set it after is seen here.
	if c.betweenCountAndCheck != nil {
		c.betweenCountAndCheck()
	}
	if st := c.gate.state.Load(); st > upTo {
		s.Add(-1)
		return Hold{}, fmt.Errorf("tier: %s on client slot %d: %s: %w", op, c.slot, gateStateName(st), ErrClosed)
	}
	if c.afterHoldCheck != nil {
		c.afterHoldCheck()
	}
	return Hold{c: c, shard: s}, nil
}

func gateStateName(st uint32) string {
	if st == gateClosing {
		return "the client is closing"
	}
	return "the client is closed"
}

// Done ends the hold; on the zero Hold (what a refused Hold returns) it
// does nothing, so that a caller may defer it before checking the error.
func (h Hold) Done() {
	if h.shard != nil {
		h.shard.Add(-1)
	}
}

// Client is the client the hold was taken from.
func (h Hold) Client() *Client { return h.c }

// Fenced reports ErrLeaseLost if the client's lease is no longer its own,
// read from the tier now: the check every write outside a lock makes just
// before it stores into memory a reaper may have given to another client.
func (h Hold) Fenced() error {
	if err := h.c.fenced(); err != nil {
		return fmt.Errorf("tier: %w", err)
	}
	return nil
}

// inFlight sums the shards.
func (g *gate) inFlight() int64 {
	var n int64
	for i := range g.shards {
		n += g.shards[i].n.Load()
	}
	return n
}

// shut moves the gate to state st and waits up to wait for the holds in
// flight. If they do not finish, it puts the gate back as it was and
// reports how many were left.
func (g *gate) shut(st uint32, wait time.Duration) error {
	was := g.state.Swap(st)
	deadline := time.Now().Add(wait)
	for pause := time.Microsecond; g.inFlight() > 0; pause = min(2*pause, 10*time.Millisecond) {
		if time.Now().After(deadline) {
			n := g.inFlight()
			g.state.Store(was)
			return fmt.Errorf("%w: %d after %v", ErrHoldsInFlight, n, wait)
		}
		time.Sleep(pause)
	}
	return nil
}

// OnClose registers fn to run when the client closes, after the holds in
// flight have finished and before the lease is released: objects opened on
// the client close with it, newest first (a load before its pool, a pool
// before its index), and never under a process-wide lock. fn may take
// HoldToRelease holds. The returned function unregisters fn and reports
// whether it was still registered: false means Close has run it or is
// running it.
func (c *Client) OnClose(fn func() error) (unregister func() bool) {
	c.closersMu.Lock()
	defer c.closersMu.Unlock()
	c.nextCloser++
	id := c.nextCloser
	if c.closers == nil {
		c.closers = map[uint64]func() error{}
	}
	c.closers[id] = fn
	return func() bool {
		c.closersMu.Lock()
		defer c.closersMu.Unlock()
		_, ok := c.closers[id]
		delete(c.closers, id)
		return ok
	}
}

// runClosers runs and forgets the registered closers, newest first, and
// returns the first error.
func (c *Client) runClosers() error {
	c.closersMu.Lock()
	fns := c.closers
	c.closers = nil
	c.closersMu.Unlock()
	var first error
	for _, id := range slices.Backward(slices.Sorted(maps.Keys(fns))) {
		if err := fns[id](); err != nil && first == nil {
			first = err
		}
	}
	return first
}
