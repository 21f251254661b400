"""The rooms table of prefill-to-decode transfers through the real library
and a real tier: two processes' handles (a decode, a prefill), records of
each side, a reused room, a full table, bad arguments."""

import ctypes
import multiprocessing

import pytest

import cxltier
from cxltier import _native
from cxltier.rooms import DECODE, PREFILL


def test_a_decode_and_a_prefill_meet_in_a_room(device):
    dec, pre = cxltier.Tier(device), cxltier.Tier(device)
    try:
        rooms_d, rooms_p = dec.rooms("m@pd", 16, 4096), pre.rooms("m@pd")
        assert rooms_p.find(2**63 + 5, 1) is None
        rm = rooms_d.claim(2**63 + 5, 1)
        assert rooms_p.find(2**63 + 5, 0) is None
        found = rooms_p.find(2**63 + 5, 1)
        assert found == rm
        rooms_d.put(rm, DECODE, "hello", b'{"nonce": "ab"}')
        assert rooms_p.get(found, DECODE, "hello") == b'{"nonce": "ab"}'
        assert rooms_p.get(found, PREFILL, "hello") is None
        aux = (ctypes.c_uint8 * 1500)(*([7] * 1500))
        rooms_p.put(found, PREFILL, "aux/0", (ctypes.addressof(aux), 1500))
        assert rooms_d.get(rm, PREFILL, "aux/0", cap=16) == bytes([7] * 1500)  # grows past a short buffer
        into = (ctypes.c_uint8 * 1500)()
        assert rooms_d.get(rm, PREFILL, "aux/0", into=(ctypes.addressof(into), 1500)) == 1500
        assert bytes(into) == bytes(aux)
        rooms_p.put(found, PREFILL, "aux/0", None)
        assert rooms_d.get(rm, PREFILL, "aux/0") is None
        assert rooms_d.stats()["in_flight"] == 1
        rooms_p.release(found)
        with pytest.raises(_native.NotFoundError):
            rooms_d.get(rm, PREFILL, "done")
        assert rooms_d.stats()["in_flight"] == 0
    finally:
        dec.close()
        pre.close()


def test_a_reused_room_starts_clean(device):
    t = cxltier.Tier(device)
    try:
        rooms = t.rooms("m@pd", 16, 4096)
        first = rooms.claim(9, 0)
        rooms.put(first, PREFILL, "done", b"the first request's")
        with pytest.raises(_native.ExistsError, match="in flight"):
            rooms.claim(9, 0)  # its decode runs and has not ended: a second request on the room is refused
        rooms.end(first, DECODE)
        again = rooms.claim(9, 0)
        assert again != first and rooms.get(again, PREFILL, "done") is None
        with pytest.raises(_native.NotFoundError):
            rooms.put(first, PREFILL, "done", b"late")
    finally:
        t.close()


def test_a_full_table_says_so(device):
    t = cxltier.Tier(device)
    try:
        rooms = t.rooms("small@pd", 4, 1024)
        held = [rooms.claim(r, 0) for r in range(4)]
        with pytest.raises(_native.NoSpaceError, match=r'"small@pd": all 4 rooms in flight'):
            rooms.claim(99, 0)
        rooms.release(held[0])
        rooms.claim(99, 0)
    finally:
        t.close()


@pytest.mark.parametrize("call", [
    lambda rooms, rm: rooms.put(rm, 2, "hello", b"x"),
    lambda rooms, rm: rooms.put(rm, DECODE, "", b"x"),
    lambda rooms, rm: rooms.put(rm, DECODE, "k" * 65, b"x"),
    lambda rooms, rm: rooms.put(rm, DECODE, "big", b"x" * 4096),
    lambda rooms, rm: cxltier.Rooms(rooms._tier, "bad@pd", 4, 1000),
])
def test_bad_arguments_are_refused(device, call):
    t = cxltier.Tier(device)
    try:
        rooms = t.rooms("m@pd", 4, 1024)
        with pytest.raises(_native.InvalidError):
            call(rooms, rooms.claim(1, 0))
    finally:
        t.close()


