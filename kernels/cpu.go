package kernels

import (
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/cxltier/cxltier/internal/crccopy"
	"github.com/cxltier/cxltier/internal/lowprio"
	"github.com/cxltier/cxltier/internal/rowgather"
)

// CPU is the engine that runs everywhere: copies between registered host
// memory and host buffers, split across cores. Tests run every case on it,
// and it is the fallback where there is no GPU.
type CPU struct {
	ranges  rangeTable
	workers int

	mu sync.Mutex
	// mem is the registered memory by range id. It is replaced, never
	// changed in place, when a range comes or goes, so a call keeps the
	// table it was checked against by pointer: copying the table (6 KiB)
	// into every call was most of what a layer's gather allocated, and
	// the heap's churn cost page faults in the copies.
	mem    *[MaxRanges][]byte
	tail   *cpuHandle // last call queued: the next one runs after it
	closed bool
	pacer  Pacer // paces block calls; nil: none
	piece  int64
	// background copies the calls marked Background; nil: they are
	// copied as any other.
	background *lowprio.Pool
}

// Pacer paces an engine's bulk copies, its block calls: Turn(n) is called
// before each piece of about n bytes and may wait. tier/link's arbiter is
// one: it makes the piece wait while another transfer's deadline is due,
// so that transfer waits for at most one piece. Row calls (Engram and
// top-k gathers, the transfers with deadlines) are never paced.
type Pacer interface{ Turn(n int64) }

// DefaultPiece is the piece a pacer gets when SetPacer is given 0: about
// 40 µs of a core's checksummed copy, less than an Engram layer's 56 µs.
const DefaultPiece = 256 << 10

// SetPacer paces the block calls submitted from now on in pieces of about
// piece bytes (0: DefaultPiece); nil stops pacing.
func (e *CPU) SetPacer(p Pacer, piece int64) {
	if piece <= 0 {
		piece = DefaultPiece
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pacer, e.piece = p, piece
}

// Priority is how far the threads that copy an engine's background calls
// are lowered: PriorityNormal (not at all), PriorityLow (nice 19) or
// PriorityIdle (SCHED_IDLE). ParsePriority reads its name.
type Priority = lowprio.Policy

const (
	PriorityNormal = lowprio.Normal
	PriorityLow    = lowprio.Low
	PriorityIdle   = lowprio.Idle
)

// ParsePriority reads a priority's name: "normal", "low" (also "") or
// "idle"; any other is an error wrapping lowprio's ErrBadPolicy.
func ParsePriority(s string) (Priority, error) { return lowprio.ParsePolicy(s) }

// SetBackground copies the block calls marked Background from now on on
// threads of their own, as many as the engine's workers, lowered to p:
// on a host whose cores are all busy the kernel then gives a core to a
// thread with a deadline (an Engram prefetch, a top-k step, a request's
// load) as soon as it wakes, and the stores take what is left.
// PriorityNormal stops it. If the threads cannot be lowered (a system
// that refuses it), the error says so and the calls are copied as
// before. A closed engine returns ErrClosed.
func (e *CPU) SetBackground(p Priority) error {
	var pool *lowprio.Pool
	if p != PriorityNormal {
		var err error
		if pool, err = lowprio.Start(e.workers, p); err != nil {
			return fmt.Errorf("kernels: cpu: background threads: %w", err)
		}
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		if pool != nil {
			pool.Close() // Close has run: nothing would end its threads
		}
		return ErrClosed
	}
	old := e.background
	e.background = pool
	e.mu.Unlock()
	if old != nil {
		old.Close() // a call queued with it copies on the caller's goroutine
	}
	return nil
}

// Background is the priority of the engine's background threads.
func (e *CPU) Background() Priority {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.background == nil {
		return PriorityNormal
	}
	return e.background.Policy()
}

// NewCPU returns a CPU engine using up to workers goroutines per call
// (0: GOMAXPROCS).
func NewCPU(workers int) *CPU {
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	return &CPU{workers: workers, mem: new([MaxRanges][]byte), tail: doneHandle()}
}

// Name implements Engine.
func (e *CPU) Name() string { return "cpu" }

// Register implements Engine. The id is claimed under the engine lock, so
// no call sees the range before its memory is in the table.
func (e *CPU) Register(mem []byte) (RangeID, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return 0, ErrClosed
	}
	id, err := e.ranges.claim(int64(len(mem)))
	if err != nil {
		return 0, err
	}
	e.setRange(id, mem)
	return id, nil
}

