"""KV events: token records (an untrusted structure in the tier), what a
stream publishes for a scan, and the scan of real indexes of a real tier.
The wire and Dynamo's indexer are tested in tests_sglang/test_kvevents_real.py."""

import random
import re
import struct

import pytest

import cxltier
from cxltier import _native
from cxltier import tokens as tk
from cxltier.cluster import kvevents as kv
from cxltier.tier import Tier

P = 4


def key(i):
    return bytes([i % 256]) * 32


def test_record_round_trip():
    tokens = [0, 1, 2**32 - 1, 50000]
    raw = tk.encode_record(key(1), key(2), tokens)
    assert len(raw) == tk.record_bytes(len(tokens))
    assert tk.decode_record(raw) == (key(1), key(2), tokens, True)
    assert tk.decode_record(tk.encode_record(key(1), None, tokens)) == (key(1), None, tokens, True)
    assert tk.decode_record(tk.encode_record(key(1), None, tokens, parent_known=False))[3] is False


@pytest.mark.parametrize("page,parent,tokens", [
    (b"short", None, [1]),
    (key(1), b"short", [1]),
    (key(1), None, []),
    (key(1), None, [-1]),
    (key(1), None, [2**32]),
    (key(1), None, [0] * (tk.MAX_TOKENS + 1)),
])
def test_record_refuses_what_it_cannot_hold(page, parent, tokens):
    with pytest.raises(ValueError):
        tk.encode_record(page, parent, tokens)


def damaged(raw, at, value):
    return raw[:at] + value + raw[at + len(value):]


GOOD = tk.encode_record(key(1), key(2), [7, 8, 9, 10])


@pytest.mark.parametrize("raw,what", [
    (GOOD[:10], "shorter than its header"),
    (damaged(GOOD, 0, b"XXXX"), "bad magic"),
    (damaged(GOOD, 4, struct.pack("<H", 9)), "version 9"),
    (damaged(GOOD, 6, struct.pack("<H", 0x80)), "unknown flags"),
    (damaged(GOOD, 8, struct.pack("<I", 5)), "5 tokens"),
    (damaged(GOOD, 8, struct.pack("<I", 0)), "0 tokens"),
    (damaged(GOOD, 8, struct.pack("<I", 2**31)), "tokens in a record"),
    (GOOD + b"\0" * 4, "tokens in a record"),
    (GOOD[:-4], "tokens in a record"),
])
def test_damaged_records_are_errors_naming_the_record(raw, what):
    with pytest.raises(tk.RecordError, match=what) as e:
        tk.decode_record(raw)
    assert "token record" in str(e.value)


def test_random_bytes_never_escape_as_other_errors():
    rng = random.Random(7)
    for n in range(3000):
        raw = bytearray(GOOD if n % 2 else rng.randbytes(rng.randrange(0, 200)))
        for _ in range(rng.randrange(1, 4)):
            if raw:
                raw[rng.randrange(len(raw))] = rng.randrange(256)
        try:
            tk.decode_record(bytes(raw))
        except tk.RecordError:
            pass


def test_block_hash_is_the_keys_first_eight_bytes_signed():
    assert kv.block_hash(bytes.fromhex("00000000000000ff") + bytes(24)) == 255
    assert kv.block_hash(b"\xff" * 32) == -1


def page(h, parent, tokens=None):
    return kv._Page(h, parent, tokens or [h] * P)


def test_publication_orders_parents_first_and_chains_them():
    pub = kv.Publication()
    pages = {1: page(1, None), 2: page(2, 1), 3: page(3, 2), 9: page(9, 1)}
    events, stored, removed = pub.changes(pages)
    assert (stored, removed) == (4, 0)
    seen = set()
    for e in events:
        assert e["type"] == "BlockStored" and e["medium"] == "EXTERNAL" and e["block_size"] == P
        assert e["parent_block_hash"] is None or e["parent_block_hash"] in seen
        assert len(e["token_ids"]) == P * len(e["block_hashes"])
        for a, b in zip(e["block_hashes"], e["block_hashes"][1:]):
            assert pages[b].parent == a  # a multi-block event is a chain
        seen.update(e["block_hashes"])
    assert seen == set(pages)
    assert len(events) == 2  # 1-2-3 (or 1-9) in one event, the other branch in another
    assert pub.changes(pages)[0] == []  # nothing new


