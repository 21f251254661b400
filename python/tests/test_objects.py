"""Named tier objects through the Python package and the real library:
several processes, read-only views, gathers, holds and removal."""

import subprocess
import sys
import textwrap

import array
import random
import pytest

import cxltier
from cxltier import objects


def test_object_outlives_its_process_and_is_shared(built, device):
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(__import__('os').path.dirname(objects.__file__) + '/..')!r})
        import ctypes, cxltier
        from cxltier import objects
        t = cxltier.Tier({device!r})
        o = objects.TierObject.create(t, "table", 1_000_000)
        buf = o.buffer()
        for i in range(0, 1_000_000, 997):
            buf[i] = i % 251
        o.seal("made by a child")
    """)
    subprocess.run([sys.executable, "-c", code], check=True)  # exits without closing anything
    t = cxltier.Tier(device)
    info = objects.object_info(t, "table")
    assert info["state"] == "sealed" and info["label"] == "made by a child" and info["size"] == 1_000_000
    with objects.TierObject.open(t, "table", read_only=True) as o:
        assert o.read_only
        data = o.buffer()
        assert all(data[i] == i % 251 for i in range(0, 1_000_000, 997))
        with pytest.raises(TypeError):  # read-only: refused, where a store would fault the process
            data[0] = 1
        o.verify()
        assert objects.object_info(t, "table")["holders"] == 1
        with pytest.raises(cxltier.ExistsError, match="live clients hold it"):
            objects.remove_object(t, "table")
        del data  # the object stays open (and held) while a buffer over it lives
    objects.remove_object(t, "table")
    with pytest.raises(cxltier.NotFoundError):
        objects.object_info(t, "table")
    t.close()


def test_gather_rows_of_a_plane(built, device):
    t = cxltier.Tier(device)
    rows, dim, scales = 1000, 256, 8
    with objects.TierObject.create(t, "planes", rows * (dim + scales)) as o:
        raw = o.buffer()
        rng = random.Random(1)
        raw[:] = bytes(rng.randrange(256) for _ in range(len(raw)))
        ids = array.array("q", [0, 999, 5, 5, 17])
        w = bytearray(len(ids) * dim)
        s = bytearray(len(ids) * scales)
        o.gather(0, dim, rows, ids, w)
        o.gather(rows * dim, scales, rows, ids, s)
        for k, i in enumerate(ids):
            assert w[k * dim:(k + 1) * dim] == bytes(raw[i * dim:(i + 1) * dim])
            at = rows * dim + i * scales
            assert s[k * scales:(k + 1) * scales] == bytes(raw[at:at + scales])
        with pytest.raises(cxltier.InvalidError, match="outside"):
            o.gather(0, dim, rows, array.array("q", [1000]), w)
        with pytest.raises(cxltier.InvalidError, match="do not fit"):
            o.gather(rows * dim, scales, rows + 1, ids, s)
        with pytest.raises(cxltier.CxlTierError):
            o.gather(0, dim, rows, ids, bytearray(10))
        # Both planes in one call, into one buffer: plane after plane.
        for threads in (0, 1, 2):
            out = bytearray(len(ids) * (dim + scales))
            both = o.gatherer([(0, dim), (rows * dim, scales)], rows, threads=threads)
            both(ids, out)
            assert out[: len(w)] == w and out[len(w):] == s
        with pytest.raises(cxltier.RangeError, match=r"need 1320 bytes, out has 1319"):
            both(ids, bytearray(len(out) - 1))
        torch = pytest.importorskip("torch")
        with pytest.raises(cxltier.InvalidError, match="integers, not torch.float64"):
            both(torch.zeros(3, dtype=torch.float64), out)
        with pytest.raises(cxltier.InvalidError, match="contiguous CPU tensor"):
            both(torch.arange(10)[::2], out)
        with pytest.raises(cxltier.InvalidError, match="threads"):
            o.gatherer([(0, dim)], rows, threads=-1)
        # A large call (split across threads in chunks) agrees with a
        # plain copy, and a bad id anywhere leaves the output unwritten.
        big = array.array("q", (rng.randrange(rows) for _ in range(20000)))
        out = bytearray(len(big) * (dim + scales))
        o.gatherer([(0, dim), (rows * dim, scales)], rows, threads=2)(big, out)
        raw_b = bytes(raw)
        for k in (0, 511, 512, 4097, 19999):
            i = big[k]
            assert out[k * dim:(k + 1) * dim] == raw_b[i * dim:(i + 1) * dim]
            at = len(big) * dim + k * scales
            assert out[at:at + scales] == raw_b[rows * dim + i * scales: rows * dim + (i + 1) * scales]
        big[15000] = rows
        fresh = bytearray(len(out))
        with pytest.raises(cxltier.InvalidError, match=r"id 1000 \(position 15000\) outside"):
            o.gatherer([(0, dim), (rows * dim, scales)], rows, threads=2)(big, fresh)
        assert fresh == bytearray(len(out))
        with pytest.raises(cxltier.InvalidError, match="8-byte"):
            o.gather(0, dim, rows, array.array("i", ids), w)
    t.close()


def test_bad_names_and_sizes(built, device):
    t = cxltier.Tier(device)
    with pytest.raises(cxltier.InvalidError):
        objects.TierObject.create(t, "", 10)
    with pytest.raises(cxltier.InvalidError):
        objects.TierObject.create(t, "x", 0)
    with pytest.raises(cxltier.NoSpaceError):
        objects.TierObject.create(t, "x", 1 << 40)
    with pytest.raises(cxltier.NotFoundError):
        objects.TierObject.open(t, "missing")
    objects.TierObject.create(t, "x", 10).close()
    with pytest.raises(cxltier.ExistsError):
        objects.TierObject.create(t, "x", 10)
    assert [o["name"] for o in objects.list_objects(t)] == ["x"]
    t.close()


def test_one_loader_at_a_time(built, device, monkeypatch):
    """The process that creates a table loads it; a second loader (another
    server starting beside it) is refused, or with engram_host's wait
    attaches once the first seals; a loader that ended holds nothing."""
    import threading
    import time

    from cxltier.sglang import engram_host

    first, second = cxltier.Tier(device, name="first"), cxltier.Tier(device, name="second")
    try:
        objects.TierObject.create(first, "engram/m/t", 4096).close()
        with pytest.raises(cxltier.ExistsError, match="is loading it"):
            objects.claim_load(second, "engram/m/t")

        waiter = object.__new__(engram_host.TierHostTable)
        waiter.name = "engram/m/t"
        done = []
        monkeypatch.setenv("CXLTIER_ENGRAM_LOAD_WAIT", "20")
        th = threading.Thread(target=lambda: done.append(waiter._claim_or_wait(second) or time.monotonic()))
        th.start()
        time.sleep(0.5)
        assert not done, "the second loader went ahead while the first loaded"
        sealed_at = time.monotonic()
        with objects.TierObject.open(first, "engram/m/t") as o:
            o.seal("first's checkpoint")
        th.join(10)
        assert done and done[0] >= sealed_at
        assert objects.object_info(second, "engram/m/t")["state"] == "sealed"

        monkeypatch.setenv("CXLTIER_ENGRAM_LOAD_WAIT", "0.3")
        objects.TierObject.create(first, "engram/m/u", 4096).close()
        with pytest.raises(cxltier.ExistsError, match="waited"):
            waiter.name = "engram/m/u"
            waiter._claim_or_wait(second)
        first.close()  # the loader's client ends without sealing
        objects.claim_load(second, "engram/m/u")
    finally:
        first.close()
        second.close()
