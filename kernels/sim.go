package kernels

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/cxltier/cxltier/internal/ptxsim"
)

// Sim is the engine that runs the committed PTX in the PTX interpreter
// (internal/ptxsim) instead of on a GPU: the same kernels, launched with
// the same parameters (gatherlaunch.go and the topk and engram packages'
// launch code go through Launch, as on the CUDA engine), so every test
// written for the CUDA engine runs the GPU's code on machines without one.
// It is far slower than either other engine: it is for tests, and for
// standing in for a device (Device names which) where none exists.
type Sim struct {
	opts   SimOptions
	ranges rangeTable

	mu       sync.Mutex
	space    *ptxsim.Space
	bases    []byte // MaxRanges device addresses, indexed by RangeID
	basesDev uint64
	mem      [MaxRanges]uint64 // device address of each registered range
	modules  map[string]*ptxsim.Module
	fns      []simFunction // Function handle i+1
	fnRows   Function
	fnBlocks blockKernels
	shifts   shiftCache
	launches uint64
	later    laterQueue // ReadLater's thens, run when their Runs are waited for
	closed   bool
	pace     pacing // its own lock: a pacer's Turn may wait
}

type simFunction struct {
	k      *ptxsim.Kernel
	shared int // dynamic shared memory its launches may use
}

// SimOptions configures the interpreter engine.
type SimOptions struct {
	// Seed 0 runs every launch on the interpreter's deterministic
	// schedule; other values shuffle each launch's schedule (launch i of
	// the engine with seed Seed+i).
	Seed uint64
	// RaceCheck reports shared-memory accesses no barrier orders.
	RaceCheck bool
	// Device is the device ordinal the engine stands for (its Name).
	Device int
	// MaxBlocks caps a launch's grid (0: 4); MaxThreads is the largest
	// block (0: 256); SharedLimit the dynamic shared memory a kernel may
	// opt in to (0: 227 KiB, an sm_90's).
	MaxBlocks, MaxThreads, SharedLimit int
}

// defaultShared is what a launch may use without AllowShared, as on CUDA.
const defaultShared = 48 << 10

// NewSim starts an interpreter engine.
func NewSim(opts SimOptions) (*Sim, error) {
	if opts.MaxBlocks <= 0 {
		opts.MaxBlocks = 4
	}
	if opts.MaxThreads <= 0 {
		opts.MaxThreads = 256
	}
	if opts.SharedLimit <= 0 {
		opts.SharedLimit = 227 << 10
	}
	e := &Sim{opts: opts, space: ptxsim.NewSpace(), bases: make([]byte, MaxRanges*8), modules: map[string]*ptxsim.Module{}}
	var err error
	if e.basesDev, err = e.space.Map(e.bases); err != nil {
		return nil, err
	}
	l := &simLaunch{e: e}
	if e.fnRows, err = l.Function("gather", gatherPTX, "cxl_rows"); err != nil {
		return nil, err
	}
	if e.fnBlocks.plain, err = l.Function("gather", gatherPTX, "cxl_blocks"); err != nil {
		return nil, err
	}
	if e.fnBlocks.crc, err = l.Function("gather", gatherPTX, "cxl_blocks_crc"); err != nil {
		return nil, err
	}
	return e, nil
}

// Name implements Engine.
func (e *Sim) Name() string { return fmt.Sprintf("ptxsim:%d", e.opts.Device) }

// Device is the device ordinal the engine stands for.
func (e *Sim) Device() int { return e.opts.Device }

func (e *Sim) enter() (func(), error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, ErrClosed
	}
	return e.mu.Unlock, nil
}

func (e *Sim) setBase(id RangeID, dev uint64) {
	binary.LittleEndian.PutUint64(e.bases[8*int(id):], dev)
}

// Register implements Engine.
func (e *Sim) Register(mem []byte) (RangeID, error) {
	leave, err := e.enter()
	if err != nil {
		return 0, err
	}
	defer leave()
	id, err := e.ranges.claim(int64(len(mem)))
	if err != nil {
		return 0, err
	}
	dev, err := e.space.Map(mem)
	if err != nil {
		e.ranges.release(id)
		return 0, err
	}
	e.mem[id] = dev
	e.setBase(id, dev)
	return id, nil
}