def test_publication_holds_pages_whose_parent_is_not_there():
    pub = kv.Publication()
    events, stored, _ = pub.changes({2: page(2, 1), 3: page(3, 2)})
    assert (events, stored) == ([], 0) and set(pub.held) == {2, 3}
    events, stored, _ = pub.changes({1: page(1, None), 2: page(2, 1), 3: page(3, 2)})
    assert stored == 3 and [e["block_hashes"] for e in events] == [[1, 2, 3]]
    assert pub.held == {}


def test_publication_removes_what_went_and_snapshots_what_is_there():
    pub = kv.Publication()
    pub.changes({1: page(1, None), 2: page(2, 1), 3: page(3, 2)})
    events, stored, removed = pub.changes({1: page(1, None)})
    assert (stored, removed) == (0, 2)
    assert events == [{"type": "BlockRemoved", "block_hashes": [2, 3], "medium": "EXTERNAL"}]
    snap = pub.snapshot()
    assert snap[0] == {"type": "AllBlocksCleared"}
    assert [e["block_hashes"] for e in snap[1:]] == [[1]]


def test_publication_clears_all_when_nothing_is_left():
    pub = kv.Publication()
    pub.changes({1: page(1, None), 2: page(2, 1)})
    assert pub.changes({}) == ([{"type": "AllBlocksCleared"}], 0, 2)
    assert pub.changes({})[0] == []
    assert pub.changes({5: page(5, None)})[1] == 1


def test_one_stream_one_tenant():
    kv.one_tenant(["a", "b"], {})
    kv.one_tenant(["a", "b"], {"a": "k", "b": "k"})
    with pytest.raises(ValueError, match="one tenant"):
        kv.one_tenant(["a", "b"], {"a": "k"})
    with pytest.raises(ValueError, match="one tenant"):
        kv.one_tenant(["a", "b"], {"a": "k", "b": "other"})


def stats():
    return dict.fromkeys(("unparented", "damaged"), 0)


def recorded(t, tokens, payload=b"p" * 64):
    """Index "m" of tier t holding the whole pages of tokens (payload
    each) and their token records: (pages, index, recorder, records
    written)."""
    pages = [bytes.fromhex(k) for k in cxltier.page_keys(tokens, P)]
    ix = t.prefix("m", 64, 1024)
    ix.set(pages, [payload] * len(pages))
    rec = tk.TokenRecorder(t, "m", None, 64, P)
    return pages, ix, rec, rec.record(pages, pages, None, tokens)


def test_scan_of_a_real_tier(built, device):
    tokens = list(range(100, 100 + 5 * P))
    with Tier(device, name="server") as t, Tier(device, name="events") as watcher:
        pages, ix, rec, written = recorded(t, tokens)
        assert written == 5
        assert sorted(t.prefix_names()) == ["m", "m" + tk.TOKENS_SUFFIX]
        w = kv._Watched(watcher, "m", None)
        s = stats()
        now = w.scan(s)
        assert set(now) == {kv.block_hash(p) for p in pages}
        assert now[kv.block_hash(pages[2])].parent == kv.block_hash(pages[1])
        assert now[kv.block_hash(pages[2])].tokens == tokens[2 * P : 3 * P]
        assert now[kv.block_hash(pages[0])].parent is None

        ix.delete(pages[3:])
        assert set(w.scan(s)) == {kv.block_hash(p) for p in pages[:3]}
        w.scan(s)
        assert rec.index.has(pages[3:]) == [True, True]  # the records stay: the token index evicts, LRU
        # The pages stored again, by a server whose recorder found their
        # records present and wrote none (the race a deletion lost): they
        # are announced again. (Records absent two scans were deleted, and
        # such a page was held, never announced.)
        ix.set(pages[3:], [b"p" * 64] * 2)
        assert set(w.scan(s)) == {kv.block_hash(p) for p in pages}

        # A damaged record and one without its parent are skipped and counted, never raised.
        other = [bytes.fromhex(k) for k in cxltier.page_keys(range(900, 900 + 2 * P), P)]
        ix.set(other, [b"q" * 64] * 2)
        rec.index.set([other[0]], [b"garbage that is no record"])
        rec.index.set([other[1]], [tk.encode_record(other[1], None, list(range(P)), parent_known=False)])
        assert set(w.scan(s)) == {kv.block_hash(p) for p in pages}
        assert s == {"damaged": 1, "unparented": 1}
        w.close()
        rec.close()


