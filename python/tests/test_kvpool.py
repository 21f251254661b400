"""KV pools (cxltier.kvpool): paged buffers stored a page per entry and
loaded a layer at a time, against the real library and tier; the buffers
are host memory here (the cpu engine), as on a machine without a GPU."""

import ctypes
import mmap

import pytest

import cxltier
from cxltier.kvpool import KVPool
from cxltier.prefix import part_keys, string_key
from forge_page import forge

LAYERS, PAGES, CHUNK = 2, 8, 64


def buffers():
    """K and V of each layer: PAGES pages of CHUNK bytes, each byte naming
    its buffer, page and offset."""
    out = []
    for b in range(2 * LAYERS):
        buf = (ctypes.c_uint8 * (PAGES * CHUNK))(*((b * 53 + i * 7 + i // CHUNK) % 256 for i in range(PAGES * CHUNK)))
        out.append(buf)
    return out


def page(buf, p):
    return bytes(buf[p * CHUNK : (p + 1) * CHUNK])


def pool_on(index, bufs, **kw):
    return KVPool(index, [(ctypes.addressof(b), len(b)) for b in bufs], 2, CHUNK, CHUNK, **kw)


def keys(*names):
    return part_keys([string_key(n).hex() for n in names], [string_key("mask")])


@pytest.fixture
def index(built, device):
    t = cxltier.Tier(device)
    ix = t.prefix("kv", 32, 2 * LAYERS * CHUNK)
    yield ix
    t.close()


def test_store_then_load_layer_by_layer(index):
    bufs = buffers()
    pool = pool_on(index, bufs)
    assert pool.layers == LAYERS and pool.page_bytes == 2 * LAYERS * CHUNK
    assert pool.store(keys("a", "b"), [0, 1]) == ["stored", "stored"]
    assert pool.store(keys("a"), [2]) == ["present"]
    load = pool.load(keys("a", "b"), [5, 6])
    for layer in range(LAYERS):
        load.layer(layer)
        for b, buf in enumerate(bufs):
            landed = page(buf, 5) == page(buf, 0) and page(buf, 6) == page(buf, 1)
            # the layers so far, and perhaps the one queued ahead
            assert landed if b // 2 <= layer else (not landed or b // 2 == layer + 1), (layer, b)
    load.close()
    pool.close()


def test_get_lands_whole_pages_all_or_none(index):
    """get lands every page whole with one call, or none: a batch with a
    key that is not there copies nothing; a damaged page fails it and is
    dropped, and the other pages of the batch stay served."""
    bufs = buffers()
    pool = pool_on(index, bufs)
    assert pool.store(keys("a", "b"), [0, 1]) == ["stored", "stored"]
    pool.get(keys("a", "b"), [5, 6])
    assert all(page(buf, 5) == page(buf, 0) and page(buf, 6) == page(buf, 1) for buf in bufs)
    before = [page(buf, 7) for buf in bufs]
    with pytest.raises(cxltier.NotFoundError):
        pool.get(keys("a", "missing"), [7, 4])
    assert [page(buf, 7) for buf in bufs] == before  # nothing copied
    with pytest.raises(ValueError):
        pool.get(keys("a"), [1, 2])
    pool.close()


def test_get_of_a_damaged_page_fails_and_drops_it(index, device):
    bufs = buffers()
    pool = pool_on(index, bufs)
    pool.store(keys("a", "b"), [2, 3])
    needle = page(bufs[1], 3)
    with open("/dev/shm/" + device.split(":", 1)[1], "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        at = m.find(needle)
        assert at >= 0
        m[at + 5] ^= 0x10
    with pytest.raises(cxltier.ChecksumError):
        pool.get(keys("a", "b"), [4, 5])
    assert index.exists_block(keys("a", "b")) == 1  # b dropped, a kept
    pool.get(keys("a"), [6])
    pool.close()


def test_refusals(index):
    bufs = buffers()
    with pytest.raises(ValueError):
        KVPool(index, [(ctypes.addressof(bufs[0]), len(bufs[0]))] * 3, 2, CHUNK, CHUNK)
    with pytest.raises(cxltier.InvalidError):
        KVPool(index, [(ctypes.addressof(b), len(b)) for b in bufs], 2, CHUNK, CHUNK // 2)
    with pytest.raises(cxltier.InvalidError):
        KVPool(index, [(ctypes.addressof(b), 16) for b in bufs], 2, CHUNK, CHUNK)
    pool = pool_on(index, bufs)
    with pytest.raises(cxltier.InvalidError):
        pool.store(keys("a"), [PAGES])  # past the buffers' end
    with pytest.raises(cxltier.NotFoundError):
        pool.load(keys("missing"), [0])
    pool.store(keys("a"), [0])
    load = pool.load(keys("a"), [3])
    with pytest.raises(cxltier.InvalidError):
        load.layer(1)  # layers go in order
    load.layer(0)
    with pytest.raises(cxltier.InvalidError):
        load.close()  # stopped before its last layer
    big = cxltier.Tier(index._tier.devices)
    try:
        small = big.prefix("small", 8, CHUNK)
        with pytest.raises(cxltier.InvalidError):
            pool_on(small, bufs).store(keys("a"), [0])  # a page is larger than a block
    finally:
        big.close()
    pool.close()


def test_closing_the_pool_closes_its_loads(index):
    bufs = buffers()
    pool = pool_on(index, bufs)
    pool.store(keys("a"), [0])
    load = pool.load(keys("a"), [1])
    pool.close()
    with pytest.raises(cxltier.ClosedError):
        load.layer(0)
    load.close()
    assert index.delete([keys("a").hex(0)]) == 1  # no pin left behind


def test_damaged_page_fails_the_last_layer_and_is_dropped(index, device):
    bufs = buffers()
    pool = pool_on(index, bufs)
    pool.store(keys("a"), [3])
    needle = page(bufs[2 * LAYERS - 1], 3)
    with open("/dev/shm/" + device.split(":", 1)[1], "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        at = m.find(needle)
        assert at >= 0
        m[at + 9] ^= 0x01
    load = pool.load(keys("a"), [4])
    for layer in range(LAYERS - 1):
        load.layer(layer)
    with pytest.raises(cxltier.ChecksumError):
        load.layer(LAYERS - 1)
    with pytest.raises(cxltier.ChecksumError):
        load.close()
    assert index.exists_block(keys("a")) == 0
    pool.close()


@pytest.mark.parametrize("key", [None, "tenant-a"])
def test_a_page_forged_without_the_key(built, device, key):
    """A page replaced in the tier by a process without the key, with a
    valid checksum: a keyed index's load refuses it (its signature fails,
    a ChecksumError as for damage) and drops it; an index without a key
    trusts every writer of its tier and lands the forged bytes
    (docs/operations.md, Tenants). The forger is forge_page.py, a process
    of its own without the key."""
    t = cxltier.Tier(device)
    try:
        index = t.prefix("kv", 32, 2 * LAYERS * CHUNK, key=key)
        bufs = buffers()
        pool = pool_on(index, bufs)
        pool.store(keys("a"), [3])
        stored = b"".join(page(b, 3) for b in bufs)
        forged = bytes((x ^ 0xA5) for x in stored)
        forge("/dev/shm/" + device.split(":", 1)[1], bytes.fromhex(keys("a").hex(0)), stored, forged)
        load = pool.load(keys("a"), [4])
        if key is None:
            for layer in range(LAYERS):
                load.layer(layer)
            load.close()
            assert b"".join(page(b, 4) for b in bufs) == forged
        else:
            for layer in range(LAYERS - 1):
                load.layer(layer)
            with pytest.raises(cxltier.ChecksumError, match="not signed"):
                load.layer(LAYERS - 1)
            with pytest.raises(cxltier.ChecksumError):
                load.close()
            assert index.exists_block(keys("a")) == 0
            assert pool.store(keys("a"), [3]) == ["stored"]  # the key's holder stores it again
            load = pool.load(keys("a"), [5])
            for layer in range(LAYERS):
                load.layer(layer)
            load.close()
            assert b"".join(page(b, 5) for b in bufs) == stored
        pool.close()
    finally:
        t.close()


def test_detaching_with_an_open_load_returns(built, device):
    """Tier.close() while a pool has a layer-wise load open closes them and
    returns, 100 times over (it hung the whole library in about half the
    runs: the detach held the handle table's lock while the pool's close
    took it again). Run in a child process with a deadline, so a hang fails
    the test instead of the suite."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import ctypes, sys
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        import cxltier
        from cxltier.kvpool import KVPool
        from cxltier.prefix import part_keys, string_key
        bufs = [(ctypes.c_uint8 * (8 * 64))() for _ in range(4)]
        ks = part_keys([string_key("a").hex()], [string_key("mask")])
        for run in range(100):
            t = cxltier.Tier({device!r})
            ix = t.prefix("detach-{{}}".format(run % 4), 8, 4 * 64)
            pool = KVPool(ix, [(ctypes.addressof(b), len(b)) for b in bufs], 2, 64, 64)
            pool.store(ks, [0])
            load = pool.load(ks, [1])
            t.close()
        print("ok", flush=True)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, CXLTIER_LIB=built["lib"]))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_bulk_priority_from_the_environment_without_the_link(device):
    """CXLTIER_BULK_PRIORITY alone lowers the stores' threads at attach,
    without joining a link, and every page still lands; a bad name fails
    the attach, naming the setting."""
    import os

    bufs = buffers()
    os.environ["CXLTIER_BULK_PRIORITY"] = "idle"
    try:
        t = cxltier.Tier(device)
    finally:
        del os.environ["CXLTIER_BULK_PRIORITY"]
    try:
        assert t.link is None
        assert t.bulk_priority() == {"wanted": "idle", "engines": []}  # no pool yet: none open
        pool = pool_on(t.prefix("kv-bulk-env", 8, 2 * LAYERS * CHUNK), bufs)
        assert t.bulk_priority() == {"wanted": "idle", "engines": ["idle"]}
        assert pool.store(keys("a"), [0]) == ["stored"]
        pool.get(keys("a"), [5])
        assert all(page(buf, 5) == page(buf, 0) for buf in bufs)
        pool.close()
    finally:
        t.close()
    os.environ["CXLTIER_BULK_PRIORITY"] = "high"
    try:
        with pytest.raises(cxltier.InvalidError, match="bulk priority"):
            cxltier.Tier(device)
    finally:
        del os.environ["CXLTIER_BULK_PRIORITY"]


def test_a_pool_on_a_tier_that_joined_the_link(built, device):
    """With CXLTIER_LINK set every Tier joins its node's link arbiter at
    attach: a pool's stores and loads move as bulk pieces counted in the
    link's table, which another process joining shows too; joining another
    link, or reading a table that is not there, is refused."""
    import json
    import os
    import subprocess
    import sys
    import textwrap

    bufs = buffers()
    os.environ["CXLTIER_LINK"] = "1"
    try:
        t = cxltier.Tier(device)
    finally:
        del os.environ["CXLTIER_LINK"]
    try:
        assert t.link.startswith("node"), t.link
        assert t.join_link() == t.link  # joining again: nothing changes
        with pytest.raises(cxltier.InvalidError):
            t.join_link("another")
        ix = t.prefix("kv", 32, 2 * LAYERS * CHUNK)
        pool = pool_on(ix, bufs)
        assert pool.store(keys("a", "b"), [0, 1]) == ["stored", "stored"]
        pool.get(keys("a", "b"), [5, 6])
        assert all(page(buf, 5) == page(buf, 0) and page(buf, 6) == page(buf, 1) for buf in bufs)
        st = t.link_stats()
        assert st["name"] == t.link and st["processes"] == 1, st
        assert st["bulk_bytes"] == 4 * pool.page_bytes, st  # two pages stored, two landed: the CPU engine's are bulk
        assert st["first_token_transfers"] == 0 and st["claims"] == 0 and st["bulk_waits"] == 0, st
        pool.first_token(stores=True)  # the loads' class, bulk here: nothing changes
        assert pool.store(keys("c"), [2]) == ["stored"]
        pool.first_token(True, stores=True)  # a request's loads go ahead of stores; these stores too (a prefill's)
        pool.get(keys("a", "c"), [5, 6])
        assert pool.store(keys("d"), [3]) == ["stored"]
        pool.first_token(None, stores=False)  # the loads as they are, the stores bulk again
        assert pool.store(keys("e"), [4]) == ["stored"]
        pool.first_token(False)
        pool.get(keys("a"), [5])
        st = t.link_stats()
        assert st["first_token_bytes"] == 3 * pool.page_bytes, st  # a load of two, a store of one
        assert st["first_token_transfers"] == 2 and st["first_token_misses"] == 0, st
        assert st["bulk_bytes"] == 7 * pool.page_bytes, st  # and four more stores and loads of one page each
        # Joining lowered the threads that copy the stores (nice 19); the
        # stores above went through them and every page still landed.
        assert t.bulk_priority() == {"wanted": "low", "engines": ["low"]}
        assert t.bulk_priority("idle") == {"wanted": "idle", "engines": ["idle"]}
        assert pool.store(keys("f"), [7]) == ["stored"]
        pool.get(keys("f"), [5])
        assert all(page(buf, 5) == page(buf, 7) for buf in bufs)
        assert t.bulk_priority("normal")["engines"] == ["normal"]
        with pytest.raises(cxltier.InvalidError):
            t.bulk_priority("high")
        st = t.link_stats()
        assert st["bulk_bytes"] == 9 * pool.page_bytes, st
        t.link_turn(1000)  # a piece another transfer engine writes (the uplink's fills)
        assert t.link_stats()["bulk_bytes"] == 9 * pool.page_bytes + 1000
        with pytest.raises(cxltier.InvalidError):
            t.link_turn(-1)

        # Another process on the same link: the table counts both while both run.
        code = textwrap.dedent(f"""
            import json, sys
            sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
            import cxltier
            t = cxltier.Tier({device!r})
            print(json.dumps(t.link_stats()), flush=True)
            sys.stdin.readline()
        """)
        child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                 env=dict(os.environ, CXLTIER_LIB=built["lib"], CXLTIER_LINK=t.link))
        try:
            seen = json.loads(child.stdout.readline())
            assert seen["processes"] == 2 and seen["bulk_bytes"] == 9 * pool.page_bytes + 1000, seen
        finally:
            child.communicate("\n", timeout=60)
        assert child.returncode == 0
        assert t.link_stats()["processes"] == 1  # the child's seat went with it
        with pytest.raises(cxltier.NotFoundError):
            t.link_stats("missing")
        pool.close()
    finally:
        t.close()
    plain = cxltier.Tier(device)
    with pytest.raises(ValueError):
        plain.link_stats()  # joined none, named none
    plain.link_turn(1 << 20)  # no link: nothing to wait for
    plain.close()
