package rooms

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
)

// Claim takes the room of (room, rank) for a decode's request: a room of
// that name still in the table (an earlier request on a reused room) is
// claimed anew, so that its records are no longer read (its handles read
// ErrGone); otherwise the first free slot from the room's home. With no
// free slot, rooms whose decode is gone (or whose sides both ended) are
// freed first; if none is, ErrFull.
func (t *Table) Claim(room uint64, rank uint32) (Room, error) {
	if err := t.c.Err(); err != nil {
		return Room{}, err
	}
	if err := t.c.Lock(t.lock); err != nil {
		return Room{}, fmt.Errorf("rooms: table %q: %w", t.name, err)
	}
	defer t.c.Unlock(t.lock)
	for attempt := 0; attempt < 2; attempt++ {
		i, err := t.placeLocked(room, rank)
		if err != nil {
			return Room{}, err
		}
		if i >= 0 {
			if err := t.refuseInFlightLocked(i, room, rank); err != nil {
				return Room{}, err
			}
			return t.claimLocked(i, room, rank)
		}
		if freed, err := t.reclaimLocked(); err != nil || freed == 0 {
			if err == nil {
				err = fmt.Errorf("%w: table %q: all %d rooms in flight", ErrFull, t.name, t.slots)
			}
			return Room{}, err
		}
	}
	return Room{}, fmt.Errorf("%w: table %q: all %d rooms in flight", ErrFull, t.name, t.slots)
}

// refuseInFlightLocked says ErrInFlight when slot i holds a claim of
// (room, rank) whose decode may still run and has not ended: a second
// decode for a request in flight (two requests given one bootstrap room).
// Claimed anew, the first request would fail and the second wait out its
// timeout for a prefill that serves the first; refused, the second fails
// at once saying so. A claim whose decode ended or is gone is taken anew.
func (t *Table) refuseInFlightLocked(i int, room uint64, rank uint32) error {
	id, ok, err := t.readIdentity(i)
	if err != nil || !ok || id.room != room || id.rank != rank || !t.r.TokenRuns(id.token) {
		return err
	}
	d, err := t.readArea(Room{Slot: i, Gen: gen(id.state)}, Decode)
	if err != nil || d.has(endRecord) {
		return nil // an area it cannot read is no reason to refuse a new request
	}
	return fmt.Errorf("%w: table %q: room %d rank %d is claimed by a decode that runs and has not ended (is another request in flight with this bootstrap room?)",
		ErrInFlight, t.name, room, rank)
}

// placeLocked is the slot a claim of (room, rank) takes: the room's own
// when it is in the table, else the first free one on its probe path; -1
// when every slot is claimed.
func (t *Table) placeLocked(room uint64, rank uint32) (int, error) {
	start, free := t.home(room, rank), -1
	for k := 0; k < t.slots; k++ {
		i := (start + k) % t.slots
		id, ok, err := t.readIdentity(i)
		if err != nil {
			return -1, err
		}
		if ok && id.room == room && id.rank == rank {
			return i, nil
		}
		if id.state&claimed == 0 && free < 0 {
			free = i
		}
		if id.state == 0 {
			break // never claimed: the room is not past it
		}
	}
	return free, nil
}

// claimLocked writes slot i's state (a new generation, claimed), then its
// identity, then ready: readers take the identity only once ready says
// this generation's.
func (t *Table) claimLocked(i int, room uint64, rank uint32) (Room, error) {
	off := t.slotOff(i)
	b, err := t.mem(off, line)
	if err != nil {
		return Room{}, err
	}
	if err := t.refresh(off, line); err != nil {
		return Room{}, err
	}
	g := gen(atomic.LoadUint64(stateWord(b))) + 1
	if g == 0 {
		g = 1 // a wrapped generation never reads as a never-claimed slot
	}
	atomic.StoreUint64(stateWord(b), uint64(g)<<32|claimed)
	binary.LittleEndian.PutUint64(b[8:], room)
	binary.LittleEndian.PutUint32(b[16:], rank)
	binary.LittleEndian.PutUint64(b[24:], t.c.Token())
	binary.LittleEndian.PutUint32(b[60:], identityCRC(b))
	atomic.StoreUint32(readyWord(b), g)
	if err := t.publish(off, line); err != nil {
		return Room{}, err
	}
	return Room{Slot: i, Gen: g}, nil
}

