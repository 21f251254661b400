package tier

import (
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// Lease slots are partitioned by node: node n owns slots
// [n*ClientsPerNode, (n+1)*ClientsPerNode). Processes of one node claim a
// slot with a CAS, which is safe because they share that host's caches; the
// reapers of other hosts only write a slot whose owner is dead.
//
// Slot layout (one line): state u32 · gen u32 · pid u32 · node u32 ·
// beat u64 · beat wall ns i64 · attached wall ns i64 · process start u64 ·
// flags u32 · name [8]byte · PID namespace u32.
//
// The pid and start time are the client's own, in its own PID namespace
// (pid 1 in a container), and the namespace is the inode of its
// /proc/self/ns/pid: a judge in another namespace cannot look the pid up,
// and judges the lease by its heartbeat alone. Every word is the client's
// say-so, which any process that can write the tier can forge: nothing
// here is reason to signal a process (peer.go says what is).

const (
	leaseFree uint32 = 0
	leaseLive uint32 = 1
	leaseDead uint32 = 2 // owner presumed dead; resources being reclaimed
)

const leaseFlagDaemon = 1 << 0

const (
	leaseNameAt  = 52
	leaseNameLen = 8
	leasePIDNSAt = 60
	leaseFlagsAt = 48
	leaseStartAt = 40
)

// LeaseInfo is a decoded lease slot.
type LeaseInfo struct {
	Slot  int    `json:"slot"`
	State string `json:"state"` // free, live, dead
	Gen   uint32 `json:"gen"`
	PID   int    `json:"pid"`
	// PIDNS is the inode of the client's PID namespace; 0 in a lease taken
	// by a build that did not record it.
	PIDNS    uint32    `json:"pid_namespace,omitempty"`
	Node     int       `json:"node"`
	Name     string    `json:"name"`
	Daemon   bool      `json:"daemon"`
	Beat     uint64    `json:"heartbeats"`
	LastBeat time.Time `json:"last_heartbeat"`
	Attached time.Time `json:"attached"`
	// Gone is set for a live lease of a one-host tier whose process no
	// longer runs (killed with no daemon to reap it): dead, not yet reaped.
	// Only a reader in the lease's PID namespace can tell.
	Gone bool `json:"process_gone,omitempty"`
	// ElsewhereNS is set for a lease taken in another PID namespace than
	// the reader's (a container): its pid is the client's own, not one the
	// reader can look up.
	ElsewhereNS bool `json:"other_pid_namespace,omitempty"`
	start       uint64
}

func (r *Region) readLease(slot int) LeaseInfo {
	line := r.leaseLine(slot)
	r.sync.refresh(line)
	st := atomic.LoadUint32(u32At(line, 0))
	inf := LeaseInfo{
		Slot:     slot,
		State:    [...]string{"free", "live", "dead"}[min(st, 2)],
		Gen:      atomic.LoadUint32(u32At(line, 4)),
		PID:      int(atomic.LoadUint32(u32At(line, 8))),
		Node:     int(atomic.LoadUint32(u32At(line, 12))),
		Beat:     atomic.LoadUint64(u64At(line, 16)),
		LastBeat: time.Unix(0, int64(atomic.LoadUint64(u64At(line, 24)))),
		Attached: time.Unix(0, int64(atomic.LoadUint64(u64At(line, 32)))),
		start:    atomic.LoadUint64(u64At(line, leaseStartAt)),
		Daemon:   atomic.LoadUint32(u32At(line, leaseFlagsAt))&leaseFlagDaemon != 0,
		PIDNS:    atomic.LoadUint32(u32At(line, leasePIDNSAt)),
	}
	name := line[leaseNameAt : leaseNameAt+leaseNameLen]
	for i, c := range name {
		if c == 0 {
			name = name[:i]
			break
		}
	}
	inf.Name = string(name)
	return inf
}

// Leases returns every non-free lease slot.
func (r *Region) Leases() []LeaseInfo {
	var out []LeaseInfo
	if r.live("leases") != nil {
		return nil
	}
	for s := 0; s < r.l.Nodes*r.l.ClientsPerNode; s++ {
		if inf := r.readLease(s); inf.State != "free" {
			inf.Gone = inf.State == "live" && r.l.Nodes == 1 && r.provenGone(inf)
			inf.ElsewhereNS = inf.PIDNS != 0 && !r.sameNamespace(inf)
			out = append(out, inf)
		}
	}
	return out
}

// LeaseGone reports whether the client that held lease slot slot at
// generation gen is gone: the slot is free, dead (being reaped) or another
// client's since, or, on a one-host tier, its process is proven gone
// (/proc, in the reader's PID namespace). A live lease it cannot judge
// (another namespace, another host) counts as there until the reaper
// declares it dead, a lease timeout after its last heartbeat.
//
// slot and gen come from another process's records in the tier, which any
// tier writer can forge: the answer is for deciding to stop waiting on that
// client, never for acting on its process.
func (r *Region) LeaseGone(slot int, gen uint32) (bool, error) {
	if err := r.live("lease"); err != nil {
		return false, err
	}
	if n := r.l.Nodes * r.l.ClientsPerNode; slot < 0 || slot >= n {
		return false, fmt.Errorf("tier: lease slot %d not in [0,%d): %w", slot, n, ErrOutOfBounds)
	}
	inf := r.readLease(slot)
	if inf.State != "live" || inf.Gen != gen {
		return true, nil
	}
	return r.l.Nodes == 1 && r.provenGone(inf), nil
}

// ClientOptions configure an attached client.
type ClientOptions struct {
	Node   int    // this host's node id
	Name   string // shown in status; up to 8 bytes are kept
	Daemon bool   // the node's daemon (its liveness stands for the node's)
	// Heartbeat period; 0 means a quarter of the region's lease timeout.
	Heartbeat time.Duration
	// LockWait bounds Lock's wait; 0 means LockWait.
	LockWait time.Duration
	// CloseWait bounds how long Close waits for holds in flight; 0 means
	// CloseWait.
	CloseWait time.Duration
}

// Client is one attached process (or one daemon): it holds a lease slot,
// heartbeats it, and is the identity that holds locks and owns chunks.
type Client struct {
	r     *Region
	node  int
	slot  int
	gen   uint32
	token uint64        // lock holder word: gen<<32 | slot+1
	hint  int64         // next-fit start for chunk searches; used under SystemLock
	wait  time.Duration // Lock's bound

	closeWait time.Duration // Close's bound on the holds in flight

	lost    atomic.Bool
	posted  []atomic.Bool // per lock: a request left awaiting the manager's grant by a Lock that timed out
	stop    chan struct{}
	done    sync.WaitGroup
	closeMu sync.Mutex
	closed  bool

	// afterLocalAcquire, in tests, runs between winning a lock's local
	// word and the lease re-check that follows.
	afterLocalAcquire func()
	// afterHolderCheck, in tests, runs in RemoveObject between its check
	// of the holders and the removal.
	afterHolderCheck func()
	// betweenCountAndCheck, in tests, runs in a hold between its count and
	// its check of the gate's state.
	betweenCountAndCheck func()
	// afterHoldCheck, in tests, runs in a hold after its check, before it
	// returns: whatever order count and check run in, a close begun here
	// must wait for the hold.
	afterHoldCheck func()

	// The client's proof to its node's daemon (peer.go): the heartbeat
	// goroutine registers; Close ends it.
	registered    atomic.Bool
	registerErr   atomic.Value // string
	registerAfter time.Time    // heartbeat goroutine only
	peerMu        sync.Mutex
	peerConn      *net.UnixConn // guarded by peerMu
	peerClosed    bool          // guarded by peerMu

	gate       gate // the holds in flight (hold.go)
	closersMu  sync.Mutex
	closers    map[uint64]func() error // OnClose's, by registration order
	nextCloser uint64
}

// Attach takes a lease slot on the given node and starts its heartbeat.
func (r *Region) Attach(opts ClientOptions) (*Client, error) {
	if err := r.live("attach"); err != nil {
		return nil, err
	}
	if r.readOnly {
		return nil, fmt.Errorf("tier: attach: %w", ErrReadOnly)
	}
	if opts.Node < 0 || opts.Node >= r.l.Nodes {
		return nil, fmt.Errorf("tier: attach: node %d not in [0,%d): %w", opts.Node, r.l.Nodes, ErrInvalidConfig)
	}
	first := opts.Node * r.l.ClientsPerNode
	for s := first; s < first+r.l.ClientsPerNode; s++ {
		line := r.leaseLine(s)
		r.sync.refresh(line)
		if !atomic.CompareAndSwapUint32(u32At(line, 0), leaseFree, leaseLive) {
			continue
		}
		return r.startLease(s, atomic.AddUint32(u32At(line, 4), 1), opts), nil
	}
	return nil, fmt.Errorf("tier: attach on node %d: all %d slots taken: %w", opts.Node, r.l.ClientsPerNode, ErrLeaseTable)
}

// adoptLease takes slot's lease of generation gen, in state from (live or
// dead), for a new client, with the next generation: one compare-and-swap
// of state and generation, so that of two takers one wins, and a client
// that still held the lease (it was not gone after all) finds it lost.
// For a daemon that must start while every slot is held by clients
// proven gone (NewManager); the caller reclaims what the old lease held.
func (r *Region) adoptLease(slot int, gen, from uint32, opts ClientOptions) (*Client, bool) {
	line := r.leaseLine(slot)
	r.sync.refresh(line)
	if !atomic.CompareAndSwapUint64(u64At(line, 0), uint64(gen)<<32|uint64(from), uint64(gen+1)<<32|uint64(leaseLive)) {
		return nil, false
	}
	return r.startLease(slot, gen+1, opts), true
}

// startLease fills in slot's lease, just claimed as live with generation
// gen, and starts its heartbeat.
func (r *Region) startLease(s int, gen uint32, opts ClientOptions) *Client {
	line := r.leaseLine(s)
	start, _ := procStartTime("self")
	c := &Client{r: r, node: opts.Node, slot: s, gen: gen, stop: make(chan struct{}), wait: opts.LockWait,
		posted: make([]atomic.Bool, r.l.LockSlots)}
	if c.wait <= 0 {
		c.wait = LockWait
	}
	c.closeWait = opts.CloseWait
	if c.closeWait <= 0 {
		c.closeWait = CloseWait
	}
	c.token = uint64(c.gen)<<32 | uint64(s+1)
	now := uint64(time.Now().UnixNano())
	atomic.StoreUint32(u32At(line, 8), uint32(os.Getpid()))
	atomic.StoreUint32(u32At(line, 12), uint32(opts.Node))
	atomic.StoreUint64(u64At(line, 16), 1)
	atomic.StoreUint64(u64At(line, 24), now)
	atomic.StoreUint64(u64At(line, 32), now)
	atomic.StoreUint64(u64At(line, leaseStartAt), start)
	var flags uint32
	if opts.Daemon {
		flags |= leaseFlagDaemon
	}
	atomic.StoreUint32(u32At(line, leaseFlagsAt), flags)
	name := line[leaseNameAt : leaseNameAt+leaseNameLen]
	clear(name)
	copy(name, opts.Name)
	atomic.StoreUint32(u32At(line, leasePIDNSAt), r.pidns)
	r.sync.publish(line)
	period := opts.Heartbeat
	if period <= 0 {
		period = r.l.LeaseTimeout / 4
	}
	c.done.Add(1)
	go c.heartbeat(period)
	r.track(c)
	return c
}

// owns reports whether the slot is still this client's live lease.
// fenced reports ErrLeaseLost once the client's lease is no longer its
// own (reaped, the slot perhaps reused): read from the tier, not from the
// heartbeat's last look, so a client resuming from a long pause learns it
// before its first lock, not a heartbeat period later.
func (c *Client) fenced() error {
	if c.lost.Load() {
		return fmt.Errorf("client slot %d: %w", c.slot, ErrLeaseLost)
	}
	line := c.r.leaseLine(c.slot)
	c.r.sync.refresh(line)
	if !c.owns(line) {
		c.lost.Store(true)
		return fmt.Errorf("client slot %d no longer holds its lease (closed, or reaped after a pause past the lease timeout): %w", c.slot, ErrLeaseLost)
	}
	return nil
}

func (c *Client) owns(line []byte) bool {
	return atomic.LoadUint32(u32At(line, 0)) == leaseLive && atomic.LoadUint32(u32At(line, 4)) == c.gen
}

func (c *Client) heartbeat(period time.Duration) {
	defer c.done.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	line := c.r.leaseLine(c.slot)
	c.register()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		c.r.sync.refresh(line)
		if !c.owns(line) {
			c.lost.Store(true)
			return
		}
		c.register()
		atomic.AddUint64(u64At(line, 16), 1)
		atomic.StoreUint64(u64At(line, 24), uint64(time.Now().UnixNano()))
		c.r.sync.publish(line[:32])
		c.beatPeer()
	}
}

