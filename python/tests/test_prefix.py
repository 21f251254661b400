import ctypes
import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

import cxltier

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def get_hash_str(token_ids, prior_hash=None):
    """SGLang's page hash as sglang.md §2 specifies it."""
    h = hashlib.sha256()
    if prior_hash:
        h.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        h.update(t.to_bytes(4, byteorder="little", signed=False))
    return h.hexdigest()


def payload(i, n):
    return bytes((i * 7 + j) % 251 for j in range(n))


def test_page_keys_match_sglang(built):
    tokens = list(range(1000, 1037))
    keys = cxltier.page_keys(tokens, 8)
    want, prior = [], None
    for p in range(0, len(tokens) // 8 * 8, 8):
        prior = get_hash_str(tokens[p : p + 8], prior)
        want.append(prior)
    assert keys == want  # the short last page gets no key
    assert cxltier.page_keys(tokens[8:16], 8, prior=want[0]) == [want[1]]
    with open(os.path.join(REPO, "prefix", "testdata", "keys.json")) as f:
        for case in json.load(f):
            assert cxltier.page_keys(case["tokens"], case["page_size"], prior=case["prior"] or None) == case["keys"]


def test_batch_exists_counts_leading_keys(built, device):
    with cxltier.Tier(device) as t:
        ix = t.prefix("m", blocks=16, block_bytes=4096)
        keys = cxltier.page_keys(range(40), 4)
        assert ix.exists(keys) == 0
        st = ix.set([keys[0], keys[1], keys[3]], [payload(0, 100), payload(1, 100), payload(3, 100)])
        assert st == ["stored"] * 3
        assert ix.exists(keys) == 2  # keys[2] is missing: counting stops there
        assert ix.exists(keys[3:4]) == 1
        assert ix.set([keys[0]], [b"other"]) == ["present"]
        assert ix.delete([keys[1]]) == 1
        assert ix.exists(keys) == 1


def test_key_lists_of_every_form(built, device):
    """Hex digests, raw 32-byte keys, both mixed, a generator: the same
    answer (whole lists take a faster route); a bad key is named."""
    with cxltier.Tier(device) as t:
        ix = t.prefix("m", blocks=16, block_bytes=4096)
        keys = cxltier.page_keys(range(40), 4)
        ix.set(keys[:5], [payload(i, 10) for i in range(5)])
        raw = [bytes.fromhex(k) for k in keys]
        for form in (keys, raw, tuple(keys), [keys[0], raw[1]] + keys[2:], (k for k in keys), [k.upper() for k in keys]):
            assert ix.exists(form) == 5
        with pytest.raises(ValueError, match="not a hex digest"):
            ix.exists(keys[:3] + ["zz" * 32])
        with pytest.raises(ValueError, match="31 bytes"):
            ix.exists(raw[:3] + [raw[3][:31]])
        assert ix.exists([]) == 0


def test_get_into_buffers_and_pointers(built, device):
    with cxltier.Tier(device) as t:
        ix = t.prefix("m", blocks=8, block_bytes=4096)
        keys = [cxltier.string_key(f"page-{i}") for i in range(4)]
        ix.set(keys, [payload(i, 1000 + i) for i in range(4)])
        bufs = [bytearray(4096) for _ in range(4)]
        served, lens = ix.get(keys, bufs)
        assert served == 4 and lens == [1000, 1001, 1002, 1003]
        assert all(bytes(bufs[i][: lens[i]]) == payload(i, 1000 + i) for i in range(4))
        # zero copy: (address, capacity) pairs, as HiCache's page pointers
        raw = [ctypes.create_string_buffer(4096) for _ in range(2)]
        served, lens = ix.get(keys[:2], [(ctypes.addressof(b), 4096) for b in raw])
        assert served == 2 and raw[1].raw[:1001] == payload(1, 1001)
        ix.set([cxltier.string_key("ptr")], [(ctypes.addressof(raw[0]), 1000)])
        out = bytearray(1000)
        assert ix.get([cxltier.string_key("ptr")], [out])[0] == 1
        assert bytes(out) == payload(0, 1000)
        st = ix.stats()
        assert st["ready"] == 5 and st["hits"] >= 7


WRITER = textwrap.dedent(
    """
    import sys, cxltier
    t = cxltier.Tier(sys.argv[1], name="writer")
    ix = t.prefix("shared", blocks=32, block_bytes=8192)
    keys = cxltier.page_keys(range(100, 164), 4)
    print(ix.set(keys, [bytes([i]) * (4096 + i) for i in range(len(keys))]).count("stored"))
    t.close()
    """
)

READER = textwrap.dedent(
    """
    import sys, cxltier
    t = cxltier.Tier(sys.argv[1], name="reader")
    ix = t.prefix("shared")
    keys = cxltier.page_keys(range(100, 164), 4)
    bufs = [bytearray(8192) for _ in keys]
    served, lens = ix.get(keys, bufs)
    ok = all(bytes(bufs[i][: lens[i]]) == bytes([i]) * (4096 + i) for i in range(served))
    print(ix.exists(keys), served, ok)
    """
)


def test_roundtrip_between_two_processes(built, device):
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
    w = subprocess.run([sys.executable, "-c", WRITER, device], env=env, capture_output=True, text=True, timeout=60)
    assert w.returncode == 0, w.stderr
    assert w.stdout.split() == ["16"]
    r = subprocess.run([sys.executable, "-c", READER, device], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["16", "16", "True"]


def test_verify_reads_can_be_turned_off(built, device):
    """The switch reaches the library and gets work both ways (what it
    changes, a damaged payload let through, is tested in Go)."""
    import cxltier

    with cxltier.Tier(device) as t:
        idx = t.prefix("v", blocks=4, block_bytes=64)
        key = "ab" * 32
        assert idx.set([key], [b"x" * 64]) == ["stored"]
        buf = bytearray(64)
        idx.verify_reads(False)
        assert idx.get([key], [buf])[0] == 1 and bytes(buf) == b"x" * 64
        idx.verify_reads(True)
        assert idx.get([key], [buf])[0] == 1


def test_exists_pages_counts_pages_with_every_part(built, device):
    """exists_pages agrees with probing part_keys, stops at the first page
    missing a part, and takes pages holding a NUL by the other route."""
    import hashlib

    import cxltier
    from cxltier.prefix import part_keys, part_mask

    masks = [part_mask("m/kv/LTD/k"), part_mask("m/kv/LTD/v")]
    pages = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(6)] + ["odd\0page"]
    with cxltier.Tier(device) as t:
        idx = t.prefix("pages", blocks=64, block_bytes=64)
        keys = part_keys(pages, masks)
        hexes = [keys.hex(i) for i in range(len(keys))]
        assert idx.set(hexes[:8] + hexes[9:], [b"x"] * 13) == ["stored"] * 13  # page 4 lacks its K part
        assert idx.exists_pages(pages, masks) == 4
        assert idx.exists_pages(pages[:4] + pages[5:], masks) == 6  # every page complete, the NUL one too
        assert idx.exists_pages(pages, []) == 0
        assert idx.exists_block(part_keys(pages[:4], masks)) == 8


def key_block(keys):
    raw = b"".join(bytes.fromhex(k) for k in keys)
    return cxltier.prefix.KeyBlock((ctypes.c_uint8 * len(raw)).from_buffer_copy(raw), len(keys))


def test_kept_entries_outlive_eviction_until_released(built, device):
    """keep_block pins what is there (a missing key between skipped), counts
    no hit, and no insert evicts a kept entry until it is released."""
    with cxltier.Tier(device) as t:
        ix = t.prefix("m", blocks=4, block_bytes=4096)
        keys = cxltier.page_keys(range(80), 4)
        assert ix.set(keys[:2], [payload(i, 100) for i in range(2)]) == ["stored"] * 2
        hits = ix.stats()["hits"]
        kept = ix.keep_block(key_block([keys[0], keys[10], keys[1]]))
        assert kept.present == [True, False, True]
        assert ix.stats()["hits"] == hits
        for i in range(2, 12):  # ten more entries through a 4-block index
            ix.set([keys[i]], [payload(i, 100)])
        assert ix.has(keys[:2]) == [True, True]
        kept.release()
        kept.release()  # a second release is nothing
        for i in range(12, 20):
            ix.set([keys[i]], [payload(i, 100)])
        assert ix.has(keys[:2]) == [False, False]
