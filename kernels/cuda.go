//go:build cuda

package kernels

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
	"gorgonia.org/cu"
)

// CUDA is the GPU engine: the kernels of gather.cu, launched once per call
// on one stream, reading and writing registered host memory directly
// (zero-copy) and GPU buffers.
type CUDA struct {
	ranges rangeTable

	mu        sync.Mutex
	dev       cu.Device
	ctx       cu.CUContext
	stream    cu.Stream
	ownStream bool
	mod       cu.Module
	fnRows    cu.Function
	fnBlocks  cu.Function
	fnCRC     cu.Function // cxl_blocks_crc
	shifts    shiftCache
	maxBlocks int
	bases     cu.DevicePtr // MaxRanges device addresses, indexed by RangeID
	// hostBases is the same table host side, in an allocation of its own:
	// cgo's pointer check inspects the whole Go object an argument points
	// into, and this struct holds Go pointers (mem) that may point into the
	// Go heap when a caller registers heap memory.
	hostBases *[MaxRanges]uint64
	mem       [MaxRanges][]byte    // registered memory, to unregister
	stages    [4]stage             // index staging, reused round robin
	modules   map[string]cu.Module // loaded by Launch.Function, by module name
	later     laterQueue           // ReadLater's thens, run once their Runs are done
	next      int
	closed    bool
	pace      pacing // its own lock: a pacer's Turn may wait
}

// stage carries one call's index arrays: written to pinned host memory,
// copied to the device on the stream, read by the kernel. ev marks when
// the kernel that used it is done, so the next user waits for it.
type stage struct {
	host    []byte // mmap'd and page-locked
	hostDev uint64 // host's address for kernels (mapped, read over the bus)
	dev     cu.DevicePtr
	ev      cu.Event
	used    bool
	seq     uint64 // the engine's later.seq when ev was recorded
}

// NewCUDA starts a CUDA engine on opts.Device's primary context.
func NewCUDA(opts CUDAOptions) (Engine, error) {
	e := &CUDA{dev: cu.Device(opts.Device), hostBases: new([MaxRanges]uint64)}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := e.start(opts); err != nil {
		e.release()
		return nil, err
	}
	return e, nil
}

func (e *CUDA) start(opts CUDAOptions) error {
	if err := initError(); err != nil {
		return err
	}
	n, err := cu.NumDevices()
	if err != nil || opts.Device < 0 || opts.Device >= n {
		return fmt.Errorf("%w: device %d of %d (%v)", ErrNoDevice, opts.Device, n, err)
	}
	if e.ctx, err = e.dev.RetainPrimaryCtx(); err != nil {
		return fmt.Errorf("kernels: retain primary context of device %d: %w", opts.Device, err)
	}
	if err := cu.SetCurrentContext(e.ctx); err != nil {
		return fmt.Errorf("kernels: set context: %w", err)
	}
	if opts.Stream != 0 {
		// cu.Stream is a struct holding exactly one CUstream, a pointer-sized
		// handle; this builds one around the caller's handle.
		e.stream = *(*cu.Stream)(unsafe.Pointer(&opts.Stream))
	} else {
		if e.stream, err = cu.MakeStream(cu.NonBlocking); err != nil {
			return fmt.Errorf("kernels: create stream: %w", err)
		}
		e.ownStream = true
	}
	if e.mod, err = cu.LoadData(gatherPTX); err != nil {
		return fmt.Errorf("kernels: load PTX: %w", err)
	}
	if e.fnRows, err = e.mod.Function("cxl_rows"); err != nil {
		return fmt.Errorf("kernels: cxl_rows: %w", err)
	}
	if e.fnBlocks, err = e.mod.Function("cxl_blocks"); err != nil {
		return fmt.Errorf("kernels: cxl_blocks: %w", err)
	}
	if e.fnCRC, err = e.mod.Function("cxl_blocks_crc"); err != nil {
		return fmt.Errorf("kernels: cxl_blocks_crc: %w", err)
	}
	e.maxBlocks = opts.MaxBlocks
	if e.maxBlocks <= 0 {
		sms, err := e.dev.Attribute(cu.MultiprocessorCount)
		if err != nil {
			return fmt.Errorf("kernels: multiprocessor count: %w", err)
		}
		e.maxBlocks = 8 * sms
	}
	if e.bases, err = cu.MemAlloc(MaxRanges * 8); err != nil {
		return fmt.Errorf("kernels: base table: %w", err)
	}
	for i := range e.stages {
		if e.stages[i].ev, err = cu.MakeEvent(cu.DisableTiming); err != nil {
			return fmt.Errorf("kernels: event: %w", err)
		}
	}
	return e.pushBases()
}

