package ptxsim

import "fmt"

// The race check finds shared-memory accesses that no barrier orders: two
// threads touching one byte between the same bar.sync releases (for lanes
// of one warp, the same warp collectives too), at least one a plain write,
// or an atomic write and a plain one. A block's shadow keeps the last
// writer and the last reader of each byte, so the check can miss a race
// with an earlier reader; what it reports is always a real one.

// cell is the shadow of one byte of shared memory: who last wrote and
// read it, when, and where. Thread ids are stored plus one (0: nobody).
type cell struct {
	wTid, rTid       int32
	wEpoch, rEpoch   uint32
	wWarpEp, rWarpEp uint32
	wLine, rLine     int32
	wAtomic          bool
}

// noteAccess records an access by t of size bytes at offset off of the
// block's shared memory and reports a race with an earlier one.
func noteAccess(bk *block, t *thread, in *inst, off uint64, size int, write, atomic bool) error {
	w := t.tid / 32
	for b := off; b < off+uint64(size); b++ {
		c := &bk.shadow[b]
		// An atomic write may meet a plain read or another atomic: an
		// aligned word is read whole, which lock-free code relies on.
		if c.wTid != 0 && (!c.wAtomic || (write && !atomic)) && concurrent(bk, t, c.wTid-1, c.wEpoch, c.wWarpEp) {
			return raceFault(bk, t, in, c.wTid-1, int(c.wLine), "written", off)
		}
		if write && !atomic && c.rTid != 0 && concurrent(bk, t, c.rTid-1, c.rEpoch, c.rWarpEp) {
			return raceFault(bk, t, in, c.rTid-1, int(c.rLine), "read", off)
		}
		if write {
			c.wTid, c.wEpoch, c.wWarpEp, c.wLine, c.wAtomic = t.tid+1, bk.epoch, bk.warpEpoch[w], int32(in.line), atomic
		} else {
			c.rTid, c.rEpoch, c.rWarpEp, c.rLine = t.tid+1, bk.epoch, bk.warpEpoch[w], int32(in.line)
		}
	}
	return nil
}

// concurrent reports whether an access by thread other at (epoch,
// warpEp) is unordered with one by t now.
func concurrent(bk *block, t *thread, other int32, epoch, warpEp uint32) bool {
	if other == t.tid || epoch != bk.epoch {
		return false
	}
	return other/32 != t.tid/32 || warpEp == bk.warpEpoch[t.tid/32]
}

func raceFault(bk *block, t *thread, in *inst, other int32, line int, what string, off uint64) error {
	return &Fault{Line: in.line, Inst: in.text, Block: bk.id, Thread: int(t.tid), Kind: ErrRace,
		Reason: fmt.Sprintf("shared byte %#x was %s by thread %d at line %d with no barrier between", off, what, other, line)}
}

func (m *machine) noteShared(bk *block, t *thread, in *inst, off uint64, size int, write, atomic bool) error {
	err := noteAccess(bk, t, in, off, size, write, atomic)
	if f, ok := err.(*Fault); ok {
		f.Kernel = m.k.Name
	}
	return err
}
