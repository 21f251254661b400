package prefix

import (
	"fmt"
	"sync/atomic"

	"github.com/cxltier/cxltier/tier"
)

// Pin tables. Every client lease slot has one in the metadata run: a
// header line (the holder's lease token and the high-water mark of records
// used), from version 3 a line of the holder's counters, and Pins records
// of one word each. Only the slot's holder writes its table, so claiming a
// record needs no lock: the goroutines of the holding process take a
// record by a compare-and-swap of its word from zero to the pin, and give
// it back by storing zero. Evictors scan records below the high-water
// mark, which a claim raises before it writes the record beyond it.
const (
	pinHdrToken     = 0        // u64 lease token of the holder (0: none)
	pinHdrHighWater = 8        // u32 records in use or used before: evictors scan this many
	pinCounters     = lineSize // version 3: the holder's counters, in counter order
)

// claimPins takes this client's pin table: clear the records a previous
// holder of the lease slot left, then write our token so evictors scan it.
// The counters carry on from the previous holder: they are the index's.
func (s *Store) claimPins() error {
	slot := s.r.TokenSlot(s.c.Token())
	if slot < 0 || int64(slot) >= s.g.Clients {
		return fmt.Errorf("%w: client token %#x", ErrBadIndex, s.c.Token())
	}
	off := s.g.PinsOff + int64(slot)*s.g.PinStride
	s.slot = slot
	s.myPins = s.metaSlice(off, pinHeaderSize)
	if s.one != nil {
		start := int64(s.meta) + off + s.g.pinHeader()
		s.myRecs = s.one[start : start+s.g.Pins*pinRecordSize : start+s.g.Pins*pinRecordSize]
	}
	if s.perClient {
		s.myCounters = s.metaSlice(off+pinCounters, lineSize)
	}
	if atomic.LoadUint64(u64At(s.myPins, pinHdrToken)) == s.c.Token() {
		return ErrOpen
	}
	atomic.StoreUint64(u64At(s.myPins, pinHdrToken), 0)
	for j := int64(0); j < s.g.Pins; j++ {
		atomic.StoreUint64(s.pinRecord(slot, j), 0)
	}
	atomic.StoreUint32(u32At(s.myPins, pinHdrHighWater), 0)
	// The cleared records first: evictors on other hosts must not read a
	// previous holder's pins as ours once our token is up.
	s.publishMeta(off+s.g.pinHeader(), s.g.Pins*pinRecordSize)
	atomic.StoreUint64(u64At(s.myPins, pinHdrToken), s.c.Token())
	s.publishMeta(off, pinHeaderSize)
	return nil
}

// Close gives up this client's pin table. Pins still held are dropped.
//
// The index is registered with its client when opened, so that closing the
// client closes it; closing it first unregisters it.
func (s *Store) Close() error {
	if s.unregister != nil && !s.unregister() && s.pinsClosed.Load() {
		return nil // closed with its client already
	}
	return s.closePins()
}

func (s *Store) closePins() error {
	h, err := s.holdToRelease("close")
	if err != nil {
		s.pinsClosed.Store(true)
		return err
	}
	defer h.Done()
	if s.pinsClosed.CompareAndSwap(false, true) {
		atomic.StoreUint64(u64At(s.myPins, pinHdrToken), 0)
		s.publishMeta(s.g.PinsOff+int64(s.slot)*s.g.PinStride, pinHeaderSize)
	}
	return nil
}

// pinValue is the record of a pin on entry i in state w: an evictor that
// marked the entry looks for exactly this value.
func pinValue(i uint32, w uint64) uint64 { return uint64(i+1)<<32 | uint64(uint32(wordGen(w))) }

// pin records that this client reads entry i in state w, then checks that
// the entry still is in that state. An evictor marks the entry before it
// scans pin tables, so either it sees our record or we see its mark (both
// sides use sequentially consistent atomics; model/pin.pml checks the
// handshake on non-coherent memory). It returns -1 if the entry changed.
func (s *Store) pin(i uint32, w uint64) (int32, error) {
	j, err := s.claimPin(pinValue(i, w))
	if err != nil {
		return -1, err
	}
	s.publishPin(j)
	if atomic.LoadUint64(u64At(s.readEntry(i), entWord)) != w {
		s.unpin(j)
		return -1, nil
	}
	return j, nil
}

