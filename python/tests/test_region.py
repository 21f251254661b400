"""Tier regions (the HiSparse host pool's storage) against the real
library. torch is not in CI: `FakeTorch` stands in for the torch module in
the one function that only needs torch.empty's arguments."""

import ctypes
import gc
import json
import sys
import textwrap
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
    r.release()  # buf still over it: the chunks stay until it goes
    assert used_chunks(cli, device) == before + r.size // (256 << 10)
    with pytest.raises(cxltier.ClosedError):
        r.buffer()
    assert bytes(buf[1000:1006]) == b"kv-row"
    del buf
    gc.collect()
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


def test_views_outlive_a_detach(cli, device):
    """A buffer over tier memory read after its tier was closed: the tier
    stays mapped under it (the read faulted the process before), and is
    detached (its client's chunks freed) once the buffer is collected. In a
    child process, so that a fault fails this test rather than pytest."""
    before = used_chunks(cli, device)
    code = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {os.path.join(os.path.dirname(cxltier.__file__), "..")!r})
        import ctypes, gc, json, subprocess, cxltier
        from cxltier import objects
        t = cxltier.Tier({device!r})
        r = cxltier.Region(t, 100_000)
        buf = r.buffer()
        buf[7] = b"x"
        o = objects.TierObject.create(t, "views", 4096)
        ob = o.buffer()
        ob[9] = 42
        o.close()
        t.close()
        try:
            r.buffer()
            raise SystemExit("a detached tier gave out a new buffer")
        except cxltier.ClosedError:
            pass
        assert buf[7] == b"x" and ob[9] == 42, "the views read wrong after the detach"
        def used():
            out = subprocess.run([{cli!r}, "inspect", "-json", {device!r}], capture_output=True, text=True, check=True).stdout
            return json.loads(out)["chunks"]["used"]
        held = used()
        del buf, ob
        gc.collect()
        print(held, used())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, f"child exited {out.returncode}: {out.stderr[-2000:]}"
    held, after = map(int, out.stdout.split())
    # While the views lived, the region's chunks (and the object's) were
    # held; once they went, the client detached and its region was freed.
    assert held > after
    assert after == before + 1  # the object (shared, named) stays; 4096 bytes: one chunk


def test_a_forked_child_does_not_use_its_parents_lease(built, device):
    """fork() without exec copies the attached tier but not its lease: the
    child's calls fail with ClosedError at once (they would write as the
    parent, or hang: the library's threads do not survive a fork), and the
    parent's tier is unharmed. A child that uses cxltier starts by exec
    (multiprocessing's "spawn")."""
    import os

    t = cxltier.Tier(device, name="parent")
    ix = t.prefix("fork", 16, 1024)
    ix.set([bytes(32)], [b"parent"])
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, and leave without running anything of the parent's
        os.close(r)
        out = []
        for call in (lambda: ix.exists([bytes(32)]), lambda: t.prefix("fork")):
            try:
                call()
                out.append("ran")
            except cxltier.ClosedError as e:
                out.append("closed" if "forked" in str(e) or "closed" in str(e) else f"other: {e}")
        os.write(w, ",".join(out).encode())
        os._exit(0)
    os.close(w)
    import select
    import signal

    ready, _, _ = select.select([r], [], [], 30)
    got = os.read(r, 4096).decode() if ready else "no answer in 30 s (the child hung in the library)"
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert got == "closed,closed", got
    assert ix.exists([bytes(32)]) == 1  # the parent goes on
    t.close()


def test_tier_memory_is_touched_only_under_a_view_hold():
    """Every place the package turns a tier address into memory it reads or
    writes (ctypes from_address, string_at, memmove) is in a function that
    tracks the view with a hold on the tier (track_view): the library keeps
    the mapping under it (cmd/libcxltier lists the addresses it hands out,
    internal/holdcheck). Transfer engines get tier addresses only through
    the uplink's pins and fills, which hold the tier in Go."""
    import ast
    import pathlib

    pkg = pathlib.Path(cxltier.__file__).parent
    unguarded = []
    for path in sorted(pkg.glob("*.py")):
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            names = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", None)
                     for n in ast.walk(fn) if isinstance(n, (ast.Attribute, ast.Name))}
            if names & {"from_address", "string_at", "memmove"} and "track_view" not in names:
                unguarded.append(f"{path.name}:{fn.lineno} {fn.name}")
    assert not unguarded, f"tier memory touched without a view hold: {unguarded}"


def test_populate_covers_the_tier_and_needs_it_attached(device):
    """populate() covers every device's mapping (the 64 MiB test tier) and,
    once the tier is detached, fails instead of touching an unmapped range."""
    t = cxltier.Tier(device)
    assert t.populate() >= 64 << 20
    t.close()
    with pytest.raises(cxltier.ClosedError):
        t.populate()
