package topk

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/cxltier/cxltier/kernels"
)

// engineLayout describes the slot tables of a pool kept in engine memory,
// so that an engine can plan a step without the host (topk.cu documents the
// layout word by word). Request r's tables for layer l are one region at
// (r*Layers+l)*regionBytes() of the state buffer.
type engineLayout struct {
	Slots         int   // LRU slots per request (slot Slots holds the newest token)
	TopK          int   // selections per request and step
	Layers        int   // layers per request
	MaxExtents    int   // extents a request's layer may have
	ExtentEntries int64 // entries per extent
	EntryBytes    int64 // bytes per entry, a multiple of 16
}

// check reports a layout the engine planners cannot serve.
func (l engineLayout) check() error {
	switch {
	case l.Slots < 1 || l.Slots > 1<<15-1 || l.TopK < 1 || l.TopK > l.Slots:
		return fmt.Errorf("%w: engine tables of %d slots, top-k %d", ErrBadConfig, l.Slots, l.TopK)
	case l.Layers < 1 || l.MaxExtents < 1 || l.ExtentEntries < 1:
		return fmt.Errorf("%w: engine tables of %d layers, %d extents of %d entries", ErrBadConfig, l.Layers, l.MaxExtents, l.ExtentEntries)
	case l.EntryBytes < 16 || l.EntryBytes%16 != 0:
		return fmt.Errorf("%w: engine planning needs entries of a multiple of 16 bytes, not %d", ErrBadConfig, l.EntryBytes)
	case int64(l.TopK)*(l.EntryBytes/16) >= 1<<32:
		// cxl_topk_plan counts a request's copies in 16-byte vectors in 32 bits.
		return fmt.Errorf("%w: top-k %d of %d-byte entries is too much for one engine step", ErrBadConfig, l.TopK, l.EntryBytes)
	}
	return nil
}

// extentsOffset is where the extent table starts in a region.
func (l engineLayout) extentsOffset() int64 { return (4*int64(2*l.Slots+2+l.Slots) + 7) &^ 7 }

// regionBytes is one request's tables for one layer.
func (l engineLayout) regionBytes() int64 { return l.extentsOffset() + 8*int64(l.MaxExtents) }

// initialRegion is a region as a request starts: slot s holds token s, LRU
// order is slot order, nothing is loaded, extents are given (the rest 0).
func (l engineLayout) initialRegion(extents []kernels.Addr) []byte {
	b := make([]byte, l.regionBytes())
	s := l.Slots
	for i := range s + 1 {
		tok := int32(i)
		if i == s {
			tok = -1
		}
		binary.LittleEndian.PutUint32(b[4*i:], uint32(tok))
		binary.LittleEndian.PutUint32(b[4*(s+1+i):], ^uint32(0))
	}
	for i := range s {
		binary.LittleEndian.PutUint32(b[4*(2*s+2+i):], uint32(i))
	}
	for i, a := range extents {
		binary.LittleEndian.PutUint64(b[l.extentsOffset()+8*int64(i):], uint64(a))
	}
	return b
}

// hashBits sizes the planners' table of selected tokens: at most half full.
func (l engineLayout) hashBits() uint { return uint(bits.Len(uint(2*l.TopK - 1))) }

// sharedBytes is the shared memory one block of cxl_topk_plan needs.
func (l engineLayout) sharedBytes() int {
	return 8<<l.hashBits() + 4*(33+8) + 2<<l.hashBits() + 8*l.Slots + 2*l.TopK + 2*l.Slots + l.Slots
}

// engineStep is one decode step of one layer for a batch, as an engine
// plans it: request reqs[b] of length lens[b] selected
// sel[b*TopK:(b+1)*TopK] (int32 token positions, -1 padded, in engine
// memory); the planner writes each selection's slot to out (same shape),
// updates the tables in state and copies what the slots lack from the tier
// into data (request r's slot s is row r*(Slots+1)+s). The pool has
// checked requests and lengths; selections it checked only when checked.
type engineStep struct {
	layout   engineLayout
	layer    int
	state    kernels.Buffer
	data     kernels.Buffer
	reqs     []int32
	lens     []int32
	sel, out kernels.Span
	checked  bool
}

// stepCounts is what an engine step did, summed over the batch.
type engineCounts struct {
	hits, misses, fills, newest int
}

func (c engineCounts) copies() int { return c.misses + c.fills + c.newest }

// badSelection is a step's first selection outside [-1, length): batch row
// row, index index, value pos. Nothing was changed.
type badSelection struct {
	row, index int
	pos, len   int32
}

func (e *badSelection) Error() string {
	return fmt.Sprintf("topk: batch row %d: selection %d is position %d, length %d", e.row, e.index, e.pos, e.len)
}

func (e *badSelection) Unwrap() error { return ErrBadPosition }

// checkShapes validates a step's shapes against its buffers' sizes, so
// that no planner reads or writes outside them.
func (s *engineStep) checkShapes() error {
	l := s.layout
	n := int64(len(s.reqs)) * int64(l.TopK) * 4
	switch {
	case len(s.lens) != len(s.reqs):
		return fmt.Errorf("%w: %d requests, %d lengths", ErrBadInput, len(s.reqs), len(s.lens))
	case s.layer < 0 || s.layer >= l.Layers:
		return fmt.Errorf("%w: layer %d of %d", ErrBadInput, s.layer, l.Layers)
	case s.state == nil || s.data == nil || s.sel.Buf == nil || s.out.Buf == nil:
		return fmt.Errorf("%w: engine step without its buffers", ErrBadInput)
	case s.sel.Offset < 0 || s.sel.Offset%4 != 0 || s.sel.Offset > s.sel.Buf.Len()-n ||
		s.out.Offset < 0 || s.out.Offset%4 != 0 || s.out.Offset > s.out.Buf.Len()-n:
		return fmt.Errorf("%w: %d bytes of selections or outputs beyond their buffers (or misaligned)", ErrBadInput, n)
	}
	rows := s.data.Len() / (l.EntryBytes * int64(l.Slots+1))
	regions := s.state.Len() / l.regionBytes() / int64(l.Layers)
	for b, r := range s.reqs {
		if r < 0 || int64(r) >= rows || int64(r) >= regions {
			return fmt.Errorf("%w: request %d beyond the buffers (%d rows, %d regions)", ErrBadInput, r, rows, regions)
		}
		if s.lens[b] < 1 || int64(s.lens[b]) > int64(l.MaxExtents)*l.ExtentEntries {
			return fmt.Errorf("%w: request %d length %d", ErrBadInput, r, s.lens[b])
		}
	}
	return nil
}

// stepper plans engine steps: the kernels of topk.cu on an engine that
// launches them (kernelStepper), or their Go twin on the CPU engine
// (twinStepper). The pool picks one at construction.
type stepper interface {
	// fits reports, before any step, a layout the stepper cannot plan
	// (on a GPU: one that needs more shared memory per block than it has).
	fits(engineLayout) error
	// plan runs a step and returns when its copies are done.
	plan(*engineStep) (engineCounts, error)
	// close frees the stepper's own engine resources.
	close() error
}

// newStepper is the engine's stepper, or false when the engine can
// plan no top-k step: it neither runs kernels nor is the CPU engine.
func newStepper(eng kernels.Engine) (stepper, bool) {
	switch e := eng.(type) {
	case *kernels.CPU:
		return &twinStepper{e: e}, true
	case kernels.Launcher:
		return &kernelStepper{e: e}, true
	}
	return nil, false
}
