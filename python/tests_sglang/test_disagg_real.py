"""Prefill to decode through the tier, with SGLang's own disaggregation
classes: a prefill process and a decode process (pd_worker.py, which says
what each runs of SGLang and in which order), SGLang's real MHA and MLA KV
pools on CPU, the cxltier transfer backend registered as the plugin
registers it. The transfer is the cache insert: a second request with the
same prefix writes nothing. Each worker is a process of its own, forked by
one server per module that imported SGLang once (pd_worker.py serve):
started afresh, each worker's imports (about 17 s of CPU) were most of this
module's 12 minutes on 2 cores; forked, it takes about one."""

import contextlib
import ctypes
import hashlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import cxltier

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
import forge_page  # noqa: E402  a writer of the tier without the key
import forkserver  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
PAGE = 4


def env(built, device, extra=None):
    e = dict(os.environ, CXLTIER_LIB=built["lib"], CXLTIER_DEVICES=device, CXLTIER_PD_INDEX="pd",
             PYTHONPATH=os.path.dirname(HERE), SGLANG_DISAGGREGATION_WAITING_TIMEOUT="20",
             SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT="20")
    e.update(extra or {})
    return e


FORKS = {}


@pytest.fixture(autouse=True, scope="module")
def forks(built, tmp_path_factory):
    FORKS["server"] = forkserver.Client(os.path.join(HERE, "pd_worker.py"), env(built, "shm:unused"),
                                        str(tmp_path_factory.mktemp("pd-workers")))
    yield
    FORKS.pop("server").close()


def start(built, device, role, job, extra=None):
    return FORKS["server"].start([role, json.dumps(job)], env(built, device, extra), role)


def result(p, timeout=120):
    out, err = p.communicate(timeout=timeout)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    assert lines, f"no result (exit {p.returncode}): {err[-2000:]}"
    return json.loads(lines[-1])


def job(kind, tokens, room, **kw):
    j = {"kind": kind, "page_size": PAGE, "pool_tokens": 256, "tokens": tokens, "room": room, "seed": 7,
         "first_token": 4242, "first_slot_page": 2}
    j.update(kw)
    return j


def index_for(built, device, kind, blocks=64):
    """The index the backend writes into, sized for the pool's pages."""
    t = cxltier.Tier(device)
    # Blocks of 4 KiB: an MHA page here is 3 layers x K and V x 4 tokens x 2 heads x 8 bf16 (768 bytes).
    t.prefix("pd", blocks, 4096)
    t.close()


def pair(built, device, pjob, djob, pextra=None, dextra=None):
    p = start(built, device, "prefill", pjob, pextra)
    d = start(built, device, "decode", djob, dextra)
    return result(p), result(d)


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_prefill_to_decode_and_the_prefix_after(built, device, kind):
    """The decode's pages are the prefill's, byte for byte, with the first
    token; a second request with the same prompt writes no page (they are
    in the tier, the cache entries of the first) and lands the same bytes."""
    index_for(built, device, kind)
    tokens = list(range(1000, 1000 + 5 * PAGE + 2))  # five whole pages and a partial one
    pr, dr = pair(built, device, job(kind, tokens, 11), job(kind, tokens, 11, first_slot_page=20))
    assert pr["state"] == "success" and dr["state"] == "success", (pr, dr)
    assert dr["digests"] == pr["digests"] and dr["first_token"] == 4242
    assert pr["written"] == 5 and pr["present"] == 0
    pr2, dr2 = pair(built, device, job(kind, tokens, 12, first_slot_page=40), job(kind, tokens, 12, first_slot_page=50))
    assert pr2["state"] == "success" and dr2["state"] == "success", (pr2, dr2)
    assert pr2["written"] == 0 and pr2["present"] == 5, pr2
    assert dr2["digests"] == pr["digests"]
    assert rooms_in_flight(device) == 0


def test_decode_that_holds_a_prefix_is_sent_the_rest(built, device):
    """A decode that holds the first page (its own radix cache) gets the
    pages after it only."""
    index_for(built, device, "mha")
    tokens = list(range(2000, 2000 + 4 * PAGE))
    pr, dr = pair(built, device, job("mha", tokens, 21), job("mha", tokens, 21, decode_prefix_len=PAGE, first_slot_page=30))
    assert pr["state"] == "success" and dr["state"] == "success", (pr, dr)
    assert len(pr["digests"]) == 3 and dr["digests"] == pr["digests"]