// Unregister implements Engine.
func (e *Sim) Unregister(id RangeID) error {
	leave, err := e.enter()
	if err != nil {
		return err
	}
	defer leave()
	if e.mem[id] == 0 {
		return fmt.Errorf("%w: %d", ErrNoRange, id)
	}
	err = e.space.Unmap(e.mem[id])
	e.mem[id] = 0
	e.setBase(id, 0)
	e.ranges.release(id)
	return err
}

// simBuffer is engine memory: host bytes at a device address of the
// engine's space.
type simBuffer struct {
	e   *Sim
	mem []byte
	dev uint64
}

func (b *simBuffer) Len() int64 { return int64(len(b.mem)) }

func (b *simBuffer) Free() error {
	if b.mem == nil {
		return nil
	}
	leave, err := b.e.enter()
	if err != nil {
		b.mem = nil
		return nil // the space went with the engine
	}
	defer leave()
	err = b.e.space.Unmap(b.dev)
	b.mem, b.dev = nil, 0
	return err
}

// Alloc implements Engine.
func (e *Sim) Alloc(n int64) (Buffer, error) {
	if n <= 0 || n > 1<<34 {
		return nil, fmt.Errorf("%w: buffer of %d bytes", ErrBadRequest, n)
	}
	leave, err := e.enter()
	if err != nil {
		return nil, err
	}
	defer leave()
	mem := make([]byte, n)
	dev, err := e.space.Map(mem)
	if err != nil {
		return nil, err
	}
	return &simBuffer{e: e, mem: mem, dev: dev}, nil
}

func (e *Sim) own(b Buffer) (*simBuffer, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: no buffer", ErrBadRequest)
	}
	sb, ok := b.(*simBuffer)
	if !ok || sb.e != e {
		return nil, ErrForeignBuffer
	}
	if sb.mem == nil {
		return nil, fmt.Errorf("%w: buffer already freed", ErrBadRequest)
	}
	return sb, nil
}

// Upload implements Engine.
func (e *Sim) Upload(dst Buffer, off int64, src []byte) error {
	b, err := e.own(dst)
	if err != nil {
		return err
	}
	if err := checkBufSpan("upload", b.Len(), off, int64(len(src))); err != nil {
		return err
	}
	copy(b.mem[off:], src)
	return nil
}

// Download implements Engine.
func (e *Sim) Download(dst []byte, src Buffer, off int64) error {
	b, err := e.own(src)
	if err != nil {
		return err
	}
	if err := checkBufSpan("download", b.Len(), off, int64(len(dst))); err != nil {
		return err
	}
	copy(dst, b.mem[off:])
	return nil
}

// Gather implements Engine.
func (e *Sim) Gather(r Rows) (Handle, error) { return e.rows(r, 0) }

// Scatter implements Engine.
func (e *Sim) Scatter(r Rows) (Handle, error) { return e.rows(r, 1) }

// GatherBlocks implements Engine.
func (e *Sim) GatherBlocks(b Blocks) (Handle, error) { return e.blocks(b, 0) }

// ScatterBlocks implements Engine.
func (e *Sim) ScatterBlocks(b Blocks) (Handle, error) { return e.blocks(b, 1) }

func (e *Sim) rows(r Rows, toTier uint64) (Handle, error) {
	b, err := e.own(r.Buf)
	if err != nil {
		return nil, err
	}
	return runRows(e, &e.ranges, e.fnRows, &r, b.dev, toTier)
}

func (e *Sim) blocks(bl Blocks, toTier uint64) (Handle, error) {
	chunks := make([]uint64, len(bl.Chunks))
	for c, ch := range bl.Chunks {
		b, err := e.own(ch.Buf)
		if err != nil {
			return nil, fmt.Errorf("chunk %d: %w", c, err)
		}
		chunks[c] = b.dev + uint64(ch.Offset)
	}
	return runBlocksPaced(e, &e.pace, &e.ranges, e.fnBlocks, &bl, chunks, toTier, &e.shifts)
}

// SetPacer implements Paced: block calls move in pieces of whole pages of
// about piece bytes (0: DevicePiece), as on the CUDA engine.
func (e *Sim) SetPacer(p Pacer, piece int64) { e.pace.set(p, piece) }

// Sync implements Engine: launches run to completion when queued.
func (e *Sim) Sync() error {
	leave, err := e.enter()
	if err != nil {
		return err
	}
	leave()
	return nil
}