// Release frees a room at once, whatever its sides say (End frees it
// once both ended). A room already gone is ErrGone.
func (t *Table) Release(rm Room) error {
	if err := t.check(rm); err != nil {
		return err
	}
	if err := t.c.Lock(t.lock); err != nil {
		return fmt.Errorf("rooms: table %q: %w", t.name, err)
	}
	defer t.c.Unlock(t.lock)
	return t.freeLocked(rm)
}

func (t *Table) freeLocked(rm Room) error {
	b, err := t.claimLine(rm)
	if err != nil {
		return err
	}
	atomic.StoreUint32(readyWord(b), 0)
	atomic.StoreUint64(stateWord(b), uint64(rm.Gen)<<32)
	return t.publish(t.slotOff(rm.Slot), line)
}

// End records that side is done with the room (whatever the outcome:
// it reads and writes nothing more there); the second side to end frees
// it. It reports whether this call freed the room. Each side publishes
// its end before it reads the other's, so of two sides ending at once at
// least one sees both, and a second free is ErrGone, not an error here.
func (t *Table) End(rm Room, side Side) (bool, error) {
	if err := t.Put(rm, side, endRecord, []byte{}); err != nil {
		return false, err
	}
	other, err := t.readArea(rm, 1-side)
	if err != nil || !other.has(endRecord) {
		return false, err
	}
	err = t.Release(rm)
	if errors.Is(err, ErrGone) {
		return false, nil // the other side freed it first
	}
	return err == nil, err
}

// endRecord is the record a side writes when it is done with a room.
const endRecord = "end"

// Reclaim frees the rooms no live process will end: their decode is gone,
// or the decode ended and the prefill is gone, never came, or ended too.
// Claim calls it when the table is full; it returns how many it freed.
// The tokens are the tier's word: they only free table slots.
func (t *Table) Reclaim() (int, error) {
	if err := t.c.Lock(t.lock); err != nil {
		return 0, fmt.Errorf("rooms: table %q: %w", t.name, err)
	}
	defer t.c.Unlock(t.lock)
	return t.reclaimLocked()
}

func (t *Table) reclaimLocked() (int, error) {
	freed := 0
	for i := 0; i < t.slots; i++ {
		id, ok, err := t.readIdentity(i)
		if err != nil {
			return freed, err
		}
		if !ok {
			continue
		}
		rm := Room{Slot: i, Gen: gen(id.state)}
		if !t.abandoned(rm, id) {
			continue
		}
		if err := t.freeLocked(rm); err != nil {
			return freed, err
		}
		freed++
	}
	return freed, nil
}

// abandoned reports whether no live process will free the room. A room
// whose areas cannot be read is left alone (Reclaim frees rooms, never
// damage it cannot name) unless the damage is a side's writer dying
// mid-write: that side will not end the room.
func (t *Table) abandoned(rm Room, id identity) bool {
	if !t.r.TokenRuns(id.token) {
		return true
	}
	d, err := t.readArea(rm, Decode)
	if errors.Is(err, ErrWriterGone) {
		return true
	}
	if err != nil || !d.has(endRecord) {
		return false
	}
	p, err := t.readArea(rm, Prefill)
	if errors.Is(err, ErrWriterGone) {
		return true
	}
	return err == nil && (p.token == 0 || p.has(endRecord) || !t.r.TokenRuns(p.token))
}

// InFlight counts the claimed rooms (a snapshot).
func (t *Table) InFlight() (int, error) {
	n := 0
	for i := 0; i < t.slots; i++ {
		_, ok, err := t.readIdentity(i)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// check says ErrGone unless rm is still its slot's claim.
func (t *Table) check(rm Room) error {
	if err := t.c.Err(); err != nil {
		return err
	}
	_, err := t.claimLine(rm)
	return err
}

// claimLine is rm's slot's line 0, refreshed; ErrGone unless the slot is
// still rm's claim.
func (t *Table) claimLine(rm Room) ([]byte, error) {
	if rm.Slot < 0 || rm.Slot >= t.slots {
		return nil, fmt.Errorf("%w: table %q: slot %d not in [0,%d)", ErrGone, t.name, rm.Slot, t.slots)
	}
	off := t.slotOff(rm.Slot)
	b, err := t.mem(off, line)
	if err != nil {
		return nil, err
	}
	if err := t.refresh(off, line); err != nil {
		return nil, err
	}
	if atomic.LoadUint64(stateWord(b)) != uint64(rm.Gen)<<32|claimed {
		return nil, fmt.Errorf("%w: table %q, slot %d, generation %d", ErrGone, t.name, rm.Slot, rm.Gen)
	}
	return b, nil
}