def test_a_prefill_that_dies_mid_send_fails_the_decode_at_once(built, device):
    """kill -9 of the prefill after its bootstrap, before its pages, with
    SGLang's default waiting timeout of 300 s: the decode sees the prefill's
    lease gone (its process no longer runs) and fails within seconds,
    naming why, and nothing stays reserved in the tier. (It waited out the
    300 s.)"""
    index_for(built, device, "mha")
    tokens = list(range(3000, 3000 + 3 * PAGE))
    p = start(built, device, "prefill", job("mha", tokens, 31, die_before_send=True))
    d = start(built, device, "decode", job("mha", tokens, 31, first_slot_page=30, limit=400),
              {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "300"})
    while p.stdout.readline().find("about to die") < 0:
        assert p.poll() is None, p.stderr.read()[-2000:]
    p.send_signal(signal.SIGKILL)
    p.wait()
    killed = time.monotonic()
    dr = result(d, timeout=400)
    assert dr["state"] == "failed" and "prefill side's process is gone" in dr["reason"], dr
    # Seconds, not the 300 s timeout; generous for a loaded machine. (Timed
    # from the kill, not from the processes' start.)
    assert time.monotonic() - killed < 60
    t = cxltier.Tier(device)
    assert t.prefix("pd").stats()["reserved"] == 0
    t.close()


def test_a_decode_that_dies_before_its_ack_fails_the_prefill_at_once(built, device, tmp_path):
    """kill -9 of the decode after the prefill wrote its pages, before the
    decode read them: the prefill, waiting for the ack with SGLang's default
    timeout of 300 s, sees the decode's lease gone and fails within
    seconds. The request's partial last page goes with its room: the whole
    pages stay as cache, the last page is the dead request's alone."""
    index_for(built, device, "mha")
    tokens = list(range(3500, 3500 + 3 * PAGE + 2))
    p = start(built, device, "prefill", job("mha", tokens, 35, limit=400), {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "300"})
    d = start(built, device, "decode", job("mha", tokens, 35, first_slot_page=30),
              {"CXLTIER_PD_TEST_GATE_BEFORE_LOAD": str(tmp_path / "never")})
    wait_for_pages(device, 4, p)[0].close()  # the prefill's pages and last page are in: its done follows
    time.sleep(0.5)
    d.send_signal(signal.SIGKILL)
    d.wait()
    killed = time.monotonic()
    pr = result(p, timeout=400)
    assert pr["state"] == "failed" and "decode side's process is gone" in pr["reason"], pr
    assert time.monotonic() - killed < 60
    t = cxltier.Tier(device)
    try:
        assert len(t.prefix("pd").keys()) == 3, "the dead request's last page outlived its room"
    finally:
        t.close()


def test_a_decode_that_acked_and_exited_is_not_taken_for_dead(built, device, tmp_path):
    """The decode lands its pages, acks and its process ends (its lease
    with it) before the prefill polls again: the prefill finds the ack and
    succeeds. (It looked at the decode's lease before its ack, and a TP 4
    prefill rank failed a request its decode had served.)"""
    index_for(built, device, "mha")
    tokens = list(range(3600, 3600 + 3 * PAGE + 1))
    gate = tmp_path / "poll"
    p = start(built, device, "prefill", job("mha", tokens, 36, poll_gate=str(gate), limit=60))
    d = start(built, device, "decode", job("mha", tokens, 36, first_slot_page=30))
    dr = result(d)
    assert dr["state"] == "success", dr
    assert d.returncode == 0  # gone, and its lease with it
    gate.touch()
    pr = result(p)
    assert pr["state"] == "success", pr
    assert dr["digests"] == pr["digests"]


def test_a_second_decode_for_a_room_in_flight_fails_at_once(built, device, tmp_path):
    """Two decodes given one bootstrap room while the first is in flight:
    the second used to take the room anew (failing the first) and wait out
    SGLang's timeout blaming the prefill for writing nothing; it fails at
    once, saying the room is in flight, and the first goes on."""
    index_for(built, device, "mha")
    tokens = list(range(3700, 3700 + 2 * PAGE))
    gate = tmp_path / "open"
    # The first pair waits for the second decode's start (a fork of the
    # server; a worker that imports SGLang itself took 20 s, and past a
    # minute on a machine loaded 4 times over), maybe longer than the tests'
    # 20 s timeout: SGLang's default then (the second decode's reason, not a
    # clock, says it failed at its claim, not at a timeout).
    patient = {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "300"}
    p = start(built, device, "prefill", job("mha", tokens, 37, limit=330), patient)
    d1 = start(built, device, "decode", job("mha", tokens, 37, first_slot_page=30, limit=330),
               dict(patient, CXLTIER_PD_TEST_GATE_BEFORE_LOAD=str(gate)))
    wait_for_pages(device, 2, p)[0].close()  # the first request is in flight
    second = result(start(built, device, "decode", job("mha", tokens, 37, first_slot_page=40), patient), 300)
    assert second["state"] == "failed" and "in flight" in second["reason"], second
    gate.touch()
    pr, dr = result(p), result(d1)
    assert pr["state"] == "success" and dr["state"] == "success", (pr["state"], pr["reason"], dr["state"], dr["reason"])
    assert dr["digests"] == pr["digests"]


