// Package link arbitrates one node's links (a GPU's PCIe link, the host's
// memory or CXL bandwidth) among the transfers of every process on the
// node by the deadline each serves. A transfer with a deadline (an Engram
// prefetch, a top-k fetch) claims the link until its rows are in; bulk
// traffic (KV stores and loads, a cluster fill) moves in pieces and, before
// each piece, waits while a claim is due: so a deadline transfer waits for
// at most one piece of bulk, and bulk takes what deadlines leave. A bulk
// mover that waits longer than a few yields sleeps on the claimant's word
// (a futex in the shared mapping), so that on a host with few cores the
// core goes to the deadline transfer, and is woken when the claim ends.
//
// Between the two is the traffic a request's first token waits on (its KV
// load, a prefill's pages for its decode): a First moves in pieces that
// wait for deadline claims only, and while it is in flight the rest of the
// bulk (stores, write-behind, cluster fills) waits for it as for a claim.
// So three classes share the link by what waits on them: a layer's rows,
// then a request's first token, then nobody soon.
//
// The arbiter's state is a table in the tier ("link/<name>", one per node)
// that each process reads without a lock: a slot per process, written by
// that process alone, except its owner word, which changes under the
// table's tier lock (Open takes a slot, Close gives it back, and Open
// takes over the slot of a process whose lease no longer runs).
//
//	line 0: magic u64 · version u32 · slots u32 · crc u32 at 60 (of 0..60)
//	slot i, two lines from byte 64+128i:
//	  owner lease token u64 · deadline u64 (Unix ns of the earliest due
//	  claim; 0: none) · wake u32 (the owner adds one at every change of
//	  its deadline: the word bulk movers sleep on) · sleepers u32 (a hint
//	  the sleepers keep, so that the owner wakes them only when one is
//	  there; a wrong one costs a wake-up or a sleep until the deadline) ·
//	  first u64 (Unix ns of the earliest due of its first-token transfers
//	  in flight; 0: none) · first-token transfers ended u64 · of those,
//	  ended past their deadline u64
//	  then claims u64 · misses u64 · claimed ns u64 · bulk bytes u64 ·
//	  bulk waits u64 · bulk waited ns u64 · first-token bytes u64 ·
//	  first-token waited ns u64
//
// The first-token words were added to version 1 in bytes its first
// writers left zero: a process that does not know them neither shows nor
// obeys a first-token transfer, and is otherwise unchanged.
//
// Any process that can write the tier can write any slot, so a reader
// trusts no claim further than it costs the others to: a claim whose
// deadline has passed, lies beyond the horizon, or belongs to a process
// whose lease no longer runs is ignored, and a bulk mover waits on one
// slot's claims for at most a share of each window, so a process that
// claims the link all the time (a liar, or a bug) takes that share from
// the bulk traffic and no more. Only the claims' words are read; nothing
// acts on another process.
package link

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"time"

	"github.com/cxltier/cxltier/internal/errkind"
	"github.com/cxltier/cxltier/tier"
)

// Errors callers test with errors.Is.
var (
	// ErrFull: every slot belongs to a process whose lease runs.
	ErrFull = errkind.New(errkind.NoSpace, "link: every slot of the table is taken")
	// ErrCorrupt: the table's header failed its checks.
	ErrCorrupt = errkind.New(errkind.Damaged, "link: table damaged")
	// ErrBadConfig: a table or an arbiter of that shape cannot be made.
	ErrBadConfig = errkind.New(errkind.Invalid, "link: bad configuration")
)

const (
	magic    = 0x314b4e494c4c5843 // "CXLLINK1"
	version  = 1
	line     = 64
	maxSlots = 4096

	slotBytes = 2 * line

	offOwner    = 0
	offDeadline = 8
	offWake     = 16
	offSleepers = 20
	offFirst    = 24
	offFirsts   = 32
	offFirstMis = 40
	offClaims   = line
	offMisses   = line + 8
	offClaimed  = line + 16
	offBytes    = line + 24
	offWaits    = line + 32
	offWaited   = line + 40
	offFirstB   = line + 48
	offFirstW   = line + 56
)

