// Package rowgather copies rows chosen by id out of tables far larger than
// the caches (Engram tables, sparse KV) into a caller's buffer, at the
// speed the memory allows: every row of a random batch misses the caches
// and the TLB, so a gather is bound by how many misses are in flight at
// once, not by the bytes moved.
//
// Two rules carry the speed, both measured (BenchmarkCopy, and
// bench/engramhost against torch's index_select):
//
//   - Rows that are a multiple of 16 bytes move in vector steps
//     (copy_amd64.s), so that stores do not fill the core's store queue
//     before enough loads are in flight; no software prefetch then, which
//     only added work. Other rows take a batch of prefetch hints, then
//     their copies.
//   - Helpers are never waited for. Waking a parked core costs tens of
//     microseconds (more on a virtual machine), as much as a few hundred
//     rows, so a call is cut into chunks claimed one at a time: the
//     calling thread starts at once, a helper that wakes late takes what
//     is left, or nothing, and helpers look for work a while before they
//     park, so that back-to-back calls find them awake.
package rowgather

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cxltier/cxltier/internal/prefetch"
)

// ErrBadPlane and ErrBadID are what Copy refuses before it writes.
var (
	ErrBadPlane = errors.New("rowgather: bad plane")
	ErrBadID    = errors.New("rowgather: out of range")
)

// Plane is one table of fixed-size rows and where its gathered rows go:
// row id is Src[id*RowBytes:(id+1)*RowBytes], and the i-th gathered row
// lands at Dst[i*RowBytes:]. A table of several planes (SGLang's Engram
// rows and their scales) is gathered in one call, so each id's rows of
// every plane are in flight together.
type Plane struct {
	Src      []byte
	RowBytes int
	Dst      []byte
}

// badID returns the position of the first id outside [0, rows), or -1
// when all are inside.
func badID(ids []int64, rows int64) int {
	for i, id := range ids {
		if uint64(id) >= uint64(rows) {
			return i
		}
	}
	return -1
}

const (
	// batchBytes is how many bytes of rows a batch hints before it copies:
	// enough misses to fill a core's miss buffers, few enough that the
	// lines are still in L1 when the copies reach them.
	batchBytes = 16 << 10
	minBatch   = 8
	maxBatch   = 128

	// A call is cut into chunks that threads claim one at a time: about
	// four per thread, between minChunk and maxChunk rows.
	minChunk = 128
	maxChunk = 512
	// minParallel is the least rows worth sharing: below it (about 50 µs
	// of one core's copying) a helper's hand-offs cost more than its rows
	// save, even when it is awake.
	minParallel = 2048
	// spin is how long a helper keeps looking for work after its last
	// chunk before it parks, so that back-to-back calls (a batch's
	// layers) find it awake, as OpenMP's workers do for torch.
	spin = 200 * time.Microsecond
)

// Pool copies with the calling thread and up to threads-1 helper
// goroutines. Its zero value copies on the caller's thread alone.
type Pool struct {
	helpers int
	mu      sync.Mutex // held by the one call the helpers serve
	cur     atomic.Pointer[work]
	awake   atomic.Int32 // helpers looking for work, not parked
	wake    chan struct{}
	start   sync.Once
}

// NewPool returns a pool copying on up to threads threads (< 1: one).
// Its helpers start with the first call that can use them and live as
// long as the process (a library has one pool).
func NewPool(threads int) *Pool {
	h := max(threads-1, 0)
	return &Pool{helpers: h, wake: make(chan struct{}, h)}
}

