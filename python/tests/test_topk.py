"""The top-k pool through the real library on a real tier (CPU engine)."""

import random
import struct

import pytest

import cxltier
from cxltier.topk import TopKPool

ENTRY = 64


def entry(req, layer, pos):
    return struct.pack("<4q", req, layer, pos, req * 1_000_003 + layer * 7919 + pos) * (ENTRY // 32)


def fill(pool, req, layers, n):
    pool.register(req, capacity=n)
    for layer in range(layers):
        pool.append(req, layer, b"".join(entry(req, layer, p) for p in range(n)))


def test_short_sequence_is_fully_resident(device):
    with cxltier.Tier(device) as t, TopKPool(t, layers=1, entry_bytes=ENTRY, slots=16, topk=4, max_requests=2, engine="cpu") as pool:
        fill(pool, 1, 1, 10)
        slots, step = pool.resolve(0, [1], [10], [[3, 9, -1, 0]])
        assert slots == [[3, 9, -1, 0]]  # SGLang: token p in slot p while the sequence fits
        for pos in (3, 9, 0):
            assert pool.read_slot(0, 1, pos) == entry(1, 0, pos)
        assert step["bytes"] == step["fills"] * ENTRY + step["newest"] * ENTRY + step["misses"] * ENTRY


# ptxsim:1 runs the committed GPU kernels in the library's PTX interpreter,
# standing in for GPU 1.
@pytest.mark.parametrize("engine", ["cpu", "ptxsim:1"])
def test_random_steps_keep_every_selected_entry_in_its_slot(device, engine):
    rng = random.Random(7)
    S, K, N = 16, 8, 200
    with cxltier.Tier(device) as t, TopKPool(t, layers=2, entry_bytes=ENTRY, slots=S, topk=K, max_requests=4, engine=engine) as pool:
        for req in (0, 2):
            fill(pool, req, 2, N)
        assert pool.length(2, 1) == N
        prev = {0: [], 2: []}
        hits = 0
        for _ in range(40):
            reqs, sel = [0, 2], []
            for req in reqs:
                keep = [p for p in prev[req] if rng.random() < 0.8 and p != N - 1]
                row = list(dict.fromkeys(keep + [N - 1] + rng.sample(range(N - 1), K)))[:K]
                prev[req] = row
                sel.append(row)
            layer = rng.randrange(2)
            slots, step = pool.resolve(layer, reqs, [N, N], sel)
            hits += step["hits"]
            for b, req in enumerate(reqs):
                assert len(set(slots[b])) == K, "two selections share a slot"
                for pos, slot in zip(sel[b], slots[b]):
                    assert 0 <= slot <= S
                    assert (slot == S) == (pos == N - 1), "the newest token lives in the reserved slot"
                    assert pool.read_slot(layer, req, slot) == entry(req, layer, pos)
        assert hits > 0
        st = pool.stats()
        assert st["steps"] == 40 and st["hits"] == hits and st["sequences"] == 2


def test_bad_steps_are_refused_with_the_go_message(device):
    with cxltier.Tier(device) as t, TopKPool(t, layers=1, entry_bytes=ENTRY, slots=8, topk=2, max_requests=2, engine="cpu") as pool:
        fill(pool, 0, 1, 20)
        with pytest.raises(cxltier.InvalidError, match="position 20"):
            pool.resolve(0, [0], [20], [[1, 20]])
        with pytest.raises(cxltier.InvalidError, match="position -2"):
            pool.resolve(0, [0], [20], [[-2, 1]])
        with pytest.raises(cxltier.NotFoundError, match="request 1"):
            pool.resolve(0, [1], [20], [[1, 2]])
        with pytest.raises(cxltier.InvalidError, match="request 5 outside"):
            pool.resolve(0, [5], [20], [[1, 2]])
        with pytest.raises(cxltier.InvalidError):
            pool.resolve(0, [0], [21], [[1, 2]])  # longer than what was appended
        with pytest.raises(ValueError, match="want 2"):
            pool.resolve(0, [0], [20], [[1, 2, 3]])
        with pytest.raises(cxltier.InvalidError, match="host memory"):
            pool.buffer(0)
        with pytest.raises(cxltier.InvalidError, match="device memory"):
            pool.append_device(0, 0, 0x1000, 1)  # the CPU engine has no GPU memory to read
        with pytest.raises(cxltier.ExistsError):
            pool.register(0)
        with pytest.raises(ValueError, match="whole number"):
            pool.append(0, 0, b"x" * (ENTRY + 1))
        # nothing above changed the sequence
        assert pool.length(0, 0) == 20
        slots, _ = pool.resolve(0, [0], [20], [[4, 19]])
        assert pool.read_slot(0, 0, slots[0][0]) == entry(0, 0, 4)
    with cxltier.Tier(device) as t:
        with pytest.raises(cxltier.InvalidError, match="top-k 9 larger than the 8 slots"):
            TopKPool(t, layers=1, entry_bytes=ENTRY, slots=8, topk=9, engine="cpu")
        with pytest.raises(cxltier.InvalidError, match="multiple of 16"):
            TopKPool(t, layers=1, entry_bytes=40, slots=8, topk=2, engine="cpu")


def test_detach_closes_the_pool(device):
    t = cxltier.Tier(device)
    pool = TopKPool(t, layers=1, entry_bytes=ENTRY, slots=8, topk=2, max_requests=2, engine="cpu")
    fill(pool, 0, 1, 4)
    t.close()
    with pytest.raises(cxltier.ClosedError):
        pool.length(0, 0)
    pool.close()  # after detach: nothing left to do, no error


def test_engine_planning_agrees_with_host_planning(device):
    """planner="engine" on the CPU engine runs the Go twin of the GPU planning
    kernels over tables in engine memory: every step must match the host
    planner's slots and counts."""
    rng = random.Random(11)
    S, K, N = 16, 8, 120
    with cxltier.Tier(device) as t, \
            TopKPool(t, layers=1, entry_bytes=ENTRY, slots=S, topk=K, max_requests=3, engine="cpu", planner="host") as host, \
            TopKPool(t, layers=1, entry_bytes=ENTRY, slots=S, topk=K, max_requests=3, engine="cpu", planner="engine",
                     max_context=4 * N) as eng:
        assert host.stats()["planner"] == "host" and eng.stats()["planner"] == "engine"
        for pool in (host, eng):
            fill(pool, 2, 1, N)
        prev = []
        for n in range(N // 2, N):
            keep = [p for p in prev if p < n - 1 and rng.random() < 0.8]
            row = list(dict.fromkeys(keep + [n - 1] + rng.sample(range(n), K)))[:K]
            row[rng.randrange(K)] = -1
            prev = row
            want = host.resolve(0, [2], [n], [row])
            got = eng.resolve(0, [2], [n], [row])
            assert got == want, f"length {n}"
        for slot, pos in zip(got[0][0], row):
            if pos >= 0:
                assert eng.read_slot(0, 2, slot) == entry(2, 0, pos)
        with pytest.raises(cxltier.InvalidError, match="position 500"):
            eng.resolve(0, [2], [N], [[500] + [-1] * (K - 1)])
        with pytest.raises(cxltier.InvalidError, match="max context"):
            eng.append(2, 0, b"".join(entry(2, 0, p) for p in range(N, 4 * N + 1)))
    with cxltier.Tier(device) as t:
        with pytest.raises(cxltier.InvalidError, match="planner"):
            TopKPool(t, layers=1, entry_bytes=ENTRY, slots=8, topk=2, engine="cpu", planner="gpu")


def test_cuda_names_torchs_current_device(monkeypatch):
    """"cuda" reaches the library as torch's current device, so every rank's
    engine runs on its own GPU. The torch here is a stand-in (this machine
    has no GPU): just the three calls engine_kind makes."""
    import sys
    import types

    from cxltier import _native

    cuda = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, current_device=lambda: 3)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert _native.engine_kind("cuda") == "cuda:3"
    assert _native.engine_kind("cuda:1") == "cuda:1"
    assert _native.engine_kind("auto") == "auto"  # may fall back to the CPU engine: left to the library
    cuda.is_initialized = lambda: False
    assert _native.engine_kind("cuda") == "cuda"