// Config shapes the arbiter of one process.
type Config struct {
	// Name is the table's ("node<N>" of the client's node when empty): the
	// processes that share a link share a name.
	Name string
	// Slots is how many processes the table holds when Open creates it
	// (default 64); an existing table keeps its own.
	Slots int
	// Horizon is the furthest ahead a claim may lie and still be obeyed
	// (default 10 ms): an Engram layer's deadline is tens of microseconds,
	// a top-k step's a few milliseconds.
	Horizon time.Duration
	// FirstHorizon is the same for a first-token transfer's deadline
	// (default 10 s): a request's first token waits for its load for as
	// long as the load takes, so the bound is a sanity check only.
	FirstHorizon time.Duration
	// Window and Share bound how long a bulk mover waits on one process's
	// claims: at most Share of each Window (defaults 100 ms and 0.25).
	Window time.Duration
	Share  float64
}

func (cfg *Config) defaults(node int) error {
	if cfg.Name == "" {
		cfg.Name = fmt.Sprintf("node%d", node)
	}
	if cfg.Slots == 0 {
		cfg.Slots = 64
	}
	if cfg.Horizon == 0 {
		cfg.Horizon = 10 * time.Millisecond
	}
	if cfg.FirstHorizon == 0 {
		cfg.FirstHorizon = 10 * time.Second
	}
	if cfg.Window == 0 {
		cfg.Window = 100 * time.Millisecond
	}
	if cfg.Share == 0 {
		cfg.Share = 0.25
	}
	switch {
	case cfg.Slots < 1 || cfg.Slots > maxSlots:
		return fmt.Errorf("%w: %d slots: want 1..%d", ErrBadConfig, cfg.Slots, maxSlots)
	case cfg.Horizon < 0 || cfg.FirstHorizon < 0 || cfg.Window < 0:
		return fmt.Errorf("%w: horizons %v and %v, window %v: want positive", ErrBadConfig, cfg.Horizon, cfg.FirstHorizon, cfg.Window)
	case cfg.Share < 0 || cfg.Share > 1:
		return fmt.Errorf("%w: share %v: want 0..1", ErrBadConfig, cfg.Share)
	}
	return nil
}

// Link is one process's arbiter on a node's link: its own slot for the
// claims of its deadline transfers, and the pacing of its bulk pieces.
// Safe for concurrent use by the goroutines of one process.
type Link struct {
	c     *tier.Client
	r     *tier.Region
	cfg   Config
	base  tier.Offset
	slots int
	slot  int
	lock  int
	mine  []byte   // this process's slot, as mapped
	lines [][]byte // every slot, as mapped (a slot never crosses a chunk)
	// shared: the tier spans hosts' caches, so reads refresh first.
	shared bool

	mu      sync.Mutex
	due     []time.Time // this process's open claims' deadlines
	started []time.Time // when each was claimed
	firsts  []*First    // this process's first-token transfers in flight
	peers   []peer      // what this process knows of each slot
	window  time.Time   // start of the current share window
	closed  bool
}

// peer is a bulk mover's view of one slot: whether its owner's lease ran
// when last checked, and how long this process waited on it this window.
type peer struct {
	token   uint64
	runs    bool
	checked time.Time
	waited  time.Duration
}

// DirName is the tier object of the table called name.
func DirName(name string) string { return "link/" + name }