// Close implements Engine.
func (e *Sim) Close() error {
	leave, err := e.enter()
	if err != nil {
		return err
	}
	defer leave()
	e.closed = true
	e.space = nil
	e.later.drop()
	return nil
}

// Run implements Launcher. Kernels run when queued, so the Handle is done
// but for ReadLater's thens, which wait for it as on a device.
func (e *Sim) Run(f func(Launch) error) (Handle, error) {
	leave, err := e.enter()
	if err != nil {
		return nil, err
	}
	defer leave()
	l := &simLaunch{e: e}
	defer l.end()
	if err := f(l); err != nil {
		return nil, err
	}
	if l.then != nil {
		then, data := l.then, l.read
		e.later.add(func() { then(data) })
	}
	if len(e.later.pending) == 0 {
		return doneHandle(), nil
	}
	return &simHandle{e: e, seq: e.later.seq}, nil
}

// simHandle is a Run whose ReadLater thens (or an earlier Run's) have not
// run yet.
type simHandle struct {
	e   *Sim
	seq uint64
}

// Wait implements Handle.
func (h *simHandle) Wait() error {
	leave, err := h.e.enter()
	if err != nil {
		return err
	}
	defer leave()
	h.e.later.runUpTo(h.seq)
	return nil
}

// Mapped implements Launcher.
func (e *Sim) Mapped(n int) (*Mapped, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: mapped memory of %d bytes", ErrBadRequest, n)
	}
	leave, err := e.enter()
	if err != nil {
		return nil, err
	}
	defer leave()
	// Page-aligned host memory (Words views it as uint64s), mapped for
	// kernels at its length: a kernel reading past n faults.
	host := make([]byte, (n+4095)&^4095)[:n]
	dev, err := e.space.Map(host)
	if err != nil {
		return nil, err
	}
	free := func() error {
		leave, err := e.enter()
		if err != nil {
			return nil
		}
		defer leave()
		return e.space.Unmap(dev)
	}
	return &Mapped{Host: host, Dev: dev, free: free}, nil
}

// simLaunch is the Launch of one Run; e is nil once Run returned.
type simLaunch struct {
	e      *Sim
	stage  uint64 // the Run's staged words, unmapped when it ends
	nstage int    // their length in bytes
	then   func([]byte)
	read   []byte // what ReadLater copied for then
}

func (l *simLaunch) live() (*Sim, error) {
	if l.e == nil {
		return nil, ErrNotInRun
	}
	return l.e, nil
}

func (l *simLaunch) end() {
	if l.stage != 0 {
		l.e.space.Unmap(l.stage)
	}
	l.e = nil
}

func (l *simLaunch) Function(module, ptx, name string) (Function, error) {
	e, err := l.live()
	if err != nil {
		return Function{}, err
	}
	mod, ok := e.modules[module]
	if !ok {
		if mod, err = ptxsim.Parse(ptx); err != nil {
			return Function{}, fmt.Errorf("kernels: load module %s: %w", module, err)
		}
		e.modules[module] = mod
	}
	k, err := mod.Kernel(name)
	if err != nil {
		return Function{}, fmt.Errorf("kernels: %s in module %s: %w", name, module, err)
	}
	for i, f := range e.fns {
		if f.k == k {
			return Function{handle: uintptr(i + 1)}, nil
		}
	}
	e.fns = append(e.fns, simFunction{k: k, shared: defaultShared})
	return Function{handle: uintptr(len(e.fns))}, nil
}

func (l *simLaunch) fn(f Function) (*simFunction, error) {
	e, err := l.live()
	if err != nil {
		return nil, err
	}
	if f.handle == 0 || int(f.handle) > len(e.fns) {
		return nil, fmt.Errorf("%w: unknown function %d", ErrBadRequest, f.handle)
	}
	return &e.fns[f.handle-1], nil
}

func (l *simLaunch) MaxThreads(f Function) (int, error) {
	if _, err := l.fn(f); err != nil {
		return 0, err
	}
	return l.e.opts.MaxThreads, nil
}

func (l *simLaunch) SharedLimit() (int, error) {
	e, err := l.live()
	if err != nil {
		return 0, err
	}
	return e.opts.SharedLimit, nil
}

