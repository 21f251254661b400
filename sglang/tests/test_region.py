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