// Name implements Engine.
func (e *CUDA) Name() string { return fmt.Sprintf("cuda:%d", int(e.dev)) }

// DeviceName implements DeviceNamer.
func (e *CUDA) DeviceName() string {
	name, err := e.dev.Name()
	if err != nil {
		return e.Name()
	}
	return name
}

// enter makes the engine's context current on a locked OS thread and takes
// the engine lock; the returned func undoes both.
func (e *CUDA) enter() (func(), error) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, ErrClosed
	}
	runtime.LockOSThread()
	if err := cu.SetCurrentContext(e.ctx); err != nil {
		runtime.UnlockOSThread()
		e.mu.Unlock()
		return nil, fmt.Errorf("kernels: set context: %w", err)
	}
	return func() { runtime.UnlockOSThread(); e.mu.Unlock() }, nil
}

// pushBases copies the base table to the device, ordered on the stream
// before any later launch.
func (e *CUDA) pushBases() error {
	if err := cu.MemcpyHtoDAsync(e.bases, unsafe.Pointer(&e.hostBases[0]), MaxRanges*8, e.stream); err != nil {
		return fmt.Errorf("kernels: upload base table: %w", err)
	}
	return e.stream.Synchronize()
}

// Register implements Engine: it page-locks mem and maps it for the GPU.
// The id is claimed under the engine lock, so no call sees the range
// before its base is on the device.
func (e *CUDA) Register(mem []byte) (RangeID, error) {
	leave, err := e.enter()
	if err != nil {
		return 0, err
	}
	defer leave()
	id, err := e.ranges.claim(int64(len(mem)))
	if err != nil {
		return 0, err
	}
	d, err := hostRegister(mem)
	if err != nil {
		e.ranges.release(id)
		return 0, err
	}
	e.mem[id], e.hostBases[id] = mem, d
	if err := e.pushBases(); err != nil {
		// Undo all of it: the id and the pin would otherwise leak, and the
		// device table may or may not hold the base.
		e.mem[id], e.hostBases[id] = nil, 0
		hostUnregister(mem)
		e.ranges.release(id)
		return 0, errors.Join(err, e.pushBases())
	}
	return id, nil
}

// Unregister implements Engine. Calls already made finish first.
func (e *CUDA) Unregister(id RangeID) error {
	leave, err := e.enter()
	if err != nil {
		return err
	}
	defer leave()
	if e.mem[id] == nil {
		return fmt.Errorf("%w: %d", ErrNoRange, id)
	}
	if err := e.stream.Synchronize(); err != nil {
		return fmt.Errorf("kernels: sync: %w", err)
	}
	e.ranges.release(id)
	mem := e.mem[id]
	e.mem[id], e.hostBases[id] = nil, 0
	// The device table must forget the base too: a kernel resolving an
	// Addr of this id must find 0, not the address of unpinned memory.
	return errors.Join(e.pushBases(), hostUnregister(mem))
}

type deviceBuffer struct {
	eng   *CUDA
	ptr   cu.DevicePtr
	n     int64
	owned bool
}

func (b *deviceBuffer) Len() int64 { return b.n }