def test_a_decode_that_aborts_ends_the_prefill(built, device):
    index_for(built, device, "mha")
    tokens = list(range(4000, 4000 + 3 * PAGE))
    p = start(built, device, "prefill", job("mha", tokens, 41, die_before_send=False, limit=30),
              {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "15"})
    d = start(built, device, "decode", job("mha", tokens, 41, abort_after=0.5))
    dr, pr = result(d), result(p)
    assert dr["state"] == "aborted"
    assert pr["state"] == "failed" and "aborted" in pr["reason"], pr
    assert rooms_in_flight(device) == 0  # SGLang never clears a failed sender: the room ends as it concludes


def rooms_in_flight(device):
    t = cxltier.Tier(device)
    try:
        return t.rooms("pd@pd").stats()["in_flight"]
    finally:
        t.close()


def test_a_full_tier_fails_both_sides_saying_why(built, device):
    """An index too small for the request: the prefill fails, naming the
    full tier, and the decode fails with the prefill's reason."""
    t = cxltier.Tier(device)
    t.prefix("pd", 2, 4096)  # two blocks for five pages, all pinned by nothing: eviction frees only so much
    t.close()
    tokens = list(range(5000, 5000 + 5 * PAGE))
    pr, dr = pair(built, device, job("mha", tokens, 51, chunk_pages=5), job("mha", tokens, 51, first_slot_page=30))
    assert pr["state"] == "failed" and "the tier is full" in pr["reason"], pr
    assert dr["state"] == "failed" and "the tier is full" in dr["reason"], dr


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_the_decode_lands_pages_while_the_prefill_stores_the_rest(built, device, kind):
    """A chunked prefill sends a page at a time, a while apart: the decode
    lands each published page before the prefill's done record, and what
    landed is the prefill's KV."""
    index_for(built, device, kind)
    tokens = list(range(7000, 7000 + 5 * PAGE + 1))
    pr, dr = pair(built, device, job(kind, tokens, 71, chunk_pages=1, send_gap=0.4),
                  job(kind, tokens, 71, first_slot_page=30))
    assert pr["state"] == "success" and dr["state"] == "success", (pr, dr)
    assert dr["digests"] == pr["digests"]
    assert dr["streamed"] is not None and 3 <= dr["streamed"] <= 5, dr


def test_pages_another_writer_holds_are_waited_for(built, device, tmp_path):
    """Another writer (an uplink's fill, the other prefill rank of an MLA
    page) has reserved two of the request's pages and not published them
    when the prefill stores: the prefill tells the decode its pages are in
    only once they are. That writer gives them up a second later and the
    prefill stores them itself; the decode lands every page. (The prefill
    said done on seeing the other writer's reservations, and the decode
    failed, page 1 not in the tier: a TP 2 MLA decode rank in bench/pd.)"""
    index_for(built, device, "mla")
    tokens = list(range(7500, 7500 + 4 * PAGE + 1))
    gate = tmp_path / "go"
    p = start(built, device, "prefill", job("mla", tokens, 75, keys_gate=str(gate)))
    d = start(built, device, "decode", job("mla", tokens, 75, first_slot_page=30))
    said = said_by(p, "keys")
    t = cxltier.Tier(device)
    try:
        with another_writer(t.prefix("pd"), said["keys"][1:3], said["page_bytes"]):
            gate.touch()
            time.sleep(1.5)  # the prefill stores pages 0 and 3 and finds 1 and 2 reserved
            assert p.poll() is None and d.poll() is None, "a side ended while another writer held its pages"
        pr, dr = result(p), result(d)
    finally:
        t.close()
    assert pr["state"] == "success" and dr["state"] == "success", (pr, dr)
    assert dr["digests"] == pr["digests"]
    assert pr["written"] == 4 and pr["present"] >= 1, pr  # it met the other writer, then stored every page itself


def said_by(p, state):
    """The first line of worker p whose state is state (its output is read
    as it grows: no line yet reads as "")."""
    deadline = time.monotonic() + 120
    while True:
        line = p.stdout.readline()
        if line.startswith("{") and json.loads(line).get("state") == state:
            return json.loads(line)
        assert line or p.poll() is None, f"the worker ended before saying {state!r}: {result(p)}"
        assert time.monotonic() < deadline, f"the worker did not say {state!r} within 120 s"


@contextlib.contextmanager
def another_writer(ix, keys, size):
    """A fill of keys in index ix, begun as an uplink's is (prefix.Fill):
    their blocks reserved, nothing published; given up on leaving."""
    from cxltier import _native

    n = len(keys)
    raw = (ctypes.c_uint8 * (32 * n)).from_buffer_copy(b"".join(bytes.fromhex(k) for k in keys))
    st, h = (ctypes.c_int8 * n)(), ctypes.c_uint64()
    _native.call("cxl_prefix_fill_begin", ix.handle, raw, n, (ctypes.c_int64 * n)(*[size] * n), st, ctypes.byref(h))
    try:
        assert list(st) == [0] * n, f"fill statuses {list(st)}: the keys were not all reserved"
        yield
    finally:
        _native.call("cxl_prefix_fill_close", h.value)


