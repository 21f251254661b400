package tier

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// ManagerOptions configure the daemon-side duties of a node.
type ManagerOptions struct {
	Node int // this daemon's node id
	// GrantLocks makes this node the lock manager: it grants global locks and
	// reaps clients of nodes whose daemon is gone. Exactly one node should.
	GrantLocks bool
	// SkipPIDCheck judges same-node clients by heartbeat alone (as remote
	// nodes always are), and never ends a process. By default a same-node
	// client whose process is proven to have exited is reaped at once.
	SkipPIDCheck bool
	// NoClientSocket leaves the node's client socket (peer.go) closed: no
	// client can prove who it is, so no process is ever signalled, and a
	// client in another PID namespace is looked up through its namespace.
	NoClientSocket bool
	// Reap period; 0 means a quarter of the lease timeout.
	Interval time.Duration
	Logf     func(format string, args ...any)
}

// Reaped records one reclaimed client.
type Reaped struct {
	Slot   int       `json:"slot"`
	PID    int       `json:"pid"`
	Node   int       `json:"node"`
	Name   string    `json:"name"`
	Reason string    `json:"reason"`
	At     time.Time `json:"at"`
	Chunks int64     `json:"chunks_freed"`
	Locks  int       `json:"locks_released"`
}

// ManagerStats are cumulative counters.
type ManagerStats struct {
	Reaped uint64
	Grants uint64
	// Quarantined counts reap passes that found a process of this host
	// alive past its lease and could not end it: its memory stayed its own.
	Quarantined uint64
}

// Manager runs a node's lock manager and lease reaper. The manager holds a
// lease of its own (flagged as the node's daemon).
type Manager struct {
	r    *Region
	self *Client
	opts ManagerOptions

	reapMu    sync.Mutex       // one reap pass at a time (the loop, or an admin request)
	beats     map[int]beatSeen // guarded by reapMu
	lastGrant []int            // grant goroutine only

	mu     sync.Mutex
	reaped []Reaped // most recent last, bounded

	nReaped      atomic.Uint64
	nGrants      atomic.Uint64
	nQuarantined atomic.Uint64

	// peers are the clients that proved who they are (nil without a socket).
	peers *peerServer

	// stop ends a proven client's process alive past its lease (stopPeer;
	// tests put one that fails).
	stop func(p *peer, wait time.Duration) error

	// seesAllPIDs: this daemon runs in the kernel's initial PID namespace,
	// so a process of any namespace that it cannot find is gone (tests
	// clear it to play a daemon in a container without hostPID).
	seesAllPIDs bool
}

type beatSeen struct {
	gen  uint32
	beat uint64
	at   time.Time
}

const keepReaped = 64

// runningDaemon reports whether lease inf is a daemon of node opts.Node
// that runs: live, its process there (checked on this host unless
// SkipPIDCheck: a daemon that crashed leaves a fresh lease behind), and
// heartbeating. A heartbeat time further ahead than any clock skew is a
// damaged or forged lease, which would never age: not a daemon to yield to.
func (r *Region) runningDaemon(inf LeaseInfo, opts ManagerOptions) bool {
	if !inf.Daemon || inf.Node != opts.Node || inf.State != "live" {
		return false
	}
	if !opts.SkipPIDCheck && r.provenGone(inf) {
		return false
	}
	age := time.Since(inf.LastBeat)
	return age < r.l.LeaseTimeout && age > -r.l.LeaseTimeout-time.Minute
}

// RunningDaemon reports the daemon that serves node, if one does by the
// tests NewManager applies before it starts (a live daemon lease whose
// process is not proven gone, heartbeating).
func (r *Region) RunningDaemon(node int) (LeaseInfo, bool) {
	for _, inf := range r.Leases() {
		if r.runningDaemon(inf, ManagerOptions{Node: node}) {
			return inf, true
		}
	}
	return LeaseInfo{}, false
}