// Open joins the table called cfg.Name (creating it when missing) and
// takes a slot for this process.
func Open(c *tier.Client, cfg Config) (*Link, error) {
	if err := cfg.defaults(c.Node()); err != nil {
		return nil, err
	}
	r := c.Region()
	o, err := r.OpenObject(DirName(cfg.Name))
	if errors.Is(err, tier.ErrNotFound) {
		o, err = create(c, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("link: open %q: %w", cfg.Name, err)
	}
	l := &Link{c: c, r: r, cfg: cfg, base: o.Offset, lock: r.UserLockFor("link\x00" + cfg.Name)}
	if err := l.awaitHeader(o.Size); err != nil {
		return nil, err
	}
	l.peers = make([]peer, l.slots)
	l.shared = r.Info().Coherence == tier.Shared
	for i := 0; i < l.slots; i++ {
		b, err := r.Slice(l.slotOff(i), slotBytes)
		if err != nil {
			return nil, fmt.Errorf("link: table %q, slot %d: %w", cfg.Name, i, err)
		}
		l.lines = append(l.lines, b)
	}
	if err := l.join(); err != nil {
		return nil, err
	}
	l.window = time.Now()
	return l, nil
}

func create(c *tier.Client, cfg Config) (tier.Object, error) {
	o, err := c.CreateObject(DirName(cfg.Name), tableBytes(cfg.Slots), tier.ObjectOptions{})
	if errors.Is(err, tier.ErrExists) { // made by another process meanwhile
		return c.Region().OpenObject(DirName(cfg.Name))
	}
	if err != nil {
		return o, err
	}
	if err := c.Region().WriteAt(encodeHeader(cfg.Slots), o.Offset); err != nil {
		return o, err
	}
	return o, c.Region().Publish(o.Offset, line)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// headerWait bounds how long Open waits for a table another process named
// but has not yet given its header (it writes the one line right after).
const headerWait = 2 * time.Second

func (l *Link) awaitHeader(size int64) error {
	deadline := time.Now().Add(headerWait)
	h := make([]byte, line)
	for {
		if err := l.r.Refresh(l.base, line); err != nil {
			return err
		}
		if err := l.r.ReadAt(h, l.base); err != nil {
			return err
		}
		if !bytes.Equal(h, make([]byte, line)) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: table %q: header never written within %v (its creator died first? remove it with the workers stopped)", ErrCorrupt, l.cfg.Name, headerWait)
		}
		time.Sleep(time.Millisecond)
	}
	slots, err := decodeHeader(h, size)
	if err != nil {
		return fmt.Errorf("%w: table %q: %v", ErrCorrupt, l.cfg.Name, err)
	}
	l.slots = slots
	return nil
}

func encodeHeader(slots int) []byte {
	h := make([]byte, line)
	binary.LittleEndian.PutUint64(h[0:], magic)
	binary.LittleEndian.PutUint32(h[8:], version)
	binary.LittleEndian.PutUint32(h[12:], uint32(slots))
	binary.LittleEndian.PutUint32(h[60:], crc32.Checksum(h[:60], castagnoli))
	return h
}

// decodeHeader checks a table's header line against its object's size and
// returns its slot count.
func decodeHeader(h []byte, size int64) (int, error) {
	if len(h) < line {
		return 0, fmt.Errorf("header of %d bytes", len(h))
	}
	le := binary.LittleEndian
	if le.Uint64(h) != magic || le.Uint32(h[8:]) != version || le.Uint32(h[60:]) != crc32.Checksum(h[:60], castagnoli) {
		return 0, errors.New("header fails its magic, version or checksum")
	}
	slots := int64(le.Uint32(h[12:]))
	if slots < 1 || slots > maxSlots || tableBytes(int(slots)) > size {
		return 0, fmt.Errorf("header says %d slots in an object of %d bytes", slots, size)
	}
	return int(slots), nil
}

// tableBytes is the size of a table of slots slots: a header line, then
// the slots (two lines each, so a slot never crosses a chunk).
func tableBytes(slots int) int64 { return line + int64(slots)*slotBytes }

func (l *Link) slotOff(i int) tier.Offset { return slotAt(l.base, i) }

func slotAt(base tier.Offset, i int) tier.Offset { return base + line + tier.Offset(i*slotBytes) }

// join takes a free slot, or one whose owner's lease no longer runs (its
// process died without Close), and starts it clean.
func (l *Link) join() error {
	if err := l.c.Lock(l.lock); err != nil {
		return fmt.Errorf("link: table %q: %w", l.cfg.Name, err)
	}
	defer l.c.Unlock(l.lock)
	for i := 0; i < l.slots; i++ {
		b, err := l.line(i)
		if err != nil {
			return err
		}
		owner := load(b, offOwner)
		if owner != 0 && l.r.TokenRuns(owner) {
			continue
		}
		clear(b)
		store(b, offOwner, l.c.Token())
		if err := l.r.Publish(l.slotOff(i), slotBytes); err != nil {
			return err
		}
		l.slot, l.mine = i, b
		return nil
	}
	return fmt.Errorf("%w: table %q holds %d processes (open it with more slots)", ErrFull, l.cfg.Name, l.slots)
}

// line is slot i's line as this process maps it, refreshed first on a
// tier shared by several hosts.
func (l *Link) line(i int) ([]byte, error) {
	if l.shared {
		if err := l.r.Refresh(l.slotOff(i), slotBytes); err != nil {
			return nil, err
		}
	}
	return l.lines[i], nil
}

// Slot is the table slot this process holds.
func (l *Link) Slot() int { return l.slot }

// Close gives the slot back. Claims still open are dropped.
func (l *Link) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	if err := l.c.Lock(l.lock); err != nil {
		return fmt.Errorf("link: table %q: %w", l.cfg.Name, err)
	}
	defer l.c.Unlock(l.lock)
	if load(l.mine, offOwner) == l.c.Token() {
		clear(l.mine)
	}
	return l.r.Publish(l.slotOff(l.slot), slotBytes)
}