def test_more_rooms_in_flight_than_the_old_mailbox_held(built, device):
    """80 requests in flight at once, every hello said before the prefill
    serves the first: every room is kept (the 64-block LRU index that held
    the records before evicted the first hellos: the prefill then waited
    for them in vain) and each request gets its own KV and first token."""
    index_for(built, device, "mha", blocks=256)  # every request's pages at once
    tokens = list(range(8000, 8000 + PAGE + 1))
    n = 80
    d = start(built, device, "decode", job("mha", tokens, 1000, many=n, first_slot_page=10, limit=90, pool_tokens=1024))
    time.sleep(3)  # every hello in the tier before the prefill starts
    p = start(built, device, "prefill", job("mha", tokens, 1000, many=n, first_slot_page=10, limit=10,
                                            bootstrap_limit=10, pool_tokens=1024))
    pr, dr = result(p, 180), result(d, 180)
    assert pr["states"] == ["success"] * n and dr["states"] == ["success"] * n, (pr["states"], dr["states"])
    assert dr["digests"] == pr["digests"]
    assert dr["first_tokens"] == [4242 + k for k in range(n)]
    assert rooms_in_flight(device) == 0  # every room freed: both sides ended it
    t = cxltier.Tier(device)
    try:
        # Each request's whole page stays as a cache entry; its partial last
        # page went with its room (the prefill, which kept it pinned until the
        # ack, dropped it once the decode's drop was refused).
        assert len(t.prefix("pd").keys()) == n
    finally:
        t.close()


def test_published_pages_are_kept_until_the_decode_lands_them(built, device):
    """A full index whose older pages were each read once (a serving tier's
    steady state: every page sent was read by its decode): eviction's second
    chance passes those over and takes the newest unread pages first, so the
    prefill's next pages evicted its own published ones before a decode that
    polled late read them, and the decode failed ("a page is not in the
    tier"). The prefill keeps what it published until the decode's ack."""
    t = cxltier.Tier(device)
    try:
        ix = t.prefix("pd", 8, 4096)
        old = cxltier.page_keys(range(90000, 90000 + 6 * PAGE), PAGE)
        assert ix.set(old, [bytes(768)] * 6) == ["stored"] * 6
        assert ix.get(old, [bytearray(4096) for _ in old])[0] == 6  # each read once
    finally:
        t.close()
    tokens = list(range(9100, 9100 + 5 * PAGE))  # five whole pages: three must evict
    pr, dr = pair(built, device, job("mha", tokens, 77, chunk_pages=1, send_gap=0.05),
                  job("mha", tokens, 77, first_slot_page=30, poll_after=2.0))
    assert pr["state"] == "success" and dr["state"] == "success", (pr, dr)
    assert dr["digests"] == pr["digests"]
    t = cxltier.Tier(device)
    try:
        assert t.prefix("pd").has(old).count(True) == 3  # the old pages were evicted instead
    finally:
        t.close()


def test_a_bad_publish_size_is_refused_naming_it(built, device):
    index_for(built, device, "mha")
    r = result(start(built, device, "prefill", job("mha", [1, 2, 3, 4], 72), {"CXLTIER_PD_PUBLISH_MIB": "lots"}))
    assert r["state"] == "refused" and "CXLTIER_PD_PUBLISH_MIB='lots'" in r["reason"], r


def test_a_damaged_page_is_never_handed_to_the_decode(built, device, tmp_path):
    """A page damaged in the tier between the prefill's write and the
    decode's read: the decode's load checks every page and fails the
    request instead of serving it."""
    index_for(built, device, "mha")
    tokens = list(range(6000, 6000 + 3 * PAGE))
    # The prefill writes its pages; the test damages one; then the decode reads.
    gate = str(tmp_path / "load-gate")
    p = start(built, device, "prefill", job("mha", tokens, 61), {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "15"})
    d = start(built, device, "decode", job("mha", tokens, 61, first_slot_page=30),
              {"CXLTIER_PD_TEST_GATE_BEFORE_LOAD": gate})
    _damage_one_page(built, device, want=3)
    open(gate, "w").close()
    dr, pr = result(d), result(p)
    assert dr["state"] == "failed" and "checksum" in dr["reason"].lower(), dr
    assert pr["state"] == "failed", pr