// NewManager attaches the daemon's own lease on node opts.Node.
func NewManager(r *Region, opts ManagerOptions) (*Manager, error) {
	for _, inf := range r.Leases() {
		// A daemon that crashed or was killed leaves a fresh lease behind:
		// on this host its process is checked, so a restart goes ahead.
		if r.runningDaemon(inf, opts) {
			return nil, fmt.Errorf("tier: manager: a daemon for node %d runs already (slot %d, pid %d, %q): %w",
				opts.Node, inf.Slot, inf.PID, inf.Name, ErrExists)
		}
	}
	// The reaper's waits are bounded by the lease timeout: a pass that
	// cannot take the system lock gives up and the next pass tries again,
	// rather than holding up every other reclaim for a minute.
	selfOpts := ClientOptions{Node: opts.Node, Name: "cxltierd", Daemon: true, LockWait: r.l.LeaseTimeout}
	self, err := r.Attach(selfOpts)
	var adopted *adoption
	if errors.Is(err, ErrLeaseTable) {
		self, adopted = r.adoptGone(selfOpts, opts)
		if self == nil {
			err = fmt.Errorf("%w, and no slot's client is proven gone (a live or unprovable client holds each: cxltier status lists them)", err)
		}
	}
	if self == nil {
		return nil, fmt.Errorf("tier: manager: %w", err)
	}
	if opts.Interval <= 0 {
		opts.Interval = r.l.LeaseTimeout / 4
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	m := &Manager{r: r, self: self, opts: opts, beats: map[int]beatSeen{}, lastGrant: make([]int, r.l.LockSlots), stop: stopPeer,
		seesAllPIDs: r.pidns == initPIDNamespace}
	if adopted != nil {
		// What the gone client held goes before the daemon holds anything
		// (the slot's chunks are its): its locks, its chunks.
		if _, ok := m.finalize(adopted.inf, opts.Node, adopted.why+"; its slot taken over by this daemon, every slot being held"); !ok {
			opts.Logf("the gone client of slot %d held locks or chunks not yet reclaimed: the next reap pass finishes", adopted.inf.Slot)
		}
	}
	if !opts.NoClientSocket && r.devs[0].backing.Kind != BackingAnon {
		m.peers, err = listenPeers(r, opts.Node, opts.Logf)
		if errors.Is(err, ErrExists) {
			self.Close()
			return nil, fmt.Errorf("tier: manager: %w", err)
		}
		if err != nil {
			// The daemon serves on without proofs: stalled clients are
			// quarantined instead of ended, and clients of other PID
			// namespaces are judged by heartbeat alone.
			opts.Logf("no client socket (no client can prove who it is; none will be signalled): %v", err)
		}
		peers := m.peers
		self.OnClose(func() error { peers.close(); return nil })
	}
	return m, nil
}

// Close stops the client socket and releases the manager's lease; Run
// does it when it returns.
func (m *Manager) Close() error {
	m.peers.close()
	if err := m.self.Close(); err != nil && !errors.Is(err, ErrClosed) {
		return err
	}
	return nil
}

// SocketPath is where the manager hears its clients, "" if nowhere.
func (m *Manager) SocketPath() string {
	if m.peers == nil {
		return ""
	}
	return m.peers.path
}

// Run grants locks (if configured) and reaps until ctx ends, then releases
// the manager's lease.
func (m *Manager) Run(ctx context.Context) error {
	// The grant loop outlives ctx by the manager's own Close, which may
	// need a grant to free the manager's chunks.
	grantCtx, stopGrants := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if m.opts.GrantLocks && m.r.l.Nodes > 1 {
		wg.Add(1)
		go func() { defer wg.Done(); m.grantLoop(grantCtx) }()
	}
	defer func() { stopGrants(); wg.Wait() }()
	t := time.NewTicker(m.opts.Interval)
	defer t.Stop()
	for {
		if err := m.stillTheDaemon(); err != nil {
			m.peers.close()
			if errors.Is(err, ErrLeaseLost) {
				m.self.abandon() // the lease is another's now
			} else {
				err = errors.Join(err, m.self.Close())
			}
			return err
		}
		m.ReapOnce()
		select {
		case <-ctx.Done():
			return m.Close()
		case <-t.C:
		}
	}
}

// stillTheDaemon checks, while the manager runs, what NewManager checked
// at its start: that it is its node's one daemon. Two started at the same
// moment both pass that check, and a daemon paused past the lease timeout
// (its lease reaped, a replacement started) resumes beside its
// replacement; of two live daemons of a node the one attached first stays
// and the other stops, and a daemon whose lease was reaped stops.
func (m *Manager) stillTheDaemon() error {
	if err := m.self.fenced(); err != nil {
		return fmt.Errorf("tier: manager of node %d: %w; stopping (another daemon may serve the node now)", m.opts.Node, err)
	}
	me := m.r.readLease(m.self.slot)
	for _, inf := range m.r.Leases() {
		if inf.Slot == m.self.slot || !m.r.runningDaemon(inf, m.opts) {
			continue
		}
		if inf.Attached.Before(me.Attached) || (inf.Attached.Equal(me.Attached) && inf.Slot < me.Slot) {
			return fmt.Errorf("tier: manager of node %d: %w: daemon slot %d (pid %d) serves the node since %v; this one stops",
				m.opts.Node, ErrExists, inf.Slot, inf.PID, inf.Attached.Format(time.RFC3339))
		}
	}
	return nil
}

// Client is the manager's own lease.
func (m *Manager) Client() *Client { return m.self }

// Stats returns cumulative counters.
func (m *Manager) Stats() ManagerStats {
	return ManagerStats{Reaped: m.nReaped.Load(), Grants: m.nGrants.Load(), Quarantined: m.nQuarantined.Load()}
}

// Reaped returns the most recently reclaimed clients, oldest first.
func (m *Manager) Reaped() []Reaped {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Reaped(nil), m.reaped...)
}

