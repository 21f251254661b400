package main

// #include <stdint.h>
import "C"

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/cxltier/cxltier/prefix/rooms"
)

// Rooms (prefix/rooms) for callers outside Go: the rendezvous of a
// prefill and a decode. A room is named to C by its slot and generation;
// a side is 0 (decode) or 1 (prefill); a record's data of length -1
// deletes it.

type roomTable struct {
	child
	*rooms.Table
}

func roomsOf(h C.uint64_t) (*roomTable, func(), error) {
	t, done, err := use[*roomTable](uint64(h))
	if err != nil {
		return nil, nil, err
	}
	return t, done.Done, nil
}

// cxl_rooms_open opens (slots > 0: creates when missing) the rooms table
// name; key, when not NULL, is the tenant key both sides of its rooms
// share: records are signed with it, and a room's records it did not sign
// are refused (CXL_ECHECKSUM).
//
//export cxl_rooms_open
func cxl_rooms_open(h C.uint64_t, name, key *C.char, slots, slotBytes C.int64_t, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_rooms_open", errbuf, errlen, &code)
	err := func() error {
		if out == nil || name == nil {
			return fmt.Errorf("rooms open: %w: no name or output handle", errBadArg)
		}
		if slots < 0 || slots > math.MaxInt32 || slotBytes < 0 || slotBytes > math.MaxInt32 {
			return fmt.Errorf("rooms open: %w: %d slots of %d bytes", errBadArg, int64(slots), int64(slotBytes))
		}
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		cfg := rooms.Config{Name: C.GoString(name), Slots: int(slots), SlotBytes: int(slotBytes)}
		if key != nil {
			cfg.Key = C.GoString(key)
		}
		t, err := rooms.Open(a.c, cfg)
		if err != nil {
			return err
		}
		rt := &roomTable{Table: t, child: child{tier: uint64(h), close: func() error { return nil }}}
		*out = C.uint64_t(handles.addChild(a, rt, rt.child))
		return nil
	}()
	return report(err, errbuf, errlen)
}

//export cxl_rooms_close
func cxl_rooms_close(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_rooms_close", errbuf, errlen, &code)
	t, done, err := roomsOf(h)
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done()
	return report(handles.closeChild(uint64(h), t.child), errbuf, errlen)
}

// cxl_rooms_claim claims the room of (room, rank) for a decode (anew when
// it is in the table: the earlier claim's handles read CXL_ENOTFOUND). A
// full table is CXL_ENOSPC.
//
//export cxl_rooms_claim
func cxl_rooms_claim(h C.uint64_t, room C.uint64_t, rank C.uint32_t, slot *C.int64_t, gen *C.uint32_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_rooms_claim", errbuf, errlen, &code)
	err := func() error {
		if slot == nil || gen == nil {
			return fmt.Errorf("rooms claim: %w: no output", errBadArg)
		}
		t, done, err := roomsOf(h)
		if err != nil {
			return err
		}
		defer done()
		rm, err := t.Claim(uint64(room), uint32(rank))
		*slot, *gen = C.int64_t(rm.Slot), C.uint32_t(rm.Gen)
		return err
	}()
	return report(err, errbuf, errlen)
}