// DevicePtr is the buffer's CUDA device address, for callers that hand it
// to other CUDA code (a torch tensor over the same memory).
func (b *deviceBuffer) DevicePtr() uintptr { return uintptr(b.ptr) }

func (b *deviceBuffer) Free() error {
	if !b.owned || b.ptr == 0 {
		b.ptr, b.n = 0, 0
		return nil
	}
	leave, err := b.eng.enter()
	if err != nil {
		return err
	}
	defer leave()
	err = cu.MemFree(b.ptr)
	b.ptr, b.n = 0, 0
	return err
}

// Alloc implements Engine.
func (e *CUDA) Alloc(n int64) (Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: buffer of %d bytes", ErrBadRequest, n)
	}
	leave, err := e.enter()
	if err != nil {
		return nil, err
	}
	defer leave()
	p, err := cu.MemAlloc(n)
	if err != nil {
		return nil, fmt.Errorf("kernels: allocate %d bytes on %s: %w", n, e.Name(), err)
	}
	return &deviceBuffer{eng: e, ptr: p, n: n, owned: true}, nil
}

// WrapDevice implements DeviceWrapper: ptr is GPU memory of n bytes in the
// engine's context that the caller keeps alive and frees.
func (e *CUDA) WrapDevice(ptr uintptr, n int64) (Buffer, error) {
	if ptr == 0 || n <= 0 {
		return nil, fmt.Errorf("%w: device memory %#x of %d bytes", ErrBadRequest, ptr, n)
	}
	return &deviceBuffer{eng: e, ptr: cu.DevicePtr(ptr), n: n}, nil
}

func (e *CUDA) own(b Buffer) (*deviceBuffer, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: no buffer", ErrBadRequest)
	}
	db, ok := b.(*deviceBuffer)
	if !ok || db.eng != e {
		return nil, ErrForeignBuffer
	}
	return db, nil
}

// Upload implements Engine.
func (e *CUDA) Upload(dst Buffer, off int64, src []byte) error {
	db, err := e.own(dst)
	if err != nil {
		return err
	}
	if err := checkBufSpan("upload", db.n, off, int64(len(src))); err != nil {
		return err
	}
	if len(src) == 0 {
		return nil
	}
	leave, err := e.enter()
	if err != nil {
		return err
	}
	defer leave()
	if err := cu.MemcpyHtoDAsync(db.ptr+cu.DevicePtr(off), unsafe.Pointer(&src[0]), int64(len(src)), e.stream); err != nil {
		return fmt.Errorf("kernels: upload: %w", err)
	}
	return e.stream.Synchronize()
}

// Download implements Engine.
func (e *CUDA) Download(dst []byte, src Buffer, off int64) error {
	db, err := e.own(src)
	if err != nil {
		return err
	}
	if err := checkBufSpan("download", db.n, off, int64(len(dst))); err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	leave, err := e.enter()
	if err != nil {
		return err
	}
	defer leave()
	if err := cu.MemcpyDtoHAsync(unsafe.Pointer(&dst[0]), db.ptr+cu.DevicePtr(off), int64(len(dst)), e.stream); err != nil {
		return fmt.Errorf("kernels: download: %w", err)
	}
	return e.stream.Synchronize()
}

// Gather implements Engine.
func (e *CUDA) Gather(r Rows) (Handle, error) { return e.rows(r, 0) }

// Scatter implements Engine.
func (e *CUDA) Scatter(r Rows) (Handle, error) { return e.rows(r, 1) }

// GatherBlocks implements Engine.
func (e *CUDA) GatherBlocks(b Blocks) (Handle, error) { return e.blocks(b, 0) }

// ScatterBlocks implements Engine.
func (e *CUDA) ScatterBlocks(b Blocks) (Handle, error) { return e.blocks(b, 1) }

func (e *CUDA) rows(r Rows, toTier uint64) (Handle, error) {
	db, err := e.own(r.Buf)
	if err != nil {
		return nil, err
	}
	return runRows(e, &e.ranges, Function{handle: fnHandle(e.fnRows)}, &r, uint64(db.ptr), toTier)
}