// Unregister implements Engine. Calls already made finish first; calls
// made after it returns cannot reach the range (they are checked under the
// same lock).
func (e *CPU) Unregister(id RangeID) error {
	e.mu.Lock()
	if err := e.ranges.release(id); err != nil {
		e.mu.Unlock()
		return err
	}
	e.setRange(id, nil)
	tail := e.tail
	e.mu.Unlock()
	return tail.Wait()
}

// setRange replaces the range table with one whose range id is mem.
// Called with the engine lock held.
func (e *CPU) setRange(id RangeID, mem []byte) {
	t := *e.mem
	t[id] = mem
	e.mem = &t
}

// CheckSpan reports whether n bytes at a lie in a registered range (for
// planners that compute addresses themselves and want to name a bad one
// before their gather does).
func (e *CPU) CheckSpan(a Addr, n int64) error { return e.ranges.checkOne(a, n, "span") }

type hostBuffer struct {
	eng *CPU
	b   []byte
}

func (h *hostBuffer) Len() int64 { return int64(len(h.b)) }
func (h *hostBuffer) Free() error {
	h.b = nil
	return nil
}

// Alloc implements Engine.
func (e *CPU) Alloc(n int64) (Buffer, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: buffer of %d bytes", ErrBadRequest, n)
	}
	b := make([]byte, n)
	// A GPU buffer is resident once allocated; make this one resident too,
	// so that calls scattering rows over it (a hot-row cache) do not pay a
	// page fault per first-touched page inside their latency.
	for i := 0; i < len(b); i += 4096 {
		b[i] = 0
	}
	return &hostBuffer{eng: e, b: b}, nil
}

// WrapHost implements HostWrapper: mem becomes a buffer of this engine
// without a copy. The caller keeps mem alive until the buffer's last call
// is done; Free only drops the reference.
func (e *CPU) WrapHost(mem []byte) (Buffer, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("%w: host buffer of 0 bytes", ErrBadRequest)
	}
	return &hostBuffer{eng: e, b: mem}, nil
}

// Bytes is the memory of a CPU engine buffer (for callers that work on it
// directly, like tests and the CPU fallback paths above this package).
func (e *CPU) Bytes(b Buffer) ([]byte, error) {
	hb, err := e.own(b)
	if err != nil {
		return nil, err
	}
	return hb.b, nil
}

func (e *CPU) own(b Buffer) (*hostBuffer, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: no buffer", ErrBadRequest)
	}
	hb, ok := b.(*hostBuffer)
	if !ok || hb.eng != e {
		return nil, ErrForeignBuffer
	}
	return hb, nil
}

// Upload implements Engine.
func (e *CPU) Upload(dst Buffer, off int64, src []byte) error {
	hb, err := e.own(dst)
	if err != nil {
		return err
	}
	if err := checkBufSpan("upload", hb.Len(), off, int64(len(src))); err != nil {
		return err
	}
	if err := e.Sync(); err != nil {
		return err
	}
	copy(hb.b[off:], src)
	return nil
}

// Download implements Engine.
func (e *CPU) Download(dst []byte, src Buffer, off int64) error {
	hb, err := e.own(src)
	if err != nil {
		return err
	}
	if err := checkBufSpan("download", hb.Len(), off, int64(len(dst))); err != nil {
		return err
	}
	if err := e.Sync(); err != nil {
		return err
	}
	copy(dst, hb.b[off:])
	return nil
}

// Gather implements Engine.
func (e *CPU) Gather(r Rows) (Handle, error) { return e.rows(r, false) }

// Scatter implements Engine.
func (e *CPU) Scatter(r Rows) (Handle, error) { return e.rows(r, true) }

// GatherBlocks implements Engine.
func (e *CPU) GatherBlocks(b Blocks) (Handle, error) { return e.blocks(b, false) }

// ScatterBlocks implements Engine.
func (e *CPU) ScatterBlocks(b Blocks) (Handle, error) { return e.blocks(b, true) }

func (e *CPU) rows(r Rows, toTier bool) (Handle, error) {
	hb, err := e.own(r.Buf)
	if err != nil {
		return nil, err
	}
	n, buf := r.RowBytes, hb.b
	check := func() error { return e.ranges.checkRows(&r) }
	detach := func() { r.Tier, r.Slots = slices.Clone(r.Tier), slices.Clone(r.Slots) }
	return e.submit(len(r.Tier), n, nil, check, detach, nil, nil, func(mem *[MaxRanges][]byte, lo, hi int) {
		// Runs of rows in one range go to rowgather a run at a time: its
		// vector copy keeps many rows' misses in flight where a memmove per
		// row kept about four.
		var tierOffs, bufOffs [spanRun]int64
		for i := lo; i < hi; {
			rng, k := r.Tier[i].Range(), 0
			for ; i < hi && k < spanRun && r.Tier[i].Range() == rng; i, k = i+1, k+1 {
				tierOffs[k], bufOffs[k] = r.Tier[i].Offset(), r.bufOffset(i)
			}
			var err error
			if toTier {
				err = rowgather.CopySpans(mem[rng], buf, tierOffs[:k], bufOffs[:k], int(n))
			} else {
				err = rowgather.CopySpans(buf, mem[rng], bufOffs[:k], tierOffs[:k], int(n))
			}
			if err != nil { // checkRows vouched for every span
				panic(fmt.Sprintf("kernels: cpu rows past their check: %v", err))
			}
		}
	})
}