// cxl_rooms_find writes the room of (room, rank) and *found = 1, or
// *found = 0 when no decode claimed it.
//
//export cxl_rooms_find
func cxl_rooms_find(h C.uint64_t, room C.uint64_t, rank C.uint32_t, slot *C.int64_t, gen *C.uint32_t, found *C.int8_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_rooms_find", errbuf, errlen, &code)
	err := func() error {
		if slot == nil || gen == nil || found == nil {
			return fmt.Errorf("rooms find: %w: no output", errBadArg)
		}
		t, done, err := roomsOf(h)
		if err != nil {
			return err
		}
		defer done()
		rm, ok, err := t.Find(uint64(room), uint32(rank))
		*slot, *gen, *found = C.int64_t(rm.Slot), C.uint32_t(rm.Gen), 0
		if ok {
			*found = 1
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

func roomArg(slot C.int64_t, gen C.uint32_t, side C.int) (rooms.Room, rooms.Side, error) {
	if slot < 0 || slot > math.MaxInt32 || (side != 0 && side != 1) {
		return rooms.Room{}, 0, fmt.Errorf("%w: slot %d, side %d", errBadArg, int64(slot), int(side))
	}
	return rooms.Room{Slot: int(slot), Gen: uint32(gen)}, rooms.Side(side), nil
}

// cxl_rooms_put sets record kind of side's records in a room to n bytes at
// data (n = -1: deletes it).
//
//export cxl_rooms_put
func cxl_rooms_put(h C.uint64_t, slot C.int64_t, gen C.uint32_t, side C.int, kind *C.char, data unsafe.Pointer, n C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_rooms_put", errbuf, errlen, &code)
	err := func() error {
		rm, s, err := roomArg(slot, gen, side)
		if err != nil || kind == nil || n < -1 || n > math.MaxInt32 || (n > 0 && data == nil) {
			return fmt.Errorf("rooms put: %w: kind, %d bytes (%v)", errBadArg, int64(n), err)
		}
		t, done, err := roomsOf(h)
		if err != nil {
			return err
		}
		defer done()
		var rec []byte // nil: delete
		if n >= 0 {
			rec = make([]byte, int(n))
			if n > 0 {
				copy(rec, unsafe.Slice((*byte)(data), int(n)))
			}
		}
		return t.Put(rm, s, C.GoString(kind), rec)
	}()
	return report(err, errbuf, errlen)
}

// cxl_rooms_get copies record kind of side's records into the bufCap bytes
// at buf: *n its length and *found whether the side wrote it. A record
// longer than bufCap is CXL_ERANGE with *n its length.
//
//export cxl_rooms_get
func cxl_rooms_get(h C.uint64_t, slot C.int64_t, gen C.uint32_t, side C.int, kind *C.char, buf unsafe.Pointer, bufCap C.int64_t, n *C.int64_t, found *C.int8_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_rooms_get", errbuf, errlen, &code)
	err := func() error {
		rm, s, err := roomArg(slot, gen, side)
		if err != nil || kind == nil || n == nil || found == nil || bufCap < 0 || bufCap > math.MaxInt32 || (bufCap > 0 && buf == nil) {
			return fmt.Errorf("rooms get: %w: kind, outputs, a buffer of %d bytes (%v)", errBadArg, int64(bufCap), err)
		}
		t, done, err := roomsOf(h)
		if err != nil {
			return err
		}
		defer done()
		var b []byte
		if bufCap > 0 {
			b = unsafe.Slice((*byte)(buf), int(bufCap))
		}
		got, ok, err := t.Get(rm, s, C.GoString(kind), b)
		*n, *found = C.int64_t(got), 0
		if ok {
			*found = 1
		}
		if errors.Is(err, rooms.ErrShortBuffer) {
			return fmt.Errorf("%w: %w", errRange, err)
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

// cxl_rooms_release frees a room (CXL_ENOTFOUND when it is gone already).
//
//export cxl_rooms_release
func cxl_rooms_release(h C.uint64_t, slot C.int64_t, gen C.uint32_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_rooms_release", errbuf, errlen, &code)
	err := func() error {
		rm, _, err := roomArg(slot, gen, 0)
		if err != nil {
			return fmt.Errorf("rooms release: %w", err)
		}
		t, done, err := roomsOf(h)
		if err != nil {
			return err
		}
		defer done()
		return t.Release(rm)
	}()
	return report(err, errbuf, errlen)
}

// cxl_rooms_end records that side is done with the room; the second side
// to end frees it (*freed = 1 when this call did).
//
//export cxl_rooms_end
func cxl_rooms_end(h C.uint64_t, slot C.int64_t, gen C.uint32_t, side C.int, freed *C.int8_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_rooms_end", errbuf, errlen, &code)
	err := func() error {
		rm, s, err := roomArg(slot, gen, side)
		if err != nil || freed == nil {
			return fmt.Errorf("rooms end: %w: no output (%v)", errBadArg, err)
		}
		t, done, err := roomsOf(h)
		if err != nil {
			return err
		}
		defer done()
		f, err := t.End(rm, s)
		*freed = 0
		if f {
			*freed = 1
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

// cxl_rooms_stats writes the table's shape and the rooms in flight as
// JSON: {"slots":…,"area_bytes":…,"in_flight":…}.
//
//export cxl_rooms_stats
func cxl_rooms_stats(h C.uint64_t, buf *C.char, bufCap C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_rooms_stats", errbuf, errlen, &code)
	err := func() error {
		t, done, err := roomsOf(h)
		if err != nil {
			return err
		}
		defer done()
		n, err := t.InFlight()
		if err != nil {
			return err
		}
		return copyString([]byte(fmt.Sprintf(`{"slots":%d,"area_bytes":%d,"in_flight":%d}`, t.Slots(), t.AreaBytes(), n)), buf, bufCap)
	}()
	return report(err, errbuf, errlen)
}
