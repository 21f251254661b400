package tier

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync/atomic"
	"time"
)

// The two-tier lock (TraCT §3.3). A process first wins its node's local
// holder word (a CAS: processes of one node share caches). If the tier has
// more than one node, the local winner then asks the lock manager through its
// node's global state word: it writes Waiting, the manager writes Locked when
// no other node holds the lock, and the node writes Idle to release. Each
// global word therefore has one writer at a time, which is what makes it
// safe on non-coherent memory with publish/refresh around every access.
// With one node the global step is skipped: the local word is the lock.

const (
	lockIdle    uint32 = 0
	lockWaiting uint32 = 1
	lockLocked  uint32 = 2
)

// SystemLock guards the chunk allocator and the root directory. Other
// packages take ids from FirstUserLock upward.
const (
	SystemLock    = 0
	FirstUserLock = 1
)

// UserLockFor picks the user lock of a shared structure by a key its users
// agree on ("rooms\x00NAME"): every process that maps the tier picks the
// same one. With no user locks it is SystemLock.
func (r *Region) UserLockFor(key string) int {
	locks := r.l.LockSlots
	if locks <= FirstUserLock {
		return SystemLock
	}
	h := fnv.New32a()
	h.Write([]byte(key))
	return FirstUserLock + int(h.Sum32()%uint32(locks-FirstUserLock))
}

func (r *Region) checkLockID(id int) error {
	if id < 0 || id >= r.l.LockSlots {
		return fmt.Errorf("tier: lock %d not in [0,%d): %w", id, r.l.LockSlots, ErrInvalidConfig)
	}
	return nil
}

// LockWait bounds Lock's wait. Locks are held for a mutation's time
// (microseconds to milliseconds), and a holder that dies is replaced by
// its waiters or the reaper within a lease timeout; a wait this long means
// a live process holds the lock and does not let go, which a caller should
// hear about rather than hang on.
const LockWait = time.Minute

// Lock acquires global lock id, waiting at most the client's LockWait.
func (c *Client) Lock(id int) error {
	return c.lock(id, waitLimit{wait: c.wait})
}

// LockContext acquires global lock id, waiting until ctx ends: for the
// node-local stage, then for the manager's grant. A holder word naming no
// live lease (its client died, or the word is damage) is taken over and
// released by the waiter, so a dead holder never blocks it. A wait that
// ends without the lock is ErrLockTimeout, naming the holder.
func (c *Client) LockContext(ctx context.Context, id int) error {
	return c.lock(id, waitLimit{ctx: ctx})
}

// waitLimit is what a lock wait consults now and then: a caller's context,
// or else a wait that ends a given time after its first consultation. A
// lock wait consults it only once it has spun a while, so an uncontended
// Lock (the common case: prefix mutations take one per batch) makes no
// timer and reads no clock; the wait it bounds is longer by the spin. It
// is a concrete type passed by pointer, not an interface, so that it stays
// on the stack: a lock per mutation must not allocate.
type waitLimit struct {
	ctx  context.Context // nil: wait, from the first consultation
	wait time.Duration
	end  time.Time
}

func (w *waitLimit) Deadline() (time.Time, bool) {
	if w.ctx != nil {
		return w.ctx.Deadline()
	}
	if w.end.IsZero() {
		w.end = time.Now().Add(w.wait)
	}
	return w.end, true
}

// left is the wait that remains, for the grant's stage (0: no bound; at
// least a millisecond once bounded, so an expired bound still looks once).
func (w *waitLimit) left() time.Duration {
	if d, ok := w.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return 0
}

func (w *waitLimit) Err() error {
	if w.ctx != nil {
		return w.ctx.Err()
	}
	if end, _ := w.Deadline(); !time.Now().Before(end) {
		return context.DeadlineExceeded
	}
	return nil
}