func (e *CPU) blocks(b Blocks, toTier bool) (Handle, error) {
	chunks := make([][]byte, len(b.Chunks))
	offsets := make([]int64, len(b.Chunks))
	for c, ch := range b.Chunks {
		hb, err := e.own(ch.Buf)
		if err != nil {
			return nil, fmt.Errorf("chunk %d: %w", c, err)
		}
		chunks[c], offsets[c] = hb.b, ch.Offset
	}
	check := func() error { return e.ranges.checkBlocks(&b) }
	tier, pages := b.Tier, b.Pages
	nc := len(chunks)
	detach := func() { tier, pages = slices.Clone(tier), slices.Clone(pages) }
	var sums *chunkSums
	var begin, finish func()
	if b.CRCs != nil {
		sums = newChunkSums(len(b.CRCs), nc)
		// The seeds are read when the copy starts, after the calls queued
		// before it joined theirs: a layer's call continues the layer
		// before's checksums however early it was queued.
		begin = func() { sums.seeds = slices.Clone(b.CRCs) }
		finish = func() { sums.join(b.CRCs, b.ChunkBytes) }
	}
	e.mu.Lock()
	pacer, piece := e.pacer, e.piece
	var bg *lowprio.Pool
	if b.Background {
		bg = e.background
	}
	e.mu.Unlock()
	if pacer != nil && b.Pacer != nil {
		pacer = b.Pacer
	}
	return e.submit(len(tier)*nc, b.ChunkBytes, bg, check, detach, begin, finish, func(mem *[MaxRanges][]byte, lo, hi int) {
		n, stride := b.ChunkBytes, b.PageStride // set by check
		var crc uint32
		perPiece := int(max(1, (piece+n-1)/n)) // rows: a piece is whole chunks
		for r := lo; r < hi; r++ {
			if pacer != nil && (r-lo)%perPiece == 0 {
				pacer.Turn(int64(min(perPiece, hi-r)) * n)
			}
			blk, c := r/nc, r%nc
			a := tier[blk]
			toff := a.Offset() + int64(c)*n
			t := mem[a.Range()][toff : toff+n]
			boff := offsets[c] + pages[blk]*stride
			g := chunks[c][boff : boff+n]
			src, dst := t, g
			if toTier {
				src, dst = g, t
			}
			if sums == nil {
				copy(dst, src)
				continue
			}
			crc = sums.start(r, lo, crc)
			crc = crccopy.Update(crc, dst, src)
			sums.end(r, hi, crc)
		}
	})
}

// chunkSums are the checksums of a blocks call on the CPU: each goroutine
// checksums its rows (chunks) in one chain per block it touches, as it
// copies them; a block split between goroutines has its runs joined in
// order once all are done.
type chunkSums struct {
	nc     int
	seeds  []uint32 // what precedes each block, as the copy found it
	run    []uint32 // at a run's last row: the run's checksum
	begins []bool   // a run starts here in the middle of its block
}

func newChunkSums(blocks, nc int) *chunkSums {
	rows := blocks * nc
	return &chunkSums{nc: nc, run: make([]uint32, rows), begins: make([]bool, rows)}
}

// start is the checksum row r continues: its block's seed at the block's
// first row, 0 where a goroutine's rows (from lo) begin mid-block, else
// crc, the chain so far.
func (s *chunkSums) start(r, lo int, crc uint32) uint32 {
	switch {
	case r%s.nc == 0:
		return s.seeds[r/s.nc]
	case r == lo:
		s.begins[r] = true
		return 0
	}
	return crc
}

// end keeps the chain's checksum where its run ends: at its block's last
// row, or at the goroutine's last (hi is past it).
func (s *chunkSums) end(r, hi int, crc uint32) {
	if r%s.nc == s.nc-1 || r == hi-1 {
		s.run[r] = crc
	}
}