func (l *simLaunch) AllowShared(f Function, bytes int) error {
	sf, err := l.fn(f)
	if err != nil {
		return err
	}
	if bytes > l.e.opts.SharedLimit {
		return fmt.Errorf("%w: %d bytes of shared memory, the limit is %d", ErrBadRequest, bytes, l.e.opts.SharedLimit)
	}
	sf.shared = bytes
	return nil
}

func (l *simLaunch) MaxBlocks() int {
	if l.e == nil {
		return 1
	}
	return l.e.opts.MaxBlocks
}

func (l *simLaunch) Bases() uint64 {
	if l.e == nil {
		return 0
	}
	return l.e.basesDev
}

func (l *simLaunch) CheckSpan(a Addr, n int64) error {
	e, err := l.live()
	if err != nil {
		return err
	}
	return e.ranges.checkOne(a, n, "span")
}

func (l *simLaunch) Ptr(b Buffer, off, n int64) (uint64, error) {
	e, err := l.live()
	if err != nil {
		return 0, err
	}
	sb, err := e.own(b)
	if err != nil {
		return 0, err
	}
	if err := checkBufSpan("kernel operand", sb.Len(), off, n); err != nil {
		return 0, err
	}
	return sb.dev + uint64(off), nil
}

func (l *simLaunch) Stage(words []uint64) (uint64, error) {
	e, err := l.live()
	if err != nil {
		return 0, err
	}
	if l.stage != 0 {
		return 0, fmt.Errorf("%w: a second Stage", ErrNotInRun)
	}
	mem := make([]byte, 8*max(len(words), 1))
	copy(mem, AsBytes(words))
	if l.stage, err = e.space.Map(mem); err != nil {
		return 0, err
	}
	l.nstage = len(mem)
	return l.stage, nil
}

func (l *simLaunch) Memset32(dst uint64, v uint32, n int) error {
	e, err := l.live()
	if err != nil {
		return err
	}
	b, err := e.space.Bytes(dst, 4*n)
	if err != nil {
		return fmt.Errorf("%w: set %d words: %v", ErrBadRequest, n, err)
	}
	for i := 0; i < len(b); i += 4 {
		binary.LittleEndian.PutUint32(b[i:], v)
	}
	return nil
}

func (l *simLaunch) Kernel(f Function, blocks, threads, shared int, params ...uint64) error {
	sf, err := l.fn(f)
	if err != nil {
		return err
	}
	e := l.e
	if blocks < 1 || threads < 1 || threads > e.opts.MaxThreads {
		return fmt.Errorf("%w: launch of %d blocks of %d threads (at most %d per block)", ErrBadRequest, blocks, threads, e.opts.MaxThreads)
	}
	if shared > sf.shared {
		return fmt.Errorf("%w: %s asks for %d bytes of shared memory, allowed %d", ErrBadRequest, sf.k.Name, shared, sf.shared)
	}
	cfg := ptxsim.Config{Grid: blocks, Block: threads, Shared: shared, Params: params, RaceCheck: e.opts.RaceCheck}
	if e.opts.Seed != 0 {
		cfg.Seed = e.opts.Seed + e.launches
	}
	e.launches++
	if err := e.space.Launch(sf.k, cfg); err != nil {
		return fmt.Errorf("kernels: %s: %w", e.Name(), err)
	}
	return nil
}

func (l *simLaunch) Sync() error {
	_, err := l.live()
	return err
}

// ReadLater implements Launch. The kernels queued so far have run, so the
// bytes are copied now; then gets them when the Run is waited for.
func (l *simLaunch) ReadLater(src uint64, n int, then func([]byte)) error {
	e, err := l.live()
	if err != nil {
		return err
	}
	if err := laterArgs(l.then != nil, l.stage, l.nstage, src, n, then); err != nil {
		return err
	}
	b, err := e.space.Bytes(src, n)
	if err != nil {
		return fmt.Errorf("%w: read later: %v", ErrBadRequest, err)
	}
	l.then, l.read = then, append([]byte(nil), b...)
	return nil
}

func (l *simLaunch) Read(dst []byte, src uint64) error {
	e, err := l.live()
	if err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	b, err := e.space.Bytes(src, len(dst))
	if err != nil {
		return fmt.Errorf("%w: read: %v", ErrBadRequest, err)
	}
	copy(dst, b)
	return nil
}

var _ Launcher = (*Sim)(nil)