def test_a_damaged_page_is_never_handed_to_a_decode_rank_of_its_heads(built, device, tmp_path):
    """A share of a page's heads lands through a staging copy checked
    before any row reaches the pool: a byte flipped in a TP 1 prefill's
    page fails both ranks of the TP 2 decode, the one whose heads hold the
    byte and the other. The first rank to read the page finds the checksum
    wrong and drops the page from the tier; a rank that reads after that
    finds the page gone, so each rank fails and at least one by the
    checksum."""
    index_for(built, device, "mha")
    tokens = list(range(9800, 9800 + 3 * PAGE))
    gate = str(tmp_path / "load-gate")
    slow = {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "60"}
    p = start(built, device, "prefill", job("mha", tokens, 98, heads=2, limit=90, bootstrap_limit=90), slow)
    ds = [start(built, device, "decode", job("mha", tokens, 98, heads=1, tp_rank=r, tp_size=2, first_slot_page=30,
                                             limit=90, bootstrap_limit=90),
                dict(slow, CXLTIER_PD_TEST_GATE_BEFORE_LOAD=gate)) for r in range(2)]
    _damage_one_page(built, device, want=3)
    open(gate, "w").close()
    got = [result(d, 300) for d in ds]
    reasons = [r.get("reason", "").lower() for r in got]
    assert all(r["state"] == "failed" for r in got), got
    assert all("checksum" in why or "not in the tier" in why for why in reasons), got
    assert any("checksum" in why for why in reasons), got
    assert result(p, 300)["state"] == "failed"


def wait_for_pages(device, want, prefill=None, key=None):
    """Waits until index pd (with tenant key key) holds want pages (the
    prefill, when given, must not have ended first); returns the attached
    tier and the index."""
    t = cxltier.Tier(device)
    ix = t.prefix("pd", key=key)
    deadline = time.monotonic() + 120
    while len(keys := ix.keys()) < want:
        assert time.monotonic() < deadline, f"the prefill stored {len(keys)} of {want} pages"
        assert prefill is None or prefill.poll() is None, "the prefill ended before storing its pages"
        time.sleep(0.02)
    return t, ix


def _payload_of(ix, key):
    """The payload of key in index ix, read (and checked) through it."""
    buf = bytearray(ix.stats()["block_bytes"])
    served, lens = ix.get([key], [buf])
    assert served == 1, f"{key.hex()} is not in the index"
    return bytes(buf[: lens[0]])


def _damage_one_page(built, device, want):
    """Flips a byte of one ready entry's payload of index pd, in place."""
    t, ix = wait_for_pages(device, want)
    keys = ix.keys()
    from cxltier import _native
    import ctypes

    n = len(keys)
    arr = (ctypes.c_uint8 * (n * 32)).from_buffer_copy(b"".join(keys))
    addrs, lens, present, h = (ctypes.c_void_p * n)(), (ctypes.c_int64 * n)(), (ctypes.c_int8 * n)(), ctypes.c_uint64()
    trailers, inplace = (ctypes.c_uint8 * (n * 32))(), (ctypes.c_int8 * n)()
    _native.call("cxl_prefix_pin", ix.handle, arr, n, addrs, lens, trailers, inplace, present, ctypes.byref(h))
    view = (ctypes.c_uint8 * lens[0]).from_address(addrs[0])
    t.track_view(view)
    view[7] ^= 0xFF
    _native.call("cxl_prefix_unpin", h.value)
    del view
    t.close()


def test_a_page_forged_without_the_key_is_never_handed_to_the_decode(built, device, tmp_path):
    """With a tenant key (CXLTIER_PREFIX_KEY on both sides) the index's
    pages and the rooms' records are signed: a pair succeeds as without
    one; then a page replaced in the tier between the prefill's store and
    the decode's load by a process without the key, bytes of its own with
    a valid CRC (forge_page.py, which an index without a key would serve:
    tests/test_kvpool.py), fails the decode's load saying the page is not
    signed, and the request fails on both sides instead of decoding from
    forged KV."""
    key = {"CXLTIER_PREFIX_KEY": "pd-tenant"}
    t = cxltier.Tier(device)
    t.prefix("pd", 64, 4096, key=key["CXLTIER_PREFIX_KEY"])
    t.close()
    tokens = list(range(6500, 6500 + 3 * PAGE))
    pr, dr = pair(built, device, job("mha", tokens, 65), job("mha", tokens, 65, first_slot_page=30), key, key)
    assert pr["state"] == "success" and dr["state"] == "success" and dr["digests"] == pr["digests"], (pr, dr)

    t, ix = wait_for_pages(device, 3, key=key["CXLTIER_PREFIX_KEY"])
    first = set(ix.keys())
    t.close()

    tokens = list(range(6600, 6600 + 3 * PAGE))  # other pages: other tokens, and KV of another seed
    gate = str(tmp_path / "load-gate")
    p = start(built, device, "prefill", job("mha", tokens, 66, seed=8), {**key, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "15"})
    d = start(built, device, "decode", job("mha", tokens, 66, seed=8, first_slot_page=30),
              {**key, "CXLTIER_PD_TEST_GATE_BEFORE_LOAD": gate})
    t, ix = wait_for_pages(device, 6, p, key=key["CXLTIER_PREFIX_KEY"])
    target = next(k for k in ix.keys() if k not in first)
    stored = _payload_of(ix, target)  # where the forger's bytes go: the test has the key, the forger not
    t.close()
    forged = bytes(x ^ 0x3C for x in stored)
    forge_page.forge("/dev/shm/" + device.split(":", 1)[1], target, stored, forged)
    open(gate, "w").close()
    dr, pr = result(d), result(p)
    assert dr["state"] == "failed" and "not signed" in dr["reason"], dr
    assert pr["state"] == "failed", pr


