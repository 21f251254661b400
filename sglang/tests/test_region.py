"""Tier regions (the HiSparse host pool's storage) against the real
library. torch is not in CI: `FakeTorch` stands in for the torch module in
the one function that only needs torch.empty's arguments."""

import ctypes
import json
import os
import subprocess
import uuid
from types import SimpleNamespace

import pytest

import cxltier
from cxltier.hisparse import planned_buffer, replace_everywhere


def used_chunks(cli, device):
    out = subprocess.run([cli, "inspect", "-json", device], capture_output=True, text=True, check=True).stdout
    return json.loads(out)["chunks"]["used"]


def test_region_memory_and_release(cli, device):
    before = used_chunks(cli, device)
    t = cxltier.Tier(device)
    r = cxltier.Region(t, 300_000)
    assert r.size >= 300_000 and r.size % (256 << 10) == 0 and r.address
    buf = r.buffer()
    ctypes.memmove(r.address + 1000, b"kv-row", 6)
    assert bytes(buf[1000:1006]) == b"kv-row"
    assert used_chunks(cli, device) == before + r.size // (256 << 10)
    r.release()
    assert used_chunks(cli, device) == before
    # a region not released is freed with the tier's client
    cxltier.Region(t, 1)
    t.close()
    assert used_chunks(cli, device) == before


def test_striped_tier_refused(built, cli):
    names = [f"cxltier-py-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    args = [cli, "format", "-size", "16MiB", "-chunk", "256KiB"]
    for n in names:
        args += ["-device", f"shm:{n}"]
    subprocess.run(args, check=True, capture_output=True)
    try:
        with cxltier.Tier([f"shm:{n}" for n in names]) as t:
            with pytest.raises(cxltier.InvalidError, match="striped"):
                cxltier.Region(t, 1024)
    finally:
        for n in names:
            os.remove(f"/dev/shm/{n}")


class FakeTorch:
    """Stand-in for the torch module: records what empty() is asked for."""

    def __init__(self):
        self.calls = []

    def empty(self, shape, dtype=None, device=None, **kw):
        self.calls.append((shape, dtype, device))
        return SimpleNamespace(shape=shape)


def test_planned_buffer_catches_the_allocation():
    fake = FakeTorch()
    real_empty = fake.empty

    def init():  # what SGLang's init_kv_buffer does
        return fake.empty((61, 4096, 1, 656), dtype="fp8", device="cpu", pin_memory=True)

    shape, dtype = planned_buffer(init, fake)
    assert shape == (61, 4096, 1, 656) and dtype == "fp8"
    assert fake.calls == [((61, 4096, 1, 656), "fp8", "meta")]  # nothing real was allocated
    assert fake.empty == real_empty  # restored
    with pytest.raises(RuntimeError, match="did not call torch.empty"):
        planned_buffer(lambda: None, fake)


def test_replace_everywhere():
    import sys
    import types

    class A:
        pass

    class B(A):
        pass

    m1, m2 = types.ModuleType("cxl_fake_m1"), types.ModuleType("cxl_fake_m2")
    m1.Pool, m2.HostPool = A, A
    sys.modules["cxl_fake_m1"], sys.modules["cxl_fake_m2"] = m1, m2
    try:
        assert replace_everywhere(A, B) >= 2
        assert m1.Pool is B and m2.HostPool is B
    finally:
        del sys.modules["cxl_fake_m1"], sys.modules["cxl_fake_m2"]