// Slot is the client's lease slot index.
func (c *Client) Slot() int { return c.slot }

// Gen is the generation of the client's lease slot when it attached: with
// Slot, the name of this client's lease and of no later holder of the slot.
func (c *Client) Gen() uint32 { return c.gen }

// Node is the client's node id.
func (c *Client) Node() int { return c.node }

// Token identifies this client's lease (its generation and slot) as other
// processes see it: structures outside tier/ record it as an owner and ask
// Region.LeaseLive whether that owner still runs.
func (c *Client) Token() uint64 { return c.token }

// Region is the region the client is attached to.
func (c *Client) Region() *Region { return c.r }

// Err reports ErrLeaseLost once a reaper has taken the lease away (the
// process was presumed dead, e.g. it stalled past the lease timeout).
func (c *Client) Err() error {
	if err := c.r.live("client"); err != nil {
		return err
	}
	if c.lost.Load() {
		return fmt.Errorf("tier: client slot %d: %w", c.slot, ErrLeaseLost)
	}
	return nil
}

// abandon stops the client's heartbeat and marks its lease dead for a
// reaper to reclaim, for a region closing under it: later calls report
// ErrClosed.
func (c *Client) abandon() {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	close(c.stop)
	c.closePeer()
	c.done.Wait()
	// Marked dead, not left live without a heartbeat: the reaper then
	// reclaims it as it finds it, and does not take the process, which
	// lives on but can no longer write (the mapping goes next), for a
	// stalled one to end. One compare-and-swap of state and generation
	// together, so a slot reaped and taken again meanwhile is left alone.
	line := c.r.leaseLine(c.slot)
	gen := uint64(c.gen) << 32
	if atomic.CompareAndSwapUint64(u64At(line, 0), gen|uint64(leaseLive), gen|uint64(leaseDead)) {
		c.r.sync.publish(line)
	}
}

