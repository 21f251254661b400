package kernels

import (
	"fmt"
	"unsafe"

	"github.com/cxltier/cxltier/internal/errkind"
)

// Sentinel errors; calls wrap them with the offending row or range.
var (
	ErrOutOfBounds   = errkind.New(errkind.Invalid, "kernels: row outside its range or buffer")
	ErrNoRange       = errkind.New(errkind.Invalid, "kernels: range not registered")
	ErrTooManyRanges = errkind.New(errkind.NoSpace, "kernels: all range ids in use")
	ErrBadRequest    = errkind.New(errkind.Invalid, "kernels: malformed request")
	ErrForeignBuffer = errkind.New(errkind.Invalid, "kernels: buffer belongs to another engine")
	ErrClosed        = errkind.New(errkind.Closed, "kernels: engine closed")
	ErrNoDevice      = errkind.New(errkind.Invalid, "kernels: no CUDA device")
)

// MaxRanges is how many ranges an engine can have registered at once: the
// range id is the top byte of an Addr.
const MaxRanges = 256

// RangeID names a registered range.
type RangeID uint8

// Addr is a byte address in registered memory: the range id in the top 8
// bits and the offset in the range in the low 56. Kernels resolve it with a
// per-range base table, so one launch reads from every tier device.
type Addr uint64

const addrOffsetBits = 56

// MaxRangeBytes is the largest range an Addr can address (64 PiB).
const MaxRangeBytes = int64(1) << addrOffsetBits

// At makes the address of byte off of range r. off must be in [0, MaxRangeBytes).
func At(r RangeID, off int64) Addr {
	return Addr(uint64(r)<<addrOffsetBits | uint64(off)&(uint64(MaxRangeBytes)-1))
}

// Range is the range id part of a.
func (a Addr) Range() RangeID { return RangeID(a >> addrOffsetBits) }

// Offset is the byte offset part of a.
func (a Addr) Offset() int64 { return int64(uint64(a) & (uint64(MaxRangeBytes) - 1)) }

func (a Addr) String() string { return fmt.Sprintf("%d:%#x", a.Range(), a.Offset()) }

// Buffer is memory owned by an engine: GPU memory for the CUDA engine,
// host memory for the CPU engine. Buffers are not safe to free while a call
// that uses them is in flight.
type Buffer interface {
	Len() int64
	Free() error
}

// Rows moves RowBytes-sized rows between the tier and a buffer: row i is at
// Tier[i] in registered memory and in slot Slots[i] of Buf (slot s starts at
// BufOffset + s*SlotStride). Slots nil means row i is in slot i.
type Rows struct {
	RowBytes   int64
	Tier       []Addr
	Buf        Buffer
	BufOffset  int64
	Slots      []int64 // nil: contiguous
	SlotStride int64   // 0: RowBytes
}

// bufOffset is where row i lies in Buf. It needs SlotStride set, which
// the engines' validation does before any copy.
func (r *Rows) bufOffset(i int) int64 {
	if r.Slots == nil {
		return r.BufOffset + int64(i)*r.SlotStride
	}
	return r.BufOffset + r.Slots[i]*r.SlotStride
}

// Blocks moves paged KV blocks: block b is len(Chunks)*ChunkBytes contiguous
// bytes at Tier[b], and its chunk c lives in Chunks[c].Buf at
// Chunks[c].Offset + Pages[b]*PageStride (typically one chunk per layer and
// K/V, each in its own buffer, all indexed by the same page).
type Blocks struct {
	ChunkBytes int64
	Tier       []Addr
	Pages      []int64
	Chunks     []Span
	PageStride int64 // 0: ChunkBytes

	// CRCs, when not nil, has one word per block, and the call checksums
	// what it moves as it moves it: CRCs[b] is read as the CRC-32C of
	// what precedes block b's bytes (a seed, or the layers moved before)
	// and, once the call is done, holds it updated with the bytes the
	// call moved, in the tier's order — those read from the tier by a
	// gather, those written to it by a scatter. No engine reads the bytes
	// a second time for it. The caller must not touch CRCs until Wait
	// returns. CRCs is read only after the calls queued before this one
	// on the engine are done, so a call may continue the checksums of
	// the one queued just before it on the same slice (a layer-wise load
	// queues layer i+1 before it waits for layer i).
	CRCs []uint32

	// Pacer, when not nil, paces this call's pieces in place of the
	// engine's pacer on an engine that is paced (SetPacer): a transfer of
	// another class on the same link, such as a request's load that its
	// first token waits on. An engine not paced ignores it.
	Pacer Pacer

	// Background says that nobody waits on this call soon (a KV pool's
	// store): a CPU engine given background threads (CPU.SetBackground)
	// copies it on them, at a lowered CPU priority, so the threads with
	// deadlines keep the cores. Other engines, whose copies a GPU's copy
	// engines and multiprocessors make, ignore it.
	Background bool
}

