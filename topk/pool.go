package topk

import (
	"fmt"
	"sync"
	"time"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// Config sizes a pool. Layers, EntryBytes and MaxRequests are required.
type Config struct {
	Layers      int     // layers with sparse attention
	EntryBytes  int64   // one token's entry in one layer, a multiple of 16 (656 for DSA FP8)
	Slots       int     // buffer slots per request and layer, ≥ TopK (default 4096)
	TopK        int     // selections per request and step (default 2048)
	MaxRequests int     // request indices are [0, MaxRequests)
	Planner     Planner // where steps are planned (default PlanAuto)
	MaxContext  int64   // longest sequence (tokens) when the engine plans (default 1<<20)
	// Link, when set with a Deadline, is told each Resolve's deadline
	// (Deadline after the call) and when its entries are in: tier/link's
	// arbiter, which makes the bulk copies of every process on the node
	// wait while a step is due.
	Link     Claimer
	Deadline time.Duration
}

// Claimer is told of transfers with a deadline: Claim when one starts,
// Done when it ends (missed: ready past the deadline), in that order.
type Claimer interface {
	Claim(deadline time.Time)
	Done(missed bool)
}

// Sequence describes a sequence at registration; Layers and EntryBytes
// must match the pool's, Capacity (tokens) is reserved up front and the
// sequence grows past it by extents.
type Sequence struct {
	Layers     int
	EntryBytes int64
	Capacity   int64
}

// maxSlots keeps slot numbers in SGLang's int16 LRU table.
const maxSlots = 1<<15 - 1

func (c *Config) fill() error {
	if c.Slots == 0 {
		c.Slots = 4096
	}
	if c.TopK == 0 {
		c.TopK = 2048
	}
	if c.MaxContext == 0 {
		c.MaxContext = 1 << 20
	}
	switch {
	case c.Layers < 1 || c.Layers > 1024:
		return fmt.Errorf("%w: %d layers", ErrBadConfig, c.Layers)
	case c.EntryBytes < 16 || c.EntryBytes%16 != 0:
		return fmt.Errorf("%w: entry size %d is not a positive multiple of 16", ErrBadConfig, c.EntryBytes)
	case c.Slots < 1 || c.Slots > maxSlots:
		return fmt.Errorf("%w: %d slots (want 1 to %d)", ErrBadConfig, c.Slots, maxSlots)
	case c.TopK < 1 || c.TopK > c.Slots:
		return fmt.Errorf("%w: top-k %d larger than the %d slots (or below 1)", ErrBadConfig, c.TopK, c.Slots)
	case c.MaxRequests < 1 || c.MaxRequests > 1<<20:
		return fmt.Errorf("%w: %d requests", ErrBadConfig, c.MaxRequests)
	case c.MaxContext < 1 || c.MaxContext > 1<<31-1:
		return fmt.Errorf("%w: max context %d tokens", ErrBadConfig, c.MaxContext)
	case c.Deadline < 0:
		return fmt.Errorf("%w: deadline %v", ErrBadConfig, c.Deadline)
	}
	return nil
}

// Pool is the tier-side KV of the registered sequences and their buffers in
// one engine. Its methods are safe for concurrent use.
type Pool struct {
	c     *tier.Client
	r     *tier.Region
	eng   kernels.Engine
	ids   []kernels.RangeID
	owned bool
	cfg   Config

	extentEntries int64 // entries per extent (one chunk)
	bufs          []kernels.Buffer
	pl            planner

	mu    sync.Mutex
	seqs  []*seq     // by request index; nil when not registered
	sc    scratch    // planning scratch of a one-request step
	scs   []*scratch // one per planning goroutine of a batch
	plans []plan     // per request of the current step
	// rowTier and rowSlots hold a step's gather list between steps.
	rowTier  []kernels.Addr
	rowSlots []int64
	rec      []byte      // this client's record in the shared stats table
	recOff   tier.Offset // (nil: not exported)
	stats    Stats
	closed   bool

	unregister func() bool // takes the pool off its client's closers
}

// New makes a pool that stores sequences in c's tier and keeps buffers in
// eng. ids are the engine ranges of the tier's devices if the caller
// registered them already (an engine maps a tier once); nil registers them
// here and Close unregisters them.
func New(c *tier.Client, eng kernels.Engine, ids []kernels.RangeID, cfg Config) (*Pool, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	held, err := c.Hold()
	if err != nil {
		return nil, fmt.Errorf("topk: new pool: %w", err)
	}
	defer held.Done()
	r := c.Region()
	p := &Pool{c: c, r: r, eng: eng, ids: ids, cfg: cfg, seqs: make([]*seq, cfg.MaxRequests),
		extentEntries: r.ChunkSize() / cfg.EntryBytes}
	if p.extentEntries < 1 {
		return nil, fmt.Errorf("%w: a %d-byte entry does not fit a %d-byte chunk", ErrBadConfig, cfg.EntryBytes, r.ChunkSize())
	}
	if ids != nil && len(ids) != r.NumDevices() {
		return nil, fmt.Errorf("%w: %d ranges for %d tier devices", ErrBadConfig, len(ids), r.NumDevices())
	}
	if ids == nil {
		var err error
		if p.ids, err = kernels.RegisterAll(eng, r.NumDevices(), r.Device); err != nil {
			return nil, fmt.Errorf("topk: %w", err)
		}
		p.owned = true
	}
	if p.rec, p.recOff, err = statsRecord(c); err != nil {
		p.Close()
		return nil, err
	}
	rows := int64(cfg.MaxRequests) * int64(cfg.Slots+1)
	for l := range cfg.Layers {
		b, err := eng.Alloc(rows * cfg.EntryBytes)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("topk: buffer of layer %d (%d rows of %d B): %w", l, rows, cfg.EntryBytes, err)
		}
		p.bufs = append(p.bufs, b)
	}
	if p.pl, err = p.newPlanner(); err != nil {
		p.Close()
		return nil, err
	}
	p.unregister = c.OnClose(p.close)
	return p, nil
}