func (c *Client) lock(id int, lim waitLimit) error {
	if err := c.r.live("lock"); err != nil {
		return err
	}
	if err := c.r.checkLockID(id); err != nil {
		return err
	}
	if err := c.fenced(); err != nil {
		return fmt.Errorf("tier: lock %d: %w", id, err)
	}
	global, local := c.r.lockLines(id, c.node)
	if c.posted[id].Load() {
		return c.resumeGrant(id, global, local, lim)
	}
	if err := c.acquireLocal(&lim, global, local, true); err != nil {
		if lim.Err() != nil {
			return fmt.Errorf("tier: lock %d: %s: %w", id, c.r.describeHolder(local), ErrLockTimeout)
		}
		return fmt.Errorf("tier: lock %d: %w", id, err)
	}
	if c.afterLocalAcquire != nil {
		c.afterLocalAcquire()
	}
	// A client paused past the lease timeout (SIGSTOP, a frozen
	// container, a debugger) was reaped while it waited: its memory freed,
	// its locks given away. It must not go on as if it held anything.
	if err := c.fenced(); err != nil {
		c.r.releaseHeld(global, local, c.token)
		return fmt.Errorf("tier: lock %d: %w", id, err)
	}
	if c.r.l.Nodes == 1 {
		return nil
	}
	c.r.postRequest(global)
	if !c.r.awaitGrantFor(global, lim.left()) {
		// The request stays posted (withdrawing it would race the grant):
		// this client's next Lock of id waits for the grant again, and
		// its Close or a reaper finishes the handshake.
		c.posted[id].Store(true)
		return fmt.Errorf("tier: lock %d: no grant from the lock manager within the wait (is cxltierd running?): %w", id, ErrLockTimeout)
	}
	return nil
}

// resumeGrant is Lock of a lock whose request an earlier Lock left posted
// when its wait for the manager's grant ran out. The node-local word is
// still this client's, which a fresh attempt would take for a nested Lock
// (ErrLockHeld, on every try: the client was wedged on that lock until it
// closed); instead it waits for the grant again.
func (c *Client) resumeGrant(id int, global, local []byte, lim waitLimit) error {
	c.r.sync.refresh(local)
	if atomic.LoadUint64(u64At(local, 0)) != c.token {
		// Released on this client's behalf meanwhile: start afresh.
		c.posted[id].Store(false)
		return c.lock(id, lim)
	}
	if !c.r.awaitGrantFor(global, lim.left()) {
		return fmt.Errorf("tier: lock %d: still no grant from the lock manager (is cxltierd running?): %w", id, ErrLockTimeout)
	}
	c.posted[id].Store(false)
	return nil
}

// describeHolder names the client in a lock's node-local word.
func (r *Region) describeHolder(local []byte) string {
	tok := atomic.LoadUint64(u64At(local, 0))
	slot := r.TokenSlot(tok)
	switch {
	case tok == 0:
		return "free now"
	case slot < 0:
		return fmt.Sprintf("held by a malformed token %#x", tok)
	}
	inf := r.readLease(slot)
	return fmt.Sprintf("held by client slot %d (%q, pid %d, %s)", slot, inf.Name, inf.PID, inf.State)
}

// lockWithin takes lock id, giving up after limit. On a give-up in the
// global stage the request stays posted (withdrawing it would race the
// manager's grant); the caller must leave it to a reaper.
func (c *Client) lockWithin(id int, limit time.Duration) bool {
	global, local := c.r.lockLines(id, c.node)
	if c.acquireLocal(&waitLimit{wait: limit}, global, local, false) != nil {
		return false
	}
	if c.r.l.Nodes == 1 {
		return true
	}
	c.r.postRequest(global)
	return c.r.awaitGrantFor(global, limit)
}

// acquireLocal takes the node-local stage of a lock: a CAS of the holder
// word from 0 to this client's token. Now and then it checks the holder: one
// that names no live lease is released on its behalf (releaseOrphan). It
// gives up when ctx ends and, if checkClient, when this client's lease is
// lost or closed.
func (c *Client) acquireLocal(lim *waitLimit, global, local []byte, checkClient bool) error {
	holder := u64At(local, 0)
	for try := 0; ; try++ {
		c.r.sync.refresh(local)
		switch atomic.LoadUint64(holder) {
		case 0:
			if atomic.CompareAndSwapUint64(holder, 0, c.token) {
				c.r.sync.publish(local)
				return nil
			}
		case c.token:
			// Locks do not nest: this client holds it (a caller's bug) or
			// the word was damaged into its token. Waiting would never end.
			return fmt.Errorf("client slot %d: %w", c.slot, ErrLockHeld)
		}
		if checkClient {
			if err := c.Err(); err != nil {
				return err
			}
		}
		if try%64 == 63 {
			if err := lim.Err(); err != nil {
				return err
			}
			c.r.releaseOrphan(global, local, c.token)
		}
		backoff(try)
	}
}