// grantLoop polls the global lock words. It spins while there is traffic
// and backs off to short sleeps when idle, so an idle daemon costs little.
func (m *Manager) grantLoop(ctx context.Context) {
	idle := 0
	for ctx.Err() == nil {
		if m.grantPass() {
			idle = 0
			runtime.Gosched()
			continue
		}
		idle++
		backoff(idle)
	}
}

// grantPass grants each free lock to the next waiting node after the one it
// last granted (round robin, so no node starves). It reports whether any
// lock was held or requested.
func (m *Manager) grantPass() bool {
	active := false
	nodes := m.r.l.Nodes
	for id := 0; id < m.r.l.LockSlots; id++ {
		held, waiting := false, -1
		for k := 1; k <= nodes; k++ {
			n := (m.lastGrant[id] + k) % nodes
			global, _ := m.r.lockLines(id, n)
			m.r.sync.refresh(global)
			switch atomic.LoadUint32(u32At(global, 0)) {
			case lockLocked:
				held = true
			case lockWaiting:
				if waiting < 0 {
					waiting = n
				}
			}
		}
		if held || waiting >= 0 {
			active = true
		}
		if held || waiting < 0 {
			continue
		}
		global, _ := m.r.lockLines(id, waiting)
		atomic.StoreUint32(u32At(global, 0), lockLocked)
		m.r.sync.publish(global)
		m.lastGrant[id] = waiting
		m.nGrants.Add(1)
	}
	return active
}

// ReapOnce judges every lease this node is responsible for and reclaims the
// dead: its own node's clients, and, on the lock manager, the clients of
// nodes whose daemon is gone. It returns the clients reclaimed in this pass.
func (m *Manager) ReapOnce() []Reaped {
	m.reapMu.Lock()
	defer m.reapMu.Unlock()
	total := m.r.l.Nodes * m.r.l.ClientsPerNode
	daemons := m.liveDaemons()
	// Every dead lease is marked before any is finalized: finalizing takes
	// the system lock, and a dead client of a later slot may hold it; marked
	// dead, its lock is an orphan the wait releases (judged one by one, the
	// pass waited on it for the whole lock wait and reaped nothing).
	type doomed struct {
		inf    LeaseInfo
		node   int
		reason string
	}
	var dead []doomed
	for slot := 0; slot < total; slot++ {
		node := slot / m.r.l.ClientsPerNode
		if slot == m.self.slot || (node != m.opts.Node && !(m.opts.GrantLocks && !daemons[node])) {
			continue
		}
		inf := m.r.readLease(slot)
		reason := ""
		switch inf.State {
		case "live":
			if reason = m.judge(inf, node == m.opts.Node); reason == "" {
				continue
			}
			if !m.ended(inf, node, &reason, false) {
				continue
			}
			if !m.r.markDead(slot, inf.Gen) {
				continue
			}
		case "dead":
			reason = "marked dead earlier"
		default:
			delete(m.beats, slot)
			continue
		}
		dead = append(dead, doomed{inf, node, reason})
	}
	var out []Reaped
	for _, d := range dead {
		if rp, done := m.finalize(d.inf, d.node, d.reason); done {
			out = append(out, rp)
		}
	}
	m.r.releaseOrphans(m.opts.Node, m.self.token)
	m.peers.prune()
	return out
}