func (e *CUDA) blocks(b Blocks, toTier uint64) (Handle, error) {
	chunks := make([]uint64, len(b.Chunks))
	for c, ch := range b.Chunks {
		db, err := e.own(ch.Buf)
		if err != nil {
			return nil, fmt.Errorf("chunk %d: %w", c, err)
		}
		chunks[c] = uint64(db.ptr) + uint64(ch.Offset)
	}
	fns := blockKernels{plain: Function{handle: fnHandle(e.fnBlocks)}, crc: Function{handle: fnHandle(e.fnCRC)}}
	return runBlocksPaced(e, &e.pace, &e.ranges, fns, &b, chunks, toTier, &e.shifts)
}

// SetPacer implements Paced: block calls move in kernels over whole pages
// of about piece bytes (0: DevicePiece), each after the pacer's Turn, at
// most two of a call queued at once (pace.go).
func (e *CUDA) SetPacer(p Pacer, piece int64) { e.pace.set(p, piece) }

// launch runs fn with 8-byte parameters (gorgonia.org/cu passes each
// parameter by address; every kernel here takes 64-bit values).
func launch(fn cu.Function, blocks, threads, shared int, stream cu.Stream, params ...uint64) error {
	ptrs := make([]unsafe.Pointer, len(params))
	for i := range params {
		ptrs[i] = unsafe.Pointer(&params[i])
	}
	return fn.Launch(blocks, 1, 1, threads, 1, 1, shared, stream, ptrs)
}

// stage returns the next staging area with room for words words, after
// the launch that last used it has finished.
func (e *CUDA) stage(words int) (*stage, error) {
	s := &e.stages[e.next]
	e.next = (e.next + 1) % len(e.stages)
	if s.used {
		if err := s.ev.Synchronize(); err != nil {
			e.later.dropUpTo(s.seq)
			return nil, fmt.Errorf("kernels: earlier call failed: %w", err)
		}
		// The stage's host memory may hold a ReadLater's bytes: hand them
		// on before anything overwrites them.
		e.later.runUpTo(s.seq)
		s.used = false
	}
	if err := s.ensure(words * 8); err != nil {
		return nil, err
	}
	return s, nil
}

// ensure gives the stage room for need bytes, replacing smaller memory.
func (s *stage) ensure(need int) error {
	if len(s.host) >= need {
		return nil
	}
	s.free()
	size := max(need, 1<<20)
	size = (size + unix.Getpagesize() - 1) &^ (unix.Getpagesize() - 1)
	host, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("kernels: staging of %d bytes: %w", size, err)
	}
	hostDev, err := hostRegister(host)
	if err != nil {
		unix.Munmap(host)
		return err
	}
	dev, err := cu.MemAlloc(int64(size))
	if err != nil {
		hostUnregister(host)
		unix.Munmap(host)
		return fmt.Errorf("kernels: device staging of %d bytes: %w", size, err)
	}
	s.host, s.hostDev, s.dev = host, hostDev, dev
	return nil
}

// words views the stage's host memory as uint64s. The mapping is page
// aligned, so the conversion is aligned.
func (s *stage) words() []uint64 {
	return unsafe.Slice((*uint64)(unsafe.Pointer(&s.host[0])), len(s.host)/8)
}

func (s *stage) free() {
	if s.host != nil {
		hostUnregister(s.host)
		unix.Munmap(s.host)
		s.host = nil
	}
	if s.dev != 0 {
		cu.MemFree(s.dev)
		s.dev = 0
	}
}

// Sync implements Engine.
func (e *CUDA) Sync() error {
	leave, err := e.enter()
	if err != nil {
		return err
	}
	defer leave()
	return e.stream.Synchronize()
}

