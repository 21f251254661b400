"""The rooms of prefill-to-decode transfers: a table in the tier that the
Go library owns (prefix/rooms). A decode claims the room of (room, rank),
a prefill finds it; each side writes records of its own (hello, done, the
aux data, ...) and reads the other's; the second side to end the room
frees it. Nothing evicts a live room: a full table reclaims rooms
whose processes ended and otherwise raises NoSpaceError naming it."""

from __future__ import annotations

import ctypes

from . import _native

DECODE, PREFILL = 0, 1


class Room:
    """A claimed room: its slot and the claim's generation. Once released,
    reclaimed or claimed anew, every call on it raises NotFoundError."""

    __slots__ = ("slot", "gen")

    def __init__(self, slot, gen):
        self.slot, self.gen = int(slot), int(gen)

    def __eq__(self, other):
        return isinstance(other, Room) and (self.slot, self.gen) == (other.slot, other.gen)

    def __repr__(self):
        return f"Room(slot={self.slot}, gen={self.gen})"


class Rooms(_native.Child):
    """The rooms table `name` of a tier; slots > 0 creates it when missing
    (slot_bytes: a power of two, 1 KiB to 1 MiB; each side's records get
    about half). key: the tenant key both sides share, which signs every
    record; records it did not sign read as ChecksumError."""

    _kind = "rooms"

    def __init__(self, tier, name, slots=0, slot_bytes=0, key=None):
        h = ctypes.c_uint64()
        _native.call("cxl_rooms_open", tier.handle, name.encode(), key.encode() if key else None, int(slots),
                     int(slot_bytes), ctypes.byref(h))
        self._opened(tier, h.value)
        self.name = name

    @property
    def handle(self):
        if self._h is None or self._tier._h is None:
            raise _native.ClosedError(-6, f"rooms {self.name!r}: closed")
        return self._h

    def claim(self, room, rank):
        """The decode's room of (room, rank), claimed anew when an earlier
        request left it (its decode ended or is gone); ExistsError while
        another decode that runs holds it and has not ended."""
        slot, gen = ctypes.c_int64(), ctypes.c_uint32()
        _native.call("cxl_rooms_claim", self.handle, int(room) & 0xFFFFFFFFFFFFFFFF, int(rank), ctypes.byref(slot),
                     ctypes.byref(gen))
        return Room(slot.value, gen.value)

    def find(self, room, rank):
        """The room of (room, rank) a decode claimed, or None."""
        slot, gen, found = ctypes.c_int64(), ctypes.c_uint32(), ctypes.c_int8()
        _native.call("cxl_rooms_find", self.handle, int(room) & 0xFFFFFFFFFFFFFFFF, int(rank), ctypes.byref(slot),
                     ctypes.byref(gen), ctypes.byref(found))
        return Room(slot.value, gen.value) if found.value else None

    def put(self, room, side, kind, data):
        """Sets record kind of side's records (DECODE or PREFILL) to data:
        bytes, or an (address, length) pair of memory to copy; None
        deletes it."""
        if data is None:
            addr, n = None, -1
        elif isinstance(data, tuple):
            addr, n = data
        else:
            raw = bytes(data)
            buf = ctypes.create_string_buffer(raw, len(raw))
            addr, n = ctypes.addressof(buf), len(raw)
        _native.call("cxl_rooms_put", self.handle, room.slot, room.gen, side, kind.encode(), addr, n)

    def get(self, room, side, kind, into=None, cap=4096):
        """Record kind of side's records: bytes, or None when the side did
        not write it. With into, an (address, length) pair, the record is
        copied there and its length returned."""
        n, found = ctypes.c_int64(), ctypes.c_int8()
        if into is not None:
            _native.call("cxl_rooms_get", self.handle, room.slot, room.gen, side, kind.encode(), into[0], into[1],
                         ctypes.byref(n), ctypes.byref(found))
            return n.value if found.value else None
        while True:
            buf = ctypes.create_string_buffer(cap)
            try:
                _native.call("cxl_rooms_get", self.handle, room.slot, room.gen, side, kind.encode(), buf, cap,
                             ctypes.byref(n), ctypes.byref(found))
            except _native.RangeError:
                cap = n.value
                continue
            return buf.raw[: n.value] if found.value else None

    def end(self, room, side):
        """Says side is done with the room (it reads and writes nothing
        more there); the second side to end frees it. Whether this call
        did."""
        freed = ctypes.c_int8()
        _native.call("cxl_rooms_end", self.handle, room.slot, room.gen, side, ctypes.byref(freed))
        return freed.value == 1

    def release(self, room):
        _native.call("cxl_rooms_release", self.handle, room.slot, room.gen)

    def stats(self):
        return self._stats(self.handle)