// Reap reclaims the client in lease slot slot now, whatever its
// heartbeat says: for an operator who knows the process is gone (its host
// powered off) and will not wait out the lease, and for tests that stand
// in for a crash. A process of this host that still runs is ended first,
// as a reap pass would. A slot that holds no lease is ErrNotFound.
func (m *Manager) Reap(slot int, reason string) (Reaped, error) {
	m.reapMu.Lock()
	defer m.reapMu.Unlock()
	if slot < 0 || slot >= m.r.l.Nodes*m.r.l.ClientsPerNode || slot == m.self.slot {
		return Reaped{}, fmt.Errorf("tier: reap slot %d: %w: not a client's slot", slot, ErrInvalidConfig)
	}
	inf := m.r.readLease(slot)
	if inf.State == "live" && !m.ended(inf, slot/m.r.l.ClientsPerNode, &reason, true) {
		return Reaped{}, fmt.Errorf("tier: reap slot %d: process %d is alive and could not be ended: %w", slot, inf.PID, ErrLockTimeout)
	}
	switch {
	case inf.State == "live" && m.r.markDead(slot, inf.Gen):
	case inf.State == "dead":
	default:
		return Reaped{}, fmt.Errorf("tier: reap slot %d: %w: no lease there", slot, ErrNotFound)
	}
	rp, done := m.finalize(inf, slot/m.r.l.ClientsPerNode, reason)
	if !done {
		return Reaped{}, fmt.Errorf("tier: reap slot %d: marked dead; %w: its locks or chunks wait for the next pass", slot, ErrLockTimeout)
	}
	m.r.releaseOrphans(m.opts.Node, m.self.token)
	return rp, nil
}

// markDead moves slot's lease of generation gen from live to dead, as
// other hosts see it; false if it was not live (another reaper, or its
// client, got there) or is another generation's: the slot was freed and
// taken again since it was judged, by a client that runs. State and
// generation change in one compare-and-swap (state is the low word).
func (r *Region) markDead(slot int, gen uint32) bool {
	line := r.leaseLine(slot)
	g := uint64(gen) << 32
	if !atomic.CompareAndSwapUint64(u64At(line, 0), g|uint64(leaseLive), g|uint64(leaseDead)) {
		return false
	}
	r.sync.publish(line)
	return true
}

func (m *Manager) liveDaemons() []bool {
	live := make([]bool, m.r.l.Nodes)
	for _, inf := range m.r.Leases() {
		if inf.State == "live" && inf.Daemon {
			live[inf.Node] = true
		}
	}
	return live
}

// adoption is a lease a starting daemon took over from a client proven
// gone, and why it was.
type adoption struct {
	inf LeaseInfo
	why string
}

// adoptGone attaches a daemon whose node has no free slot to the slot of a
// client proven gone, without a slot of its own to judge from: a lease
// already marked dead, one naming pid 0 (no client's: forged or damaged),
// or one whose process is proven to have exited (this PID namespace's, by
// /proc; another's, found through it). Nil when no slot qualifies.
func (r *Region) adoptGone(selfOpts ClientOptions, opts ManagerOptions) (*Client, *adoption) {
	first := opts.Node * r.l.ClientsPerNode
	for slot := first; slot < first+r.l.ClientsPerNode; slot++ {
		inf := r.readLease(slot)
		from, why := leaseLive, r.goneWithoutADaemon(inf, opts)
		if inf.State == "dead" {
			from, why = leaseDead, "marked dead earlier"
		}
		if why == "" || !r.leaseStill(inf) {
			continue
		}
		if c, ok := r.adoptLease(slot, inf.Gen, from, selfOpts); ok {
			return c, &adoption{inf, why}
		}
	}
	return nil, nil
}