// Copy copies every plane's rows ids into its Dst, on up to threads of
// the pool's threads (< 1: all). It checks everything first: a plane whose
// Dst cannot hold len(ids) rows, or an id outside any plane's rows, is an
// error and nothing is written. Helpers join only while chunks are left:
// the caller never waits for one to wake, only for chunks in progress.
func (p *Pool) Copy(planes []Plane, ids []int64, threads int) error {
	if err := check(planes, ids); err != nil {
		return err
	}
	if threads < 1 || threads-1 > p.helpers {
		threads = p.helpers + 1
	}
	if len(ids) == 0 {
		return nil
	}
	if threads <= 1 || len(ids) < minParallel || !p.mu.TryLock() {
		copyRange(planes, ids, 0, len(ids))
		return nil
	}
	defer p.mu.Unlock()
	p.start.Do(func() {
		for range p.helpers {
			go p.helper()
		}
	})
	chunk := min(max(len(ids)/(4*threads), minChunk), maxChunk)
	w := &work{planes: planes, ids: ids, chunk: chunk, chunks: int64((len(ids) + chunk - 1) / chunk)}
	w.seats.Store(int32(threads - 1))
	p.cur.Store(w)
	for range threads - 1 - int(p.awake.Load()) {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	w.run()
	// Chunks still being copied by helpers take at most a chunk's time.
	// Waiting on a channel would park this goroutine, and one called
	// from C is locked to its thread: waking it is a thread hand-off that
	// costs more than the chunk.
	for w.finished.Load() < w.chunks {
	}
	p.cur.Store(nil)
	return nil
}

// helper serves calls as long as they come within spin of each other,
// then parks until a call wakes it.
func (p *Pool) helper() {
	for {
		p.awake.Add(1)
		idle := time.Now()
		for spins := 0; ; spins++ {
			if w := p.cur.Load(); w != nil && w.seats.Load() > 0 && w.seats.Add(-1) >= 0 {
				w.run()
				idle = time.Now()
				continue
			}
			if spins%64 == 0 && time.Since(idle) > spin {
				break
			}
			runtime.Gosched()
		}
		p.awake.Add(-1)
		<-p.wake
	}
}

func check(planes []Plane, ids []int64) error {
	rows := int64(math.MaxInt64)
	for p, pl := range planes {
		if pl.RowBytes <= 0 || len(ids) > len(pl.Dst)/pl.RowBytes {
			return fmt.Errorf("%w: plane %d: %d ids of %d-byte rows into %d bytes", ErrBadPlane, p, len(ids), pl.RowBytes, len(pl.Dst))
		}
		rows = min(rows, int64(len(pl.Src)/pl.RowBytes))
	}
	if i := badID(ids, rows); i >= 0 {
		return fmt.Errorf("%w: id %d (position %d) outside [0, %d)", ErrBadID, ids[i], i, rows)
	}
	return nil
}

// work is one call shared with the helpers. A helper that takes a seat
// after every chunk is claimed returns without touching the planes, so
// the caller waits only for chunks in progress.
type work struct {
	planes   []Plane
	ids      []int64
	chunk    int
	chunks   int64
	seats    atomic.Int32 // helpers that may still join
	next     atomic.Int64
	finished atomic.Int64
}

func (w *work) run() {
	for {
		c := w.next.Add(1) - 1
		if c >= w.chunks {
			return
		}
		lo := int(c) * w.chunk
		copyRange(w.planes, w.ids, lo, min(lo+w.chunk, len(w.ids)))
		w.finished.Add(1)
	}
}

func batchRows(planes []Plane) int {
	per := 0
	for _, p := range planes {
		per += p.RowBytes
	}
	return min(max(batchBytes/max(per, 1), minBatch), maxBatch)
}

// copyRange copies rows [lo, hi) of ids: planes of vector rows and of
// 8-byte rows in one pass each, the others a batch at a time (hints for
// every row, then the copies).
func copyRange(planes []Plane, ids []int64, lo, hi int) {
	var restBuf [4]Plane
	rest := restBuf[:0]
	for _, p := range planes {
		switch {
		case vectorRows(p.RowBytes):
			vecRows(p, ids, lo, hi)
		case p.RowBytes == 8:
			copyWords(p, ids, lo, hi)
		default:
			rest = append(rest, p)
		}
	}
	batch := batchRows(rest)
	for k := lo; k < hi && len(rest) > 0; k += batch {
		end := min(k+batch, hi)
		for _, p := range rest {
			for _, id := range ids[k:end] {
				prefetch.Lines(&p.Src[id*int64(p.RowBytes)], uintptr(p.RowBytes))
			}
		}
		for _, p := range rest {
			copyRows(p, ids, k, end)
		}
	}
}

// vectorRows reports whether rows of rowBytes move in vector steps here:
// a multiple of 16 bytes, on a CPU with AVX2. Why not memmove: it moves a
// 256-byte row in sixteen 16-byte stores, and a store cannot retire
// before the loads ahead of it, so the core's store queue holds about
// four rows and with them four rows' misses; 64-byte steps keep four to
// eight times as many misses in flight, which is the whole speed of a
// random gather.
func vectorRows(rowBytes int) bool { return hasVec && rowBytes > 0 && rowBytes%16 == 0 }

// copyWords copies rows [lo, hi) of a plane of 8-byte rows (Engram's
// scales): one load and one store each, not a memmove call each, and no
// hints (the core keeps dozens of such loads in flight by itself).
func copyWords(p Plane, ids []int64, lo, hi int) {
	for i := lo; i < hi; i++ {
		binary.NativeEndian.PutUint64(p.Dst[i*8:], binary.NativeEndian.Uint64(p.Src[ids[i]*8:]))
	}
}

// copyRows copies rows [lo, hi) of one plane with memmove.
func copyRows(p Plane, ids []int64, lo, hi int) {
	rb := int64(p.RowBytes)
	for i := lo; i < hi; i++ {
		at, to := ids[i]*rb, int64(i)*rb
		copy(p.Dst[to:to+rb], p.Src[at:at+rb])
	}
}

// CopySpans copies rows of rowBytes: dst[dstOffs[i]:][:rowBytes] =
// src[srcOffs[i]:][:rowBytes] for every i, on the calling thread: what an
// engine that resolves its own addresses (the CPU gather engine) copies.
// Every span is checked first; one outside its slice is an error and
// nothing is written.
func CopySpans(dst, src []byte, dstOffs, srcOffs []int64, rowBytes int) error {
	if rowBytes <= 0 || len(dstOffs) != len(srcOffs) {
		return fmt.Errorf("%w: %d-byte rows, %d destinations for %d sources", ErrBadPlane, rowBytes, len(dstOffs), len(srcOffs))
	}
	rb := int64(rowBytes)
	for i := range srcOffs {
		s, d := srcOffs[i], dstOffs[i]
		if uint64(s) > uint64(int64(len(src))-rb) || uint64(d) > uint64(int64(len(dst))-rb) || int64(len(src)) < rb || int64(len(dst)) < rb {
			return fmt.Errorf("%w: span %d: %d bytes from %d of %d to %d of %d", ErrBadID, i, rb, s, len(src), d, len(dst))
		}
	}
	if len(srcOffs) == 0 {
		return nil
	}
	if vectorRows(rowBytes) {
		vecSpans(dst, src, dstOffs, srcOffs, rowBytes)
		return nil
	}
	batch := min(max(batchBytes/rowBytes, minBatch), maxBatch)
	for k := 0; k < len(srcOffs); k += batch {
		end := min(k+batch, len(srcOffs))
		for _, s := range srcOffs[k:end] {
			prefetch.Lines(&src[s], uintptr(rb))
		}
		for i := k; i < end; i++ {
			copy(dst[dstOffs[i]:dstOffs[i]+rb], src[srcOffs[i]:srcOffs[i]+rb])
		}
	}
	return nil
}