// Span is a place in a buffer.
type Span struct {
	Buf    Buffer
	Offset int64
}

// Handle is the completion of one call.
type Handle interface {
	// Wait blocks until the call's copies are done and reports a failure
	// that happened while running it.
	Wait() error
}

// Engine is a gather engine. Its methods are safe for concurrent use; calls
// complete in the order they were made.
type Engine interface {
	// Name says which engine this is ("cpu", "cuda:0").
	Name() string
	// Register makes mem reachable by the engine's copies. mem must stay
	// mapped until Unregister; the CUDA engine page-locks it.
	Register(mem []byte) (RangeID, error)
	Unregister(RangeID) error
	// Alloc allocates an engine buffer of n bytes.
	Alloc(n int64) (Buffer, error)
	// Upload and Download copy between host memory and a buffer and wait
	// for the copy (and every call before it) to finish.
	Upload(dst Buffer, off int64, src []byte) error
	Download(dst []byte, src Buffer, off int64) error

	Gather(Rows) (Handle, error)          // tier → buffer
	Scatter(Rows) (Handle, error)         // buffer → tier
	GatherBlocks(Blocks) (Handle, error)  // tier → buffer
	ScatterBlocks(Blocks) (Handle, error) // buffer → tier

	// Sync waits for every call made so far.
	Sync() error
	// Close waits for pending calls, unregisters every range and frees the
	// engine's own resources. Buffers must be freed before.
	Close() error
}

// Baseline is implemented by the engines for benchmarks: the plain ways of
// moving the same bytes that the fused calls are measured against.
type Baseline interface {
	// CopyEach copies r's rows tier → buffer with one copy call per row
	// (cuMemcpyHtoDAsync per row on CUDA), then waits.
	CopyEach(r Rows) error
	// BulkCopy copies n contiguous bytes at src in registered memory to dst
	// in one copy call, then waits.
	BulkCopy(dst Buffer, dstOff int64, src Addr, n int64) error
}

// RegisterAll registers n ranges, range i being mem(i) (a tier's devices,
// in order), and returns their ids. If one fails, those registered before
// it are unregistered again and the error names the failing index.
func RegisterAll(e Engine, n int, mem func(i int) []byte) ([]RangeID, error) {
	ids := make([]RangeID, 0, n)
	for i := range n {
		id, err := e.Register(mem(i))
		if err != nil {
			UnregisterAll(e, ids)
			return nil, fmt.Errorf("register tier device %d: %w", i, err)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// UnregisterAll unregisters ids and returns the first error.
func UnregisterAll(e Engine, ids []RangeID) error {
	var first error
	for _, id := range ids {
		if err := e.Unregister(id); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// AsBytes views a slice of fixed-size integers as its bytes, for Upload
// and Download: the engines and kernels read them as the machine stores
// them (little endian). The view aliases s and must not outlive it.
func AsBytes[T int32 | uint32 | int64 | uint64 | Addr](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// Int32s views the first n little-endian int32s of b, a CPU engine buffer's
// bytes (8-byte aligned; callers' offsets are multiples of 4), as the
// kernels' Go twins read them. The view aliases b.
func Int32s(b []byte, n int) []int32 {
	if n == 0 {
		return nil
	}
	_ = b[4*n-1] // bounds: n int32s must lie in b
	return unsafe.Slice((*int32)(unsafe.Pointer(&b[0])), n)
}

// Planner says who decides a call's rows for the packages whose engines
// can plan them (topk and engram, through the launch API): the host, or
// the engine where its inputs are. Each package says what PlanAuto picks.
type Planner int

const (
	PlanAuto Planner = iota
	PlanHost
	PlanEngine
)

func (p Planner) String() string {
	switch p {
	case PlanAuto:
		return "auto"
	case PlanHost:
		return "host"
	case PlanEngine:
		return "engine"
	}
	return fmt.Sprintf("Planner(%d)", int(p))
}

// ParsePlanner reads "auto", "host" or "engine".
func ParsePlanner(s string) (Planner, error) {
	for _, p := range []Planner{PlanAuto, PlanHost, PlanEngine} {
		if s == p.String() {
			return p, nil
		}
	}
	return 0, fmt.Errorf("%w: planner %q (want auto, host or engine)", ErrBadRequest, s)
}