// releaseOrphan releases a lock whose node-local word names no live lease
// — a client that died between reaper passes, or a damaged word — acting as
// its heir (releaseAs). It reports whether it released it.
func (r *Region) releaseOrphan(global, local []byte, heir uint64) bool {
	tok := atomic.LoadUint64(u64At(local, 0))
	if tok == 0 || tok == heir || r.holderAlive(tok) {
		return false
	}
	return r.releaseAs(global, local, tok, heir)
}

// releaseAs takes a lock's node-local word from dead to heir with a CAS and
// completes the protocol from whatever global state it finds. It reports
// false when another took the word first, or when this node's request is
// still awaiting the manager's grant (the heir keeps the word and a later
// pass finishes).
func (r *Region) releaseAs(global, local []byte, dead, heir uint64) bool {
	holder := u64At(local, 0)
	if dead != heir && !atomic.CompareAndSwapUint64(holder, dead, heir) {
		return false
	}
	r.sync.publish(local)
	if r.l.Nodes > 1 {
		r.sync.refresh(global)
		if atomic.LoadUint32(u32At(global, 0)) == lockWaiting && !r.awaitGrantFor(global, r.l.LeaseTimeout) {
			// The manager may be granting right now, so the heir must
			// finish the handshake rather than race it.
			return false
		}
	}
	r.releaseHeld(global, local, heir)
	return true
}

// postRequest marks this node as waiting for the manager's grant.
func (r *Region) postRequest(global []byte) {
	atomic.StoreUint32(u32At(global, 0), lockWaiting)
	r.sync.publish(global)
}

// awaitGrantFor waits up to limit (0: forever) for the manager's grant.
func (r *Region) awaitGrantFor(global []byte, limit time.Duration) bool {
	state := u32At(global, 0)
	deadline := time.Now().Add(limit)
	for try := 0; ; try++ {
		r.sync.refresh(global)
		if atomic.LoadUint32(state) == lockLocked {
			return true
		}
		if limit > 0 && try%64 == 63 && time.Now().After(deadline) {
			return false
		}
		backoff(try)
	}
}

// LockBusy reports whether some client of this node holds lock id or is
// taking it, as of the moment it looks: a hint for a caller with other
// work to do first (a batch that touches several shards visits the free
// ones before it waits on a busy one), never a promise that Lock will not
// wait. A bad id or a closed region reads as not busy: Lock reports those.
func (c *Client) LockBusy(id int) bool {
	if c.r.Closed() || c.r.checkLockID(id) != nil {
		return false
	}
	_, local := c.r.lockLines(id, c.node)
	c.r.sync.refresh(local)
	return atomic.LoadUint64(u64At(local, 0)) != 0
}

// Unlock releases lock id, which this client must hold.
func (c *Client) Unlock(id int) error {
	if err := c.r.live("unlock"); err != nil {
		return err
	}
	if err := c.r.checkLockID(id); err != nil {
		return err
	}
	global, local := c.r.lockLines(id, c.node)
	c.r.sync.refresh(local)
	if atomic.LoadUint64(u64At(local, 0)) != c.token {
		if err := c.fenced(); err != nil { // reaped inside its critical section
			return fmt.Errorf("tier: unlock %d: %w", id, err)
		}
		return fmt.Errorf("tier: unlock %d: not held by client slot %d: %w", id, c.slot, ErrNotOwner)
	}
	c.r.releaseHeld(global, local, c.token)
	return nil
}

// releaseHeld releases a lock whose local word holds token: global word
// first, so no process of this node can start a new request before the
// manager sees this one end.
func (r *Region) releaseHeld(global, local []byte, token uint64) {
	if r.l.Nodes > 1 {
		atomic.StoreUint32(u32At(global, 0), lockIdle)
		r.sync.publish(global)
	}
	atomic.CompareAndSwapUint64(u64At(local, 0), token, 0)
	r.sync.publish(local)
}

// withLock runs fn holding lock id. The lock goes back even when fn
// panics (a bug, which the C library recovers into an error): kept, it
// would stall every client on every host until this process died.
func (c *Client) withLock(id int, fn func() error) (err error) {
	if err := c.Lock(id); err != nil {
		return err
	}
	defer func() {
		uerr := c.Unlock(id)
		if errors.Is(uerr, ErrLeaseLost) {
			// Reaped inside the critical section (a long pause): what fn
			// saw or reported after that came from a tier the reaper had
			// changed under it. Say so first.
			err = errors.Join(uerr, err)
			return
		}
		if err == nil {
			err = uerr
		}
	}()
	return fn()
}