// leaseStill reports whether slot inf.Slot's lease reads as inf after a
// pause: a client between claiming a slot and writing its pid shows the
// previous holder's words (which may name a process long gone), and is
// done writing its own within the pause.
func (r *Region) leaseStill(inf LeaseInfo) bool {
	time.Sleep(adoptPause)
	now := r.readLease(inf.Slot)
	return now.State == inf.State && now.Gen == inf.Gen && now.PID == inf.PID && now.Beat == inf.Beat &&
		now.LastBeat.Equal(inf.LastBeat)
}

// adoptPause is how long a lease must hold still before a starting daemon
// takes its slot over.
const adoptPause = 50 * time.Millisecond

// goneWithoutADaemon says why live lease inf's client is proven gone, ""
// if it is not (or cannot be proven so without a daemon's proofs).
func (r *Region) goneWithoutADaemon(inf LeaseInfo, opts ManagerOptions) string {
	switch {
	case inf.State != "live":
		return ""
	case inf.PID == 0:
		if time.Since(inf.LastBeat) <= r.l.LeaseTimeout {
			return "" // still beating, or a client that has not written its pid yet
		}
		return "its lease names pid 0, which no client has (forged or damaged)"
	case opts.SkipPIDCheck:
		return ""
	case r.sameNamespace(inf):
		if r.provenGone(inf) {
			return fmt.Sprintf("process %d exited", inf.PID)
		}
	case inf.PIDNS != 0:
		host, seen, err := findInNamespace(inf.PIDNS, inf.PID, inf.start)
		if err == nil && host == 0 && (seen || r.pidns == initPIDNamespace) {
			return fmt.Sprintf("no process is pid %d of PID namespace %d", inf.PID, inf.PIDNS)
		}
	}
	return ""
}

// ended makes sure a client judged dead can no longer write before its
// memory moves. A process is signalled only when it proved, through the
// client socket, that it holds this very lease, and it still maps the tier:
// a lease is words any client can write, and must never aim the daemon's
// SIGKILL at a process of someone else's. A process of this PID namespace
// that runs on, maps the tier, and never proved itself keeps its lease and
// memory (counted as Quarantined) until it exits or proves itself; one that
// does not map the tier cannot write it and is reaped without a signal. An
// unproven client of another PID namespace is looked up through it
// (endElsewhere). A client of another host is judged by its lease alone;
// its fences keep a stalled one out. operator: an operator's reap, whose
// word counts for a client this host cannot look up.
func (m *Manager) ended(inf LeaseInfo, node int, reason *string, operator bool) bool {
	if node != m.opts.Node || m.opts.SkipPIDCheck {
		return true
	}
	if inf.PID == 0 {
		// No client is pid 0: a forged or damaged lease, which names no
		// process to look at or spare. Reaped, not quarantined (and logged)
		// pass after pass.
		*reason += "; its lease names pid 0, which no client has (forged or damaged)"
		return true
	}
	if p := m.peers.get(inf.Slot, inf.Gen); p != nil {
		return m.endProven(p, inf, reason)
	}
	if !m.r.sameNamespace(inf) {
		return m.endElsewhere(inf, reason, operator)
	}
	if inf.PID == os.Getpid() {
		// A client of this very process whose heartbeat stopped: one
		// closed with its region (which ends its writes) or a test's
		// stand-in for a stalled one. Never a reason to kill the reaper.
		return true
	}
	return m.endUnproven(inf, inf.PID, fmt.Sprintf("process %d", inf.PID), reason)
}