// claimPin writes v into a free record of this client's table and returns
// its index. It looks from the hint (records at and after it were free
// lately) to the high-water mark, then raises the mark, and looks below
// the hint only when the table is used to its end: records below the hint
// were held when it passed them, so a batch that pins thousands of entries
// would rescan them for every claim. ErrPinsFull when every record is held.
func (s *Store) claimPin(v uint64) (int32, error) {
	if s.pinsClosed.Load() {
		return -1, fmt.Errorf("prefix: %q: %w", s.name, tier.ErrClosed)
	}
	hw := s.pinHighWater()
	start := min(s.pinHint.Load(), hw)
	if j := s.claimIn(start, hw, v); j >= 0 {
		return j, nil
	}
	hwWord := u32At(s.myPins, pinHdrHighWater)
	for {
		hw := atomic.LoadUint32(hwWord)
		if int64(hw) >= s.g.Pins {
			if j := s.claimIn(0, min(start, int32(s.g.Pins)), v); j >= 0 {
				return j, nil
			}
			return -1, fmt.Errorf("%w: %d pins held", ErrPinsFull, s.g.Pins)
		}
		// The mark rises before the record is written beyond it: an evictor
		// that reads the old mark cannot miss a pin we then re-check against.
		if !atomic.CompareAndSwapUint32(hwWord, hw, hw+1) {
			continue
		}
		s.publishMeta(s.g.PinsOff+int64(s.slot)*s.g.PinStride, pinHeaderSize)
		if atomic.CompareAndSwapUint64(s.myPin(int32(hw)), 0, v) {
			s.pinHint.Store(int32(hw) + 1)
			return int32(hw), nil
		}
	}
}

// claimIn claims the first free record in [lo, hi), or returns -1.
func (s *Store) claimIn(lo, hi int32, v uint64) int32 {
	for j := lo; j < hi; j++ {
		if rec := s.myPin(j); atomic.LoadUint64(rec) == 0 && atomic.CompareAndSwapUint64(rec, 0, v) {
			s.pinHint.Store(j + 1)
			return j
		}
	}
	return -1
}

// pinHighWater is this client's high-water mark, bounded by the table: the
// word is in shared memory, so it is not trusted beyond that.
func (s *Store) pinHighWater() int32 {
	return int32(min(int64(atomic.LoadUint32(u32At(s.myPins, pinHdrHighWater))), s.g.Pins))
}

func (s *Store) unpin(j int32) {
	atomic.StoreUint64(s.myPin(j), 0)
	s.publishPin(j)
	if j < s.pinHint.Load() {
		s.pinHint.Store(j) // a hint: a racing claim may move it, and claims scan on
	}
}

func (s *Store) pinRecord(slot int, j int64) *uint64 {
	off := s.g.PinsOff + int64(slot)*s.g.PinStride + s.g.pinHeader() + j*pinRecordSize
	if s.one != nil {
		return u64At(s.one, int(int64(s.meta)+off))
	}
	return u64At(s.metaSlice(off&^(lineSize-1), lineSize), int(off%lineSize))
}

// myPin is record j of this client's table (j < Pins).
func (s *Store) myPin(j int32) *uint64 {
	if s.myRecs != nil {
		return u64At(s.myRecs, int(j)*pinRecordSize)
	}
	return s.pinRecord(s.slot, int64(j))
}

func (s *Store) publishPin(j int32) {
	if s.shared {
		off := s.g.PinsOff + int64(s.slot)*s.g.PinStride + s.g.pinHeader() + int64(j)*pinRecordSize
		s.publishMeta(off, pinRecordSize)
	}
}

// count adds n to counter ctr: on a version-3 index in this client's own
// counter line (one writer a line: processes never take it from each
// other), before that in the index header.
func (s *Store) count(ctr int, n uint64) {
	if n == 0 {
		return
	}
	if s.perClient {
		atomic.AddUint64(u64At(s.myCounters, 8*ctr), n)
		s.publishMeta(s.g.PinsOff+int64(s.slot)*s.g.PinStride+pinCounters, lineSize)
		return
	}
	atomic.AddUint64(u64At(s.hdr, hdrCounters+8*ctr), n)
}

// counters sums the index's counters: the header's, plus every pin-table
// header's on a version-3 index (live holders or not: the counts stay).
func (s *Store) counters() [numCounters]uint64 {
	var out [numCounters]uint64
	for c := range out {
		out[c] = atomic.LoadUint64(u64At(s.hdr, hdrCounters+8*c))
	}
	if !s.perClient {
		return out
	}
	for slot := int64(0); slot < s.g.Clients; slot++ {
		off := s.g.PinsOff + slot*s.g.PinStride + pinCounters
		s.refreshMeta(off, lineSize)
		h := s.metaSlice(off, lineSize)
		for c := range out {
			out[c] += atomic.LoadUint64(u64At(h, 8*c))
		}
	}
	return out
}