// releaseLocksOf releases every lock whose node-local word on node holds
// dead, acting as its holder: the caller (the client itself at Close, or the
// node's reaper with its own token as heir) takes the dead holder's place
// with a CAS and completes the protocol from whatever global state it finds.
// It returns the number of locks released.
func (r *Region) releaseLocksOf(node int, dead, heir uint64) int {
	n := 0
	for id := 0; id < r.l.LockSlots; id++ {
		global, local := r.lockLines(id, node)
		r.sync.refresh(local)
		if atomic.LoadUint64(u64At(local, 0)) == dead && r.releaseAs(global, local, dead, heir) {
			n++
		}
	}
	return n
}

// releaseOrphans releases every lock on node whose holder names no live
// lease (the reaper's pass: a damaged holder word is no client it would
// ever reap), as heir. It returns how many.
func (r *Region) releaseOrphans(node int, heir uint64) int {
	n := 0
	for id := 0; id < r.l.LockSlots; id++ {
		global, local := r.lockLines(id, node)
		r.sync.refresh(local)
		if r.releaseOrphan(global, local, heir) {
			n++
		}
	}
	return n
}

// LockState describes one lock for status pages.
type LockState struct {
	ID     int `json:"id"`
	Holder int `json:"holder_slot"` // lease slot of the node-local holder, -1 if none
	Node   int `json:"node"`        // node that holds it (global stage), -1 if none
	// Orphan: the holder word names no live lease (a dead client not yet
	// reaped, or damage); the next waiter or reaper pass releases it.
	Orphan bool   `json:"orphan,omitempty"`
	Nodes  string `json:"nodes"` // per node: I(dle), W(aiting), L(ocked); "-" on one-node tiers
}

// Locks returns the state of every lock that is held or requested.
func (r *Region) Locks() []LockState {
	var out []LockState
	if r.live("locks") != nil {
		return nil
	}
	for id := 0; id < r.l.LockSlots; id++ {
		st := LockState{ID: id, Holder: -1, Node: -1}
		nodeStates := make([]byte, r.l.Nodes)
		busy := false
		for n := 0; n < r.l.Nodes; n++ {
			global, local := r.lockLines(id, n)
			r.sync.refresh(global)
			r.sync.refresh(local)
			if tok := atomic.LoadUint64(u64At(local, 0)); tok != 0 {
				busy = true
				if st.Holder < 0 {
					st.Holder = int(uint32(tok)) - 1
				}
				st.Orphan = st.Orphan || !r.holderAlive(tok)
			}
			nodeStates[n] = '-'
			if r.l.Nodes > 1 {
				s := atomic.LoadUint32(u32At(global, 0))
				nodeStates[n] = "IWL"[min(s, 2)]
				if s == lockLocked {
					st.Node = n
				}
			} else if st.Holder >= 0 {
				st.Node = 0
			}
		}
		if busy {
			st.Nodes = string(nodeStates)
			out = append(out, st)
		}
	}
	return out
}

// LeaseLive says whether the lease named by a client token is still live:
// its slot is taken and has not been reaped or reused since. A client killed
// without detaching stays live until a manager reaps it.
func (r *Region) LeaseLive(token uint64) bool { return r.holderAlive(token) }

// MaxClients is how many leases the region holds (all nodes together); a
// token's slot is below it.
func (r *Region) MaxClients() int { return r.l.Nodes * r.l.ClientsPerNode }

// TokenSlot is the lease slot a client token names, or -1 for a malformed token.
func (r *Region) TokenSlot(token uint64) int {
	slot := int(uint32(token)) - 1
	if slot < 0 || slot >= r.MaxClients() {
		return -1
	}
	return slot
}

// holderAlive says whether the lease named by a lock token is still live.
func (r *Region) holderAlive(token uint64) bool {
	if r.live("lease") != nil {
		return false
	}
	slot := int(uint32(token)) - 1
	if slot < 0 || slot >= r.l.Nodes*r.l.ClientsPerNode {
		return false
	}
	line := r.leaseLine(slot)
	r.sync.refresh(line)
	return atomic.LoadUint32(u32At(line, 0)) == leaseLive && atomic.LoadUint32(u32At(line, 4)) == uint32(token>>32)
}
