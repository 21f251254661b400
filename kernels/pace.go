package kernels

import "sync"

// Pacing a device engine (the CUDA engine, and the interpreter that
// stands in for one). A GPU's copy engines and its block scheduler serve
// work in the order it was queued, whatever the stream's priority: a
// block call queued as one kernel over a request's 0.8 GB holds the link
// for its whole length, and an Engram row gather queued behind it on the
// same stream (or waiting for its multiprocessors on another) misses its
// layer. So a paced device engine queues a block call as kernels over
// whole pages of about a piece each, asks its pacer before each, and keeps
// at most pieceDepth of them queued: a deadline transfer then waits for
// at most that many pieces, and the pieces are where the arbiter's turns
// fall.

// Paced is implemented by the engines whose block calls can be paced: the
// CPU engine, the CUDA engine and the interpreter engine.
type Paced interface {
	// SetPacer paces the block calls submitted from now on in pieces of
	// about piece bytes (0: the engine's default); nil stops pacing.
	SetPacer(p Pacer, piece int64)
}

// DevicePiece is the piece a device engine's block calls move in when
// SetPacer is given 0: about 20 µs of a PCIe 5 link's 50 GB/s, so two
// queued pieces stay under an Engram layer's 56 µs. Not yet sized on a
// GPU: a piece costs a kernel launch and a wait, which a smaller piece
// pays more often.
const DevicePiece = 1 << 20

// pieceDepth is how many pieces of one paced call a device engine keeps
// queued: two, so the link does not idle between a piece and the next.
const pieceDepth = 2

// pacing is a device engine's pacer and piece, read by each block call.
// It has a lock of its own: the engine's is held inside Run, and a pacer's
// Turn may wait.
type pacing struct {
	mu    sync.Mutex
	p     Pacer
	piece int64
}

func (pc *pacing) set(p Pacer, piece int64) {
	if piece <= 0 {
		piece = DevicePiece
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.p, pc.piece = p, piece
}

func (pc *pacing) get() (Pacer, int64) {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	return pc.p, pc.piece
}

// runBlocksPaced is runBlocks in pieces of whole pages of about piece
// bytes (a page larger than a piece is a piece of its own), each queued
// after its pacer's Turn and once the piece pieceDepth before it is done.
// Each page's checksum word is in one piece only, and the pieces' Runs
// are queued in order, so the checksums come out as one call's. It
// returns once the last piece is queued; its Handle waits for them all.
// The whole call is checked before any piece is queued, so a bad request
// moves nothing; each piece is checked again inside its Run.
func runBlocksPaced(e Launcher, pc *pacing, ranges *rangeTable, fns blockKernels, b *Blocks, chunks []uint64, toTier uint64, shifts *shiftCache) (Handle, error) {
	p, piece := pc.get()
	if p == nil {
		return runBlocks(e, ranges, fns, b, chunks, toTier, shifts)
	}
	if b.Pacer != nil {
		p = b.Pacer
	}
	if err := ranges.checkBlocks(b); err != nil {
		return nil, err
	}
	n := len(b.Tier)
	pageBytes := int64(len(b.Chunks)) * b.ChunkBytes
	per := int(max(1, min(int64(n), piece/pageBytes)))
	var queued pieceHandles
	for lo := 0; lo < n; lo += per {
		hi := min(n, lo+per)
		if len(queued) >= pieceDepth {
			if err := queued[len(queued)-pieceDepth].Wait(); err != nil {
				queued.Wait()
				return nil, err
			}
		}
		p.Turn(int64(hi-lo) * pageBytes)
		part := b.pages(lo, hi)
		h, err := runBlocks(e, ranges, fns, &part, chunks, toTier, shifts)
		if err != nil {
			queued.Wait()
			return nil, err
		}
		queued = append(queued, h)
	}
	if len(queued) == 0 {
		return doneHandle(), nil
	}
	return queued, nil
}

// pages is the call on blocks lo to hi only.
func (b *Blocks) pages(lo, hi int) Blocks {
	part := *b
	part.Tier, part.Pages = b.Tier[lo:hi], b.Pages[lo:hi]
	if b.CRCs != nil {
		part.CRCs = b.CRCs[lo:hi]
	}
	return part
}

// pieceHandles is a paced call's Handle: its pieces', waited in order.
// Waiting for a piece again is allowed (a device engine's Handle only
// syncs and runs the thens not yet run), so a call that failed waits for
// the pieces it queued before it reports.
type pieceHandles []Handle

// Wait implements Handle: every piece is waited for, and the first
// failure is reported.
func (hs pieceHandles) Wait() error {
	var first error
	for _, h := range hs {
		if err := h.Wait(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