// Config returns the pool's configuration with defaults filled in.
func (p *Pool) Config() Config { return p.cfg }

// Buffer is layer's engine buffer: request req's slot s is row
// Row(req, s), RowBytes = EntryBytes.
func (p *Pool) Buffer(layer int) kernels.Buffer { return p.bufs[layer] }

// Row is the row of request req's slot s in every layer's buffer.
func (p *Pool) Row(req, slot int) int64 { return int64(req)*int64(p.cfg.Slots+1) + int64(slot) }

// hold is the gate (tier.Hold) that every method touching the tier passes
// first: the mapping stays while it is held, and it carries the lease
// check made before a write or a read of the pool's extents.
func (p *Pool) hold(op string) (tier.Hold, error) {
	h, err := p.c.Hold()
	if err != nil {
		return h, fmt.Errorf("%w: %s: %w", ErrClosed, op, err)
	}
	return h, nil
}

// holdFenced is hold with the lease checked on it, for the methods that
// write or read the pool's extents: a pool reaped while its process was
// stalled has them no more.
func (p *Pool) holdFenced(op string) (tier.Hold, error) {
	h, err := p.hold(op)
	if err != nil {
		return h, err
	}
	if err := h.Fenced(); err != nil {
		h.Done()
		return tier.Hold{}, fmt.Errorf("topk: %s: %w", op, err)
	}
	return h, nil
}

// holdToRelease is hold for giving extents back, which the client's Close
// does too.
func (p *Pool) holdToRelease(op string) (tier.Hold, error) {
	h, err := p.c.HoldToRelease()
	if err != nil {
		return h, fmt.Errorf("%w: %s: %w", ErrClosed, op, err)
	}
	return h, nil
}

// Close frees the sequences' extents and the buffers. The pool is
// registered with its client when made, so that closing the client closes
// it; closing it first unregisters it.
func (p *Pool) Close() error {
	if p.unregister != nil {
		p.unregister()
	}
	return p.close()
}

func (p *Pool) close() error {
	// Without a hold (the tier is gone) the extents went with it; the
	// engine buffers are still given back, and the tier's own checks
	// refuse the rest.
	if held, err := p.holdToRelease("close"); err == nil {
		defer held.Done()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for i, s := range p.seqs {
		if s != nil {
			keep(p.freeSeq(s))
			p.seqs[i] = nil
		}
	}
	p.stats.Sequences = 0
	p.unpublishStats()
	keep(p.eng.Sync())
	for _, b := range p.bufs {
		keep(b.Free())
	}
	if p.pl != nil {
		keep(p.pl.free())
	}
	if p.owned {
		keep(kernels.UnregisterAll(p.eng, p.ids))
	}
	return first
}
