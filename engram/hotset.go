package engram

import (
	"fmt"
	"math/bits"

	"github.com/cxltier/cxltier/internal/prefetch"
)

// hotSet maps table rows to cache slots for one layer. It is W-way set
// associative: a row can live only in the W slots of its set, and the W
// tags of a set are one 64-byte line, so a lookup, a hit's refresh and a
// miss's choice of victim read one line of host memory. A fully
// associative map plus per-slot metadata (the first design) took two or
// three cache misses per row, and at 6,144 rows per layer and step
// (batch 256 under V4.1) that host-side bookkeeping cost more than the
// gather it saved.
//
// A tag word is (row+1)<<16 | stamp, 0 for an empty way, where stamp is
// the low 16 bits of the call (epoch) that last used the row. Within a set
// the victim is an empty way, else the least recently used way that no
// call of the last `protect` used. When every way of a set is protected,
// the row goes to a spill slot used for this call only; spill slots come
// in `protect` banks used in turn, so a call never overwrites the spill
// rows of the calls before it that may still be read.
//
// The engine planners' cache (engineStep: engram.cu and its CPU twin)
// follows the same rules in the same layout — the twin through the same
// functions, setOf and probeLine — so that a prefetcher planning on the
// engine gives every row the slot this one would.
type hotSet struct {
	tags    []uint64 // sets × ways
	sets    int
	spill   [][]int32 // banks of spill slots
	used    int       // spill slots taken in this call
	epoch   uint64
	protect uint64
}

const (
	ways         = 8 // a set's tags are one 64-byte line
	stampBits    = 16
	stampMask    = 1<<stampBits - 1
	maxCachedRow = 1<<(64-stampBits) - 2 // row+1 fits a tag's 48 bits
	setGolden    = 0x9E3779B97F4A7C15
)

// setOf is row's set among sets (a power of two).
func setOf(row int64, sets int) uint64 {
	return (uint64(row) * setGolden >> 32) & (uint64(sets) - 1)
}

// cacheSets is how many sets of `ways` a cache of slots slots has: the
// largest power of two that leaves at least an eighth of the slots for
// spill banks, 0 when not even one set fits.
func cacheSets(slots int) int {
	q := (slots - slots/8) / ways
	if q < 1 {
		return 0
	}
	return 1 << (bits.Len(uint(q)) - 1)
}

// probeLine finds row in its set's tag line at stamp now: a hit refreshes
// the way's stamp (fetch false); a miss takes the empty way, else the
// least recently used way no call of the last protect stamped (fetch
// true). way is -1 when every way is protected.
func probeLine(line []uint64, row int64, now, protect uint64) (way int, fetch bool) {
	want := uint64(row + 1)
	victim, oldest := -1, uint64(0)
	for w, tag := range line {
		if tag>>stampBits == want {
			line[w] = want<<stampBits | now
			return w, false
		}
		age := (now - tag) & stampMask
		switch {
		case tag == 0:
			age = stampMask + 1 // empty ways first
		case age < protect:
			continue // used by a call that may still be read
		}
		if age > oldest {
			victim, oldest = w, age
		}
	}
	if victim >= 0 {
		line[victim] = want<<stampBits | now
	}
	return victim, true
}

// newHotSet divides slots into a power-of-two number of sets of `ways`
// slots (slot = set*ways + way) and spill slots after them: at least an
// eighth of slots, and every slot the sets leave over.
func newHotSet(slots int, protect uint64) (*hotSet, error) {
	if slots < 1 {
		return nil, fmt.Errorf("%w: %d cache slots", ErrGeometry, slots)
	}
	sets := cacheSets(slots)
	h := &hotSet{tags: make([]uint64, sets*ways), sets: sets, protect: protect}
	spill := make([]int32, 0, slots-sets*ways)
	for s := sets * ways; s < slots; s++ {
		spill = append(spill, int32(s))
	}
	for b := range protect {
		lo, hi := len(spill)*int(b)/int(protect), len(spill)*int(b+1)/int(protect)
		h.spill = append(h.spill, spill[lo:hi])
	}
	return h, nil
}

// begin starts a call.
func (h *hotSet) begin() {
	h.epoch++
	h.used = 0
}

// lookup returns row's slot and whether the row must be fetched into it.
// ok is false when neither its set nor this call's spill bank has room.
func (h *hotSet) lookup(row int64) (slot int32, fetch, ok bool) {
	if len(h.tags) > 0 {
		if s, fetch, ok := h.inSet(row); ok {
			return s, fetch, true
		}
	}
	bank := h.spill[h.epoch%h.protect]
	if h.used == len(bank) {
		return 0, false, false
	}
	h.used++
	return bank[h.used-1], true, true
}

// setOf is row's set.
func (h *hotSet) setOf(row int64) uint64 { return setOf(row, h.sets) }

// prefetch starts loading row's tag line: a call's rows hit random lines
// of a multi-MiB table, and asking a few rows ahead overlaps their DRAM
// latencies instead of paying them one after another.
func (h *hotSet) prefetch(row int64) {
	if len(h.tags) > 0 {
		set := h.setOf(row)
		prefetch.Words(h.tags[set*ways : set*ways+ways])
	}
}

func (h *hotSet) inSet(row int64) (int32, bool, bool) {
	set := h.setOf(row)
	w, fetch := probeLine(h.tags[set*ways:set*ways+ways], row, h.epoch&stampMask, h.protect)
	if w < 0 {
		return 0, false, false
	}
	return int32(set*ways) + int32(w), fetch, true
}

// slots is the number of slots the set was made for.
func (h *hotSet) slots() int {
	n := len(h.tags)
	for _, b := range h.spill {
		n += len(b)
	}
	return n
}

// abort undoes the current call that failed: the slots it was to fetch
// into are emptied, and the call does not count as one of the `protect`
// recent calls, whose rows the model may still read.
func (h *hotSet) abort(fetched []int32) {
	for _, s := range fetched {
		h.drop(s)
	}
	h.epoch--
}

// drop empties slot's way (spill slots hold nothing across calls).
func (h *hotSet) drop(slot int32) {
	if int(slot) < len(h.tags) {
		h.tags[slot] = 0
	}
}