@pytest.fixture
def shared_device(built):
    """A tier formatted for hosts that do not share caches (-coherence
    shared): every publish flushes its lines and every read refreshes."""
    import subprocess
    import uuid

    name = f"cxltier-pd-shared-{uuid.uuid4().hex[:12]}"
    subprocess.check_call([built["cli"], "format", "-device", f"shm:{name}", "-size", "64MiB", "-chunk", "256KiB",
                           "-coherence", "shared"], stdout=subprocess.DEVNULL)
    yield f"shm:{name}"
    subprocess.run([built["cli"], "destroy", "-force", f"shm:{name}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_a_tier_formatted_for_several_hosts(built, shared_device):
    """The round trip on a tier of -coherence shared: the records and the
    pages go through the flushing paths. (The non-coherent simulator
    stands in for a second host only inside Go's tests: prefix's host
    tests cover the publish and refresh rules these calls rely on.)"""
    index_for(built, shared_device, "mla")
    tokens = list(range(7000, 7000 + 3 * PAGE + 1))
    pr, dr = pair(built, shared_device, job("mla", tokens, 71), job("mla", tokens, 71, first_slot_page=20))
    assert pr["state"] == "success" and dr["state"] == "success", (pr, dr)
    assert dr["digests"] == pr["digests"] and pr["written"] == 3


def test_sides_of_different_layouts_fail_saying_so(built, device):
    """A decode whose KV layout is not the prefill's (another model, KV
    dtype or TP size; here MLA against MHA) is refused by the prefill at
    bootstrap, and the decode fails with the prefill's reason."""
    index_for(built, device, "mha")
    tokens = list(range(8000, 8000 + 2 * PAGE))
    pr, dr = pair(built, device, job("mha", tokens, 81), job("mla", tokens, 81, first_slot_page=20))
    assert pr["state"] == "failed" and "layout" in pr["reason"], pr
    assert dr["state"] == "failed" and "layout" in dr["reason"], dr


@pytest.mark.parametrize("kind,tp", [("mha", 2), ("mla", 2), ("mha", 4)])
def test_tensor_parallel_ranks_with_one_slow(built, device, kind, tp):
    """A TP 2 (or 4) prefill and decode, a process a rank, the decode's
    ranks together and the prefill's rank 1 a second and a half behind the
    others (as under real load): each rank gets its own pages, and all
    succeed. (With records keyed by the room alone, the decode ranks
    overwrote each other's hello, so an MHA prefill rank saw the other
    rank's layout, and the first prefill rank to finish dropped the records
    the slow one had yet to read.)"""
    index_for(built, device, kind)
    tokens = list(range(9000, 9000 + 3 * PAGE + 1))
    procs = []
    for rank in range(tp):
        extra = {"tp_rank": rank, "tp_size": tp, "limit": 90, "bootstrap_limit": 90}
        # An MHA rank holds its own heads; every MLA rank the same latent.
        seed = 7 + rank if kind == "mha" else 7
        slow = {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "120"}  # a process a rank starts slowly on a small machine
        procs.append(start(built, device, "prefill", job(kind, tokens, 91, seed=seed, delay=1.5 * (rank == 1), **extra), slow))
        procs.append(start(built, device, "decode", job(kind, tokens, 91, first_slot_page=20, **extra), slow))
    got = [result(p, 300) for p in procs]
    prefills, decodes = got[0::2], got[1::2]
    for r in got:
        assert r["state"] == "success", [(x["role"], x["state"], x.get("reason")) for x in got]
    for p, d in zip(prefills, decodes):
        assert d["digests"] == p["digests"]
    if kind == "mha":  # a rank's heads are its own pages
        assert len({tuple(p["digests"]) for p in prefills}) == tp


def ranks(built, device, tmp_path, kind, tokens, room, prefill_tp, decode_tp, pkw=None, dkw=None, prefill_seeds=False,
          dextra=None, between=None, **kw):
    """A prefill of prefill_tp ranks and a decode of decode_tp ranks, a
    process a rank, all started at once, the prefill's ranks going on past
    their bootstrap together (as SGLang's all-reduce of their states makes
    them), pkw and dkw in the jobs of the prefill's and the decode's ranks
    (prefill_seeds: each prefill rank's KV of its own seed, as an MHA
    rank's heads are its own; dextra: the decode ranks' environment;
    between: run once every process started, before their results are
    read): (prefills' results, decodes')."""
    slow = {"SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "120"}
    barrier = tmp_path / f"barrier-{room}"
    barrier.mkdir()
    procs = []
    for rank in range(prefill_tp):
        extra = {"tp_rank": rank, "tp_size": prefill_tp, "limit": 90, "bootstrap_limit": 90, "barrier": str(barrier)}
        if prefill_seeds:
            extra["seed"] = 7 + rank
        procs.append(start(built, device, "prefill", job(kind, tokens, room, **{**kw, **(pkw or {}), **extra}), slow))
    for rank in range(decode_tp):
        extra = {"tp_rank": rank, "tp_size": decode_tp, "limit": 90, "bootstrap_limit": 90}
        procs.append(start(built, device, "decode", job(kind, tokens, room, first_slot_page=20, **extra, **kw, **(dkw or {})),
                           dict(slow, **(dextra or {}))))
    if between is not None:
        between()
    got = [result(p, 300) for p in procs]
    return got[:prefill_tp], got[prefill_tp:]


@pytest.mark.parametrize("prefill_tp,decode_tp", [(2, 1), (1, 2)])
def test_mla_between_tp_sizes(built, device, tmp_path, prefill_tp, decode_tp):
    """MLA's latent is the same on every rank, so a decode of another TP
    size gets it as SGLang's mooncake backend gives it: a TP 2 prefill's
    rank 0 serves a TP 1 decode while rank 1 stands by, and a TP 1
    prefill serves both ranks of a TP 2 decode, storing the pages once
    (the prefill refused any decode of another TP size)."""
    index_for(built, device, "mla")
    tokens = list(range(9500, 9500 + 3 * PAGE + 2))
    prefills, decodes = ranks(built, device, tmp_path, "mla", tokens, 95, prefill_tp, decode_tp)
    for r in prefills + decodes:
        assert r["state"] == "success", [(x["role"], x["state"], x.get("reason")) for x in prefills + decodes]
    for d in decodes:
        assert d["digests"] == prefills[0]["digests"] and d["first_token"] == 4242, d
    assert sum(p["written"] for p in prefills) == 3, prefills  # three whole pages, once
    assert rooms_in_flight(device) == 0


@pytest.mark.parametrize("prefill_heads,decode_heads", [(2, 1), (1, 1)])
def test_mha_to_a_decode_of_a_larger_tp_size(built, device, tmp_path, prefill_heads, decode_heads):
    """An MHA page holds a prefill rank's KV heads; each rank of a decode
    of twice its TP size holds half of them (SGLang shards heads by rank),
    or all of them when there are fewer KV heads than decode ranks (SGLang
    replicates them): a TP 1 prefill serves both ranks of a TP 2 decode,
    storing its pages once, and decode rank j lands the j-th half of the
    heads of every page, K and V of every layer, the partial last page
    too (the prefill refused every MHA decode of another TP size)."""
    index_for(built, device, "mha")
    tokens = list(range(9700, 9700 + 3 * PAGE + 2))
    shares = prefill_heads // decode_heads
    prefills, decodes = ranks(built, device, tmp_path, "mha", tokens, 97, 1, 2, pkw={"heads": prefill_heads, "shares": shares},
                              dkw={"heads": decode_heads})
    for r in prefills + decodes:
        assert r["state"] == "success", [(x["role"], x["state"], x.get("reason")) for x in prefills + decodes]
    for rank, d in enumerate(decodes):
        want = prefills[0]["shares"][rank] if shares == 2 else prefills[0]["digests"]
        assert d["digests"] == want and d["first_token"] == 4242, (rank, d)
    if shares == 2:
        assert decodes[0]["digests"] != decodes[1]["digests"]
    assert prefills[0]["written"] == 3, prefills  # three whole pages, once for both decode ranks
    assert rooms_in_flight(device) == 0


@pytest.mark.parametrize("prefill_tp,prefill_heads,decode_heads", [(2, 1, 2), (2, 1, 1), (4, 1, 2)])
def test_mha_to_a_decode_of_a_smaller_tp_size(built, device, tmp_path, prefill_tp, prefill_heads, decode_heads):
    """A decode rank of a smaller TP size holds the heads of several
    prefill ranks (SGLang shards heads by rank, as its mooncake backend
    joins them): each of those prefill ranks serves it its heads as a part
    of its rows, through a room of its own, and the decode rank lands each
    part in its place, K and V of every layer, the partial last page too.
    TP 2 to 1 with a head each, TP 2 to 1 with one head replicated on both
    prefill ranks, TP 4 to 2 (this backend refused every smaller MHA decode).
    Each prefill rank's pages are its own (seeds of their own)."""
    index_for(built, device, "mha")
    tokens = list(range(9600, 9600 + 3 * PAGE + 2))
    decode_tp = 1 if prefill_tp == 2 else 2
    k = prefill_tp // decode_tp
    shares = decode_heads // prefill_heads  # prefill ranks' rows in a decode rank's (k / shares of them alike)
    prefills, decodes = ranks(built, device, tmp_path, "mha", tokens, 96 + prefill_tp, prefill_tp, decode_tp,
                              pkw={"heads": prefill_heads}, dkw={"heads": decode_heads, "shares": shares},
                              prefill_seeds=shares > 1)
    for r in prefills + decodes:
        assert r["state"] == "success", [(x["role"], x["state"], x.get("reason")) for x in prefills + decodes]
    for j, d in enumerate(decodes):
        for q in range(k):
            i = j * k + q
            assert d["shares"][q // (k // shares)] == prefills[i]["digests"], (j, i)
        assert d["first_token"] == 4242
    if shares > 1:
        assert decodes[0]["shares"][0] != decodes[0]["shares"][1]
    assert all(p["written"] == 3 for p in prefills), prefills  # each rank its own three whole pages
    assert rooms_in_flight(device) == 0


def test_an_mha_decode_of_a_smaller_tp_size_checks_every_part(built, device, tmp_path):
    """A damaged page of one of the prefill ranks a decode rank of a
    smaller TP size lands from fails the request: its rows never reach the
    pool, whichever part it is."""
    index_for(built, device, "mha")
    tokens = list(range(9900, 9900 + 3 * PAGE))
    gate = tmp_path / "go"
    prefills, decodes = ranks(built, device, tmp_path, "mha", tokens, 99, 2, 1, pkw={"heads": 1},
                              dkw={"heads": 2, "shares": 2}, prefill_seeds=True,
                              dextra={"CXLTIER_PD_TEST_GATE_BEFORE_LOAD": str(gate)},
                              between=lambda: (_damage_one_page(built, device, want=6), gate.touch()))
    assert decodes[0]["state"] == "failed" and "checksum" in decodes[0]["reason"].lower(), decodes[0]
    assert rooms_in_flight(device) == 0


def test_a_reused_room_serves_its_own_last_page(built, device):
    """Two requests on one room, one after the other, with different
    prompts whose last pages are partial: the second decode gets the
    second prefill's last page, not the first's (the partial page was
    stored under the room alone, insert-if-absent, and never deleted: the
    second request was served the first's KV and both sides said success)."""
    index_for(built, device, "mha")
    first = list(range(10000, 10000 + 2 * PAGE + 2))
    second = list(range(11000, 11000 + 2 * PAGE + 2))
    pr, dr = pair(built, device, job("mha", first, 101), job("mha", first, 101, first_slot_page=20))
    assert pr["state"] == "success" and dr["state"] == "success", (pr, dr)
    pr2, dr2 = pair(built, device, job("mha", second, 101, seed=8), job("mha", second, 101, first_slot_page=20))
    assert pr2["state"] == "success" and dr2["state"] == "success", (pr2, dr2)
    assert dr2["digests"] == pr2["digests"], "the second request's decode holds pages the second prefill did not send"
    assert dr2["digests"][-1] != pr["digests"][-1]


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_pages_a_prefill_stored_are_hits_for_an_engines_linker(built, device, kind):
    """The transfer is the cache insert: after a prefill sent a prompt
    (SGLang's default --kv-cache-dtype auto), an engine's unified-cache
    linker over a pool of the same model and geometry finds its whole pages
    and loads the prefill's bytes. (The backend named the dtype "auto" where
    the linker names the pool's, bfloat16: every page was a miss.)"""
    from sglang.srt.runtime_context import reset_context

    from linker_stack import Stack, layer_buffers, publish_server_args

    index_for(built, device, kind)
    tokens = list(range(12000, 12000 + 3 * PAGE + 2))
    # The linker's test stack serves model "dummy" (SGLang looks any other
    # name up online when the linker's flags are given).
    pr, dr = pair(built, device, job(kind, tokens, 121, model="dummy"),
                  job(kind, tokens, 121, first_slot_page=20, model="dummy"))
    assert pr["state"] == "success" and dr["state"] == "success", (pr, dr)
    args = publish_server_args(device, PAGE, index="pd")
    try:
        with Stack(args, kind, PAGE) as s:
            hit, slots, _, failed = s.load(tokens, snapshot=False)
            assert hit == 3 * PAGE and failed == [], (hit, failed)
            got = []
            for i in range(3):
                page = int(slots[i * PAGE]) // PAGE
                h = hashlib.sha256()
                for layer in range(s.layers):
                    for buf, _ in layer_buffers(s.pool, layer):
                        h.update(buf[page * PAGE:(page + 1) * PAGE].contiguous().view(torch.uint8).numpy().tobytes())
                got.append(h.hexdigest())
            assert got == pr["digests"][:3]
    finally:
        reset_context()