def _claim_and_exit(device, q):
    t = cxltier.Tier(device)
    rooms = t.rooms("m@pd")
    for r in range(3):
        rooms.claim(100 + r, 0)
    q.put("claimed")
    # exits without closing its tier: its lease stays, its process is gone


def test_the_rooms_of_a_decode_that_died_are_reclaimed(device):
    t = cxltier.Tier(device)
    try:
        rooms = t.rooms("m@pd", 4, 1024)
        mine = rooms.claim(1, 0)
        ctx = multiprocessing.get_context("spawn")
        q = ctx.Queue()
        p = ctx.Process(target=_claim_and_exit, args=(device, q))
        p.start()
        assert q.get(timeout=60) == "claimed"
        p.join(60)
        assert p.exitcode == 0
        rooms.claim(2, 0)  # the table was full: the dead decode's rooms are freed
        assert rooms.stats()["in_flight"] == 2
        rooms.put(mine, DECODE, "hello", b"still mine")
    finally:
        t.close()


def test_the_second_side_to_end_frees_the_room(device):
    dec, pre = cxltier.Tier(device), cxltier.Tier(device)
    try:
        rooms_d, rooms_p = dec.rooms("m@pd", 16, 4096), pre.rooms("m@pd")
        for first, second in (((rooms_d, DECODE), (rooms_p, PREFILL)), ((rooms_p, PREFILL), (rooms_d, DECODE))):
            rm = rooms_d.claim(31, 0)
            assert first[0].end(rm, first[1]) is False
            assert rooms_d.stats()["in_flight"] == 1
            assert second[0].end(rm, second[1]) is True
            assert rooms_d.stats()["in_flight"] == 0
    finally:
        dec.close()
        pre.close()


def test_keyed_rooms_refuse_records_the_key_did_not_sign(device):
    """Both sides give the tenant key (the PD backend gives
    CXLTIER_PREFIX_KEY): their records are signed and read back; records
    a handle without the key writes (a valid checksum, no signature), or
    one with another key, are a ChecksumError for the keyed side, while a
    handle without a key reads them (it trusts every writer)."""
    dec, pre, other = cxltier.Tier(device), cxltier.Tier(device), cxltier.Tier(device)
    try:
        rooms_d, rooms_p = dec.rooms("k@pd", 16, 4096, key="tenant"), pre.rooms("k@pd", key="tenant")
        rm = rooms_d.claim(41, 0)
        rooms_d.put(rm, DECODE, "hello", b'{"nonce": "cd"}')
        assert rooms_p.get(rooms_p.find(41, 0), DECODE, "hello") == b'{"nonce": "cd"}'
        rooms_p.put(rm, PREFILL, "accept", b'{"pages": 3}')
        assert rooms_d.get(rm, PREFILL, "accept") == b'{"pages": 3}'

        keyless = other.rooms("k@pd")
        keyless.put(rm, PREFILL, "accept", b'{"pages": 99}')
        assert keyless.get(rm, PREFILL, "accept") == b'{"pages": 99}'
        with pytest.raises(cxltier.ChecksumError, match="not signed"):
            rooms_d.get(rm, PREFILL, "accept")
    finally:
        dec.close()
        pre.close()
        other.close()
    dec, pre = cxltier.Tier(device), cxltier.Tier(device)
    try:
        rooms_d, rooms_p = dec.rooms("k@pd", key="tenant"), pre.rooms("k@pd", key="another tenant")
        rm = rooms_d.claim(42, 0)
        rooms_d.put(rm, DECODE, "hello", b"{}")
        with pytest.raises(cxltier.ChecksumError, match="not signed"):
            rooms_p.get(rooms_p.find(42, 0), DECODE, "hello")
    finally:
        dec.close()
        pre.close()