def test_set_with_tokens_is_what_the_stream_publishes(built, device):
    """The public way to record tokens: PrefixIndex.set(keys, payloads,
    tokens=..., parent=...), for programs that store pages without SGLang."""
    tokens = list(range(500, 500 + 6 * P))
    pages = [bytes.fromhex(k) for k in cxltier.page_keys(tokens, P)]
    per_page = [tokens[i * P : (i + 1) * P] for i in range(6)]
    with Tier(device, name="server") as t, Tier(device, name="events") as watcher:
        ix = t.prefix("m", 64, 1024)
        assert ix.set([p.hex() for p in pages[:3]], [b"p" * 64] * 3, tokens=per_page[:3]) == ["stored"] * 3
        # The rest of the sequence in a second call, chained to the first by parent.
        ix.set(pages[3:], [b"p" * 64] * 3, tokens=per_page[3:], parent=pages[2].hex())
        w = kv._Watched(watcher, "m", None)
        now = w.scan(stats())
        assert set(now) == {kv.block_hash(p) for p in pages}
        for i, p in enumerate(pages):
            assert now[kv.block_hash(p)].tokens == per_page[i]
            assert now[kv.block_hash(p)].parent == (None if i == 0 else kv.block_hash(pages[i - 1]))
        w.close()
        ix.close()


@pytest.mark.parametrize("tokens,parent,what", [
    ([[1, 2, 3, 4]], None, "2 keys but tokens for 1 pages"),
    ([[1, 2, 3, 4], [1, 2]], None, "page 1 has 2 tokens, page 0 4"),
    ([[], []], None, "pages of 0 tokens"),
    ([[1, 2, 3, 4], [1, 2, 3, -1]], None, "page 1 holds -1"),
    ([[1, 2, 3, 4], [1, 2, 3, 1 << 32]], None, "outside 0..2^32-1"),
    ([[1, 2, 3, 4], [5, 6, 7, 8]], "abc", "not a hex digest"),
])
def test_set_refuses_bad_tokens_before_storing(built, device, tokens, parent, what):
    with Tier(device) as t:
        ix = t.prefix("m", 64, 1024)
        with pytest.raises(ValueError, match=re.escape(what)):
            ix.set([key(1), key(2)], [b"x"] * 2, tokens=tokens, parent=parent)
        assert ix.exists([key(1)]) == 0
        assert t.prefix_names() == ["m"]
        ix.close()


def test_keyed_index_is_not_listed_without_its_key(built, device):
    with Tier(device, name="server") as t, Tier(device, name="events") as watcher:
        t.prefix("acme", 64, 1024, key="secret")
        tk.TokenRecorder(t, "acme", "secret", 64, P)
        with pytest.raises(cxltier.DeniedError):
            kv._Watched(watcher, "acme", None)
        w = kv._Watched(watcher, "acme", "secret")
        assert w.scan(stats()) == {}
        w.close()