// endUnproven decides for an unproven client of this node found as process
// pid of this namespace: reaped if it is gone or does not map the tier (it
// cannot write it), quarantined otherwise. Never signalled: its lease's
// words name it, and any tier writer can write those.
func (m *Manager) endUnproven(inf LeaseInfo, pid int, who string, reason *string) bool {
	gone, maps, err := m.r.inspect(pid, inf.start)
	switch {
	case gone:
		return true
	case err == nil && !maps:
		*reason += fmt.Sprintf("; %s does not map the tier (not this lease's client, or it let the tier go): not signalled", who)
		return true
	case err != nil:
		return m.quarantine(inf, *reason, fmt.Errorf("cannot tell whether %s maps the tier: %w", who, err))
	}
	return m.quarantine(inf, *reason, fmt.Errorf("%s maps the tier but never proved it holds this lease (it has not registered with this daemon)", who))
}

// endElsewhere decides for an unproven client of this node whose lease
// names another PID namespace (a container's; or one proven to an earlier
// daemon, which this one never saw). Its heartbeat alone proves nothing:
// a stopped container stays silent past any lease, and its memory must
// stay its own. The process is looked up through its namespace (NSpid):
// found alive, it is judged as a process of this namespace; proven absent
// (this daemon sees every PID namespace, or sees this one), it is reaped.
// A client this daemon cannot look up is quarantined, never freed, unless
// an operator's reap says it is gone.
func (m *Manager) endElsewhere(inf LeaseInfo, reason *string, operator bool) bool {
	cannot := func(why error) bool {
		if operator {
			*reason += fmt.Sprintf("; this host cannot look it up (%v): reaped on the operator's word", why)
			return true
		}
		return m.quarantine(inf, *reason, why)
	}
	if inf.PIDNS == 0 {
		return cannot(errors.New("its lease names no PID namespace to look it up in"))
	}
	host, seen, err := findInNamespace(inf.PIDNS, inf.PID, inf.start)
	if err != nil {
		return cannot(fmt.Errorf("look for pid %d of PID namespace %d: %w", inf.PID, inf.PIDNS, err))
	}
	if host == 0 {
		if !seen && !m.seesAllPIDs {
			return cannot(fmt.Errorf("PID namespace %d is not visible to this daemon (run it in the host's PID namespace, hostPID)", inf.PIDNS))
		}
		*reason += fmt.Sprintf("; no process is pid %d of PID namespace %d", inf.PID, inf.PIDNS)
		return true
	}
	return m.endUnproven(inf, host, fmt.Sprintf("process %d (pid %d of PID namespace %d)", host, inf.PID, inf.PIDNS), reason)
}

// endProven ends a proven client's process, alive past its lease.
func (m *Manager) endProven(p *peer, inf LeaseInfo, reason *string) bool {
	if p.exited() {
		return true
	}
	if p.pid == os.Getpid() {
		return true // as above: never the reaper itself
	}
	if p.beatsSince(time.Now().Add(-m.r.l.LeaseTimeout)) {
		// Its lease is silent but the process beats over its connection:
		// the lease was rewritten by another tier writer (or its words
		// damaged). A lease's words prove nothing; the process runs.
		m.nQuarantined.Add(1)
		m.opts.Logf("client slot %d pid %d (%q): its lease's heartbeat stopped (%s) but the process still beats over its connection to this daemon: not ended; another tier writer may be rewriting its lease",
			inf.Slot, p.pid, inf.Name, *reason)
		return false
	}
	maps, err := m.r.mappedBy(p.pid)
	switch {
	case p.exited():
		return true
	case err != nil:
		return m.quarantine(inf, *reason, fmt.Errorf("cannot tell whether it still maps the tier: %w", err))
	case !maps:
		*reason += fmt.Sprintf("; process %d no longer maps the tier: not signalled", p.pid)
		return true
	}
	if err := m.stop(p, m.r.l.LeaseTimeout); err != nil {
		return m.quarantine(inf, *reason, err)
	}
	*reason += fmt.Sprintf("; process %d was alive and is killed", p.pid)
	return true
}