// join writes each block's checksum into out, joining its runs in order.
func (s *chunkSums) join(out []uint32, chunkBytes int64) {
	for blk := range out {
		first := blk * s.nc
		crc, start := uint32(0), first
		for r := first; r < first+s.nc; r++ {
			if r < first+s.nc-1 && !s.begins[r+1] {
				continue // the run goes on
			}
			if start == first {
				crc = s.run[r]
			} else {
				crc = crccopy.Combine(crc, s.run[r], int64(r-start+1)*chunkBytes)
			}
			start = r + 1
		}
		out[blk] = crc
	}
}

// spanRun is how many rows the CPU engine hands rowgather at a time.
const spanRun = 64

// parallelBytes is the least work worth handing to another goroutine.
const parallelBytes = 256 << 10

// submit checks a call under the engine lock (so no Unregister comes
// between the check and the copy's snapshot of the ranges) and queues a
// copy of rows rows of rowBytes each behind the calls before it: begin
// (if any) when the calls before are done, then the copy, then finish (if
// any) once every row is copied. A call with nothing ahead of
// it and too small to split runs at once on the caller's goroutine; only
// a call that is queued runs detach first, to stop sharing the caller's
// index slices. With bg, the rows are copied on bg's threads, however
// the call runs.
func (e *CPU) submit(rows int, rowBytes int64, bg *lowprio.Pool, check func() error, detach, begin, finish func(), copyRows func(mem *[MaxRanges][]byte, lo, hi int)) (Handle, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return nil, ErrClosed
	}
	if err := check(); err != nil {
		return nil, err
	}
	mem := e.mem // the table as checked: Register replaces it, never changes it
	parts := int(min(int64(e.workers), int64(rows)*rowBytes/parallelBytes))
	run := func() {
		if begin != nil {
			begin()
		}
		switch {
		case bg != nil:
			fns := make([]func(), max(1, parts))
			for p := range fns {
				fns[p] = func() { copyRows(mem, rows*p/len(fns), rows*(p+1)/len(fns)) }
			}
			bg.Run(fns...)
		case parts <= 1:
			copyRows(mem, 0, rows)
		default:
			var wg sync.WaitGroup
			for p := range parts {
				wg.Go(func() { copyRows(mem, rows*p/parts, rows*(p+1)/parts) })
			}
			wg.Wait()
		}
		if finish != nil {
			finish()
		}
	}
	prev := e.tail
	if prev.done() && parts <= 1 {
		run()
		return doneHandle(), nil
	}
	detach()
	h := &cpuHandle{ch: make(chan struct{})}
	e.tail = h
	go func() {
		<-prev.ch
		run()
		close(h.ch)
	}()
	return h, nil
}

// Sync implements Engine.
func (e *CPU) Sync() error {
	e.mu.Lock()
	t := e.tail
	e.mu.Unlock()
	return t.Wait()
}

// Close implements Engine.
func (e *CPU) Close() error {
	if err := e.Sync(); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	for id := range e.mem {
		if e.mem[id] != nil {
			e.ranges.release(RangeID(id))
		}
	}
	e.mem = new([MaxRanges][]byte)
	if e.background != nil {
		// A call queued since the Sync above copies on its caller's
		// goroutine once the pool is closed.
		e.background.Close()
		e.background = nil
	}
	return nil
}

type cpuHandle struct{ ch chan struct{} }

func doneHandle() *cpuHandle {
	h := &cpuHandle{ch: make(chan struct{})}
	close(h.ch)
	return h
}

func (h *cpuHandle) done() bool {
	select {
	case <-h.ch:
		return true
	default:
		return false
	}
}

// Wait implements Handle.
func (h *cpuHandle) Wait() error {
	<-h.ch
	return nil
}

// CopyEach implements Baseline: one copy per row on the caller's goroutine.
func (e *CPU) CopyEach(r Rows) error {
	hb, err := e.own(r.Buf)
	if err != nil {
		return err
	}
	e.mu.Lock()
	err = e.ranges.checkRows(&r)
	mem := e.mem
	e.mu.Unlock()
	if err != nil {
		return err
	}
	for i, a := range r.Tier {
		d := r.bufOffset(i)
		copy(hb.b[d:d+r.RowBytes], mem[a.Range()][a.Offset():])
	}
	return nil
}

// BulkCopy implements Baseline.
func (e *CPU) BulkCopy(dst Buffer, dstOff int64, src Addr, n int64) error {
	hb, err := e.own(dst)
	if err != nil {
		return err
	}
	if err := checkBufSpan("bulk copy", hb.Len(), dstOff, n); err != nil {
		return err
	}
	e.mu.Lock()
	err = e.ranges.checkOne(src, n, "bulk copy")
	m := e.mem[src.Range()]
	e.mu.Unlock()
	if err != nil {
		return err
	}
	copy(hb.b[dstOff:dstOff+n], m[src.Offset():])
	return nil
}