def test_scanner_survives_an_index_destroyed_and_made_again(built, device, cli):
    import subprocess

    tokens = list(range(7, 7 + 3 * P))

    def make(t):
        _, ix, rec, _ = recorded(t, tokens, b"p")
        return ix, rec

    with Tier(device, name="server") as t, Tier(device, name="events") as w1, Tier(device, name="events") as w2:
        ix, rec = make(t)
        scanners = [kv.Scanner(w1), kv.Scanner(w2, names=["m"])]  # found by listing, and named
        assert [len(sc.scan(stats())) for sc in scanners] == [3, 3]
        ix.close()
        rec.close()
        for name in ("m", "m" + tk.TOKENS_SUFFIX):
            subprocess.check_call([cli, "prefix", "destroy", "--name", name, device], stdout=subprocess.DEVNULL)
        assert [sc.scan(stats()) for sc in scanners] == [{}, {}]  # gone, and the scanners go on
        make(t)
        assert [len(sc.scan(stats())) for sc in scanners] == [3, 3]  # made again: found afresh
        for sc in scanners:
            sc.close()


def test_a_busy_index_keeps_its_last_scan(built, device, monkeypatch):
    """An index busy for one scan (CXL_EBUSY: a lock another client holds)
    is as it was: its pages are not published as removed and then stored
    again; its last good scan stands."""
    tokens = list(range(300, 300 + 3 * P))
    with Tier(device, name="server") as t, Tier(device, name="events") as watcher:
        _, _, rec, _ = recorded(t, tokens)
        sc, pub = kv.Scanner(watcher, names=["m"]), kv.Publication()
        events, stored, removed = pub.changes(sc.scan(stats()))
        assert (stored, removed) == (3, 0)
        real_scan = kv._Watched.scan

        def busy_once(self, st):
            monkeypatch.setattr(kv._Watched, "scan", real_scan)
            raise _native.BusyError(-9, "index m: lock held by client slot 3 (a fault injected by the test)")

        monkeypatch.setattr(kv._Watched, "scan", busy_once)
        events, stored, removed = pub.changes(sc.scan(stats()))
        assert (events, stored, removed) == ([], 0, 0)
        events, stored, removed = pub.changes(sc.scan(stats()))
        assert (events, stored, removed) == ([], 0, 0)  # and after it, nothing to make up for
        sc.close()
        rec.close()


def test_replay_from_the_buffer_and_its_edges():
    """A replay from exactly the oldest buffered batch is answered from the
    buffer (every batch from it on), from an older one with the current
    contents (None here), from past the newest with nothing."""
    from collections import deque

    buffer = deque([(s, b"batch %d" % s) for s in range(100, 105)], maxlen=5)
    assert kv.replay_from(buffer, 100) == list(buffer)
    assert kv.replay_from(buffer, 103) == list(buffer)[3:]
    assert kv.replay_from(buffer, 99) is None
    assert kv.replay_from(buffer, 105) == []
    assert kv.replay_from(deque(), 0) is None


def test_events_cli_reads_both_encodings():
    """cxltier-events prints a batch as cxltier's stream sends it (events as
    maps) and as SGLang's publisher does (tagged arrays); the doc test runs
    it against a real uplink's stream."""
    from cxltier.cluster import events_cli

    stored = {"type": "BlockStored", "block_hashes": [1, -2], "parent_block_hash": None,
              "token_ids": list(range(8)), "block_size": 4, "lora_id": None, "medium": "EXTERNAL"}
    as_array = ["BlockStored", [1, -2], None, list(range(8)), 4, None, "EXTERNAL"]
    for event in (stored, as_array):
        lines, n = events_cli.describe(7, [1.0, [event], None])
        assert n == 2
        assert lines == ["seq 7: BlockStored 2 page(s) 0000000000000001 fffffffffffffffe parent -, "
                         "8 tokens: 0 1 2 3 4 5 ..."]
    lines, n = events_cli.describe(8, [1.0, [{"type": "BlockRemoved", "block_hashes": [3]}, ["AllBlocksCleared"]], None])
    assert (lines, n) == (["seq 8: BlockRemoved 1 page(s) 0000000000000003", "seq 8: AllBlocksCleared"], 0)
    assert events_cli.describe(9, {"not": "a batch"}) == (["seq 9: not a KVEventBatch (dict)"], 0)