func (m *Manager) quarantine(inf LeaseInfo, reason string, why error) bool {
	m.nQuarantined.Add(1)
	m.opts.Logf("client slot %d pid %d (%q) is alive past its lease (%s) and is not ended: %v; its memory stays its own",
		inf.Slot, inf.PID, inf.Name, reason, why)
	return false
}

// judge returns why a live lease is dead, or "" if it is not.
func (m *Manager) judge(inf LeaseInfo, sameNode bool) string {
	// Heartbeats are judged by this host's monotonic clock from the moment
	// the counter last changed, so clock skew between hosts does not matter.
	now := time.Now()
	seen, ok := m.beats[inf.Slot]
	stable := ok && seen.gen == inf.Gen && seen.beat == inf.Beat
	if !stable {
		m.beats[inf.Slot] = beatSeen{gen: inf.Gen, beat: inf.Beat, at: now}
	}
	if sameNode && !m.opts.SkipPIDCheck {
		// A pidfd's word counts at once. The lease's own (a pid /proc
		// says is gone) only once the lease held still for a pass: a
		// client between claiming its slot and writing its pid shows
		// the slot's previous holder's.
		if why := m.gone(inf, stable); why != "" {
			return why
		}
	}
	if !stable {
		return ""
	}
	if quiet := now.Sub(seen.at); quiet > m.r.l.LeaseTimeout {
		return fmt.Sprintf("no heartbeat for %v", quiet.Round(time.Millisecond))
	}
	return ""
}

// gone says why a lease's process is proven to have exited, "" if it is not:
// its pidfd says so (a proven client, in any PID namespace), or /proc does
// (a client of this PID namespace).
func (m *Manager) gone(inf LeaseInfo, stable bool) string {
	if p := m.peers.get(inf.Slot, inf.Gen); p != nil {
		if p.exited() {
			return fmt.Sprintf("process %d exited", p.pid)
		}
		return ""
	}
	if stable && m.r.provenGone(inf) {
		return fmt.Sprintf("process %d exited", inf.PID)
	}
	return ""
}

// finalize releases a dead client's locks (the manager inherits and
// completes them), frees its chunks and frees its slot.
func (m *Manager) finalize(inf LeaseInfo, node int, reason string) (Reaped, bool) {
	token := uint64(inf.Gen)<<32 | uint64(inf.Slot+1)
	locks := m.r.releaseLocksOf(node, token, m.self.token)
	// Locks whose grant did not arrive yet are held by the manager now;
	// finish them before the slot can be reused.
	locks += m.r.releaseLocksOf(node, m.self.token, m.self.token)
	if m.pendingLocks(node) {
		return Reaped{}, false
	}
	chunks, err := m.r.freeOwnedBy(m.self, inf.Slot)
	if err != nil {
		m.opts.Logf("reap slot %d: free chunks: %v", inf.Slot, err)
		return Reaped{}, false
	}
	if inf.Slot != m.self.slot { // an adopted slot is the daemon's own now
		line := m.r.leaseLine(inf.Slot)
		atomic.StoreUint32(u32At(line, 0), leaseFree)
		m.r.sync.publish(line)
	}
	delete(m.beats, inf.Slot)
	rp := Reaped{Slot: inf.Slot, PID: inf.PID, Node: inf.Node, Name: inf.Name, Reason: reason,
		At: time.Now(), Chunks: chunks, Locks: locks}
	m.nReaped.Add(1)
	m.mu.Lock()
	m.reaped = append(m.reaped, rp)
	if len(m.reaped) > keepReaped {
		m.reaped = m.reaped[len(m.reaped)-keepReaped:]
	}
	m.mu.Unlock()
	m.opts.Logf("reaped client slot %d pid %d node %d (%s): %d locks released, %d chunks freed",
		rp.Slot, rp.PID, rp.Node, reason, locks, chunks)
	return rp, true
}

// pendingLocks reports whether the manager still holds a lock it inherited.
func (m *Manager) pendingLocks(node int) bool {
	for id := 0; id < m.r.l.LockSlots; id++ {
		_, local := m.r.lockLines(id, node)
		m.r.sync.refresh(local)
		if atomic.LoadUint64(u64At(local, 0)) == m.self.token {
			return true
		}
	}
	return false
}