// Close implements Engine.
func (e *CUDA) Close() error {
	leave, err := e.enter()
	if err != nil {
		return err
	}
	defer leave()
	err = e.stream.Synchronize()
	e.closed = true
	e.release()
	return err
}

// release frees whatever start and later calls acquired. Called with the
// context current.
func (e *CUDA) release() {
	e.later.drop()
	for id, mem := range e.mem {
		if mem != nil {
			hostUnregister(mem)
			e.mem[id] = nil
			e.ranges.release(RangeID(id))
		}
	}
	for i := range e.stages {
		e.stages[i].free()
		if e.stages[i].ev != (cu.Event{}) {
			cu.DestroyEvent(&e.stages[i].ev)
		}
	}
	if e.bases != 0 {
		cu.MemFree(e.bases)
		e.bases = 0
	}
	for name, mod := range e.modules {
		mod.Unload()
		delete(e.modules, name)
	}
	if e.mod != (cu.Module{}) {
		e.mod.Unload()
		e.mod = cu.Module{}
	}
	if e.ownStream {
		e.stream.Destroy()
		e.ownStream = false
	}
	if e.ctx != (cu.CUContext{}) {
		e.dev.ReleasePrimaryCtx()
		e.ctx = cu.CUContext{}
	}
}

type cudaHandle struct {
	e   *CUDA
	ev  cu.Event
	seq uint64 // the engine's later.seq at the Run's end
}

// Wait implements Handle. A stage's event may have been recorded again by
// a later call; waiting for that one also covers this call (same stream).
// Then the ReadLater thens of this Run and those before it run, in order.
func (h *cudaHandle) Wait() error {
	// Only the closed flag and the thens need the lock: event sync takes
	// no context, and other calls may queue work meanwhile.
	h.e.mu.Lock()
	closed := h.e.closed
	h.e.mu.Unlock()
	if closed {
		return ErrClosed
	}
	err := h.ev.Synchronize()
	h.e.mu.Lock()
	defer h.e.mu.Unlock()
	switch {
	case h.e.closed:
		return ErrClosed
	case err != nil:
		h.e.later.dropUpTo(h.seq)
		return fmt.Errorf("kernels: %s: %w", h.e.Name(), err)
	}
	h.e.later.runUpTo(h.seq)
	return nil
}

type cudaDone struct{}

func (cudaDone) Wait() error { return nil }

// CopyEach implements Baseline: one cuMemcpyHtoDAsync per row.
func (e *CUDA) CopyEach(r Rows) error {
	db, err := e.own(r.Buf)
	if err != nil {
		return err
	}
	leave, err := e.enter()
	if err != nil {
		return err
	}
	defer leave()
	if err := e.ranges.checkRows(&r); err != nil {
		return err
	}
	for i, a := range r.Tier {
		d := r.bufOffset(i)
		src := unsafe.Pointer(&e.mem[a.Range()][a.Offset()])
		if err := cu.MemcpyHtoDAsync(db.ptr+cu.DevicePtr(d), src, r.RowBytes, e.stream); err != nil {
			return fmt.Errorf("kernels: row %d: %w", i, err)
		}
	}
	return e.stream.Synchronize()
}

// BulkCopy implements Baseline.
func (e *CUDA) BulkCopy(dst Buffer, dstOff int64, src Addr, n int64) error {
	db, err := e.own(dst)
	if err != nil {
		return err
	}
	if err := checkBufSpan("bulk copy", db.n, dstOff, n); err != nil {
		return err
	}
	leave, err := e.enter()
	if err != nil {
		return err
	}
	defer leave()
	if err := e.ranges.checkOne(src, n, "bulk copy"); err != nil {
		return err
	}
	p := unsafe.Pointer(&e.mem[src.Range()][src.Offset()])
	if err := cu.MemcpyHtoDAsync(db.ptr+cu.DevicePtr(dstOff), p, n, e.stream); err != nil {
		return fmt.Errorf("kernels: bulk copy: %w", err)
	}
	return e.stream.Synchronize()
}