// Close frees the chunks the client still owns and releases its lease.
// Locks still held are released too. If the lock manager does not answer
// within the lease timeout, the client leaves its lease marked dead for the
// reaper to finish, and says so.
//
// First it turns new holds away and waits up to CloseWait for those in
// flight; if they do not finish it reports ErrHoldsInFlight and the client
// stays as it was. Then it runs the closers registered with OnClose.
func (c *Client) Close() error {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.closed {
		return fmt.Errorf("tier: client slot %d: %w", c.slot, ErrClosed)
	}
	if err := c.gate.shut(gateClosing, c.closeWait); err != nil {
		return fmt.Errorf("tier: close client slot %d: %w", c.slot, err)
	}
	cerr := c.runClosers()
	c.gate.state.Store(gateClosed)
	if err := c.release(); err != nil {
		return err
	}
	return cerr
}

// release stops the heartbeat, frees what the client owns and gives its
// lease back.
func (c *Client) release() error {
	c.closed = true
	close(c.stop)
	c.closePeer()
	c.done.Wait()
	c.r.untrack(c)
	if c.lost.Load() {
		return nil // a reaper already reclaimed everything
	}
	c.r.releaseLocksOf(c.node, c.token, c.token)
	line := c.r.leaseLine(c.slot)
	if c.r.ownsChunks(c.slot) {
		if !c.lockWithin(SystemLock, c.r.l.LeaseTimeout) {
			atomic.StoreUint32(u32At(line, 0), leaseDead)
			c.r.sync.publish(line)
			return fmt.Errorf("tier: close client slot %d: no lock grant within %v; left to the reaper: %w",
				c.slot, c.r.l.LeaseTimeout, ErrLeaseLost)
		}
		c.r.freeOwnedLocked(c.slot)
		_ = c.Unlock(SystemLock)
	}
	atomic.StoreUint32(u32At(line, 0), leaseFree)
	c.r.sync.publish(line)
	return nil
}
