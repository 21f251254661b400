"""The real-vLLM suite's helpers: engines run as process trees of their
own (vllm_engine.py), their results read back, runs compared, tier
entries read and damaged. A module of its own name, not conftest: the
package's suites share one pytest run (python -m pytest python), where
"conftest" is another folder's."""

import ctypes
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.dirname(HERE)
ENGINE = os.path.join(HERE, "vllm_engine.py")

_spec = importlib.util.spec_from_file_location("cxltier_test_fixtures", os.path.join(PACKAGE_DIR, "tests", "conftest.py"))
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
tier_device = _fixtures.tier_device

def run_engine(spec, tmp, name, timeout=900):
    """Runs one engine to the end: its results by request name, and its
    log (stdout, where vLLM's loggers and the connector's write, then
    stderr)."""
    spec_path, out_path = os.path.join(tmp, f"{name}.spec.json"), os.path.join(tmp, f"{name}.out.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, PYTHONPATH=PACKAGE_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
               VLLM_LOGGING_LEVEL="WARNING")
    p = subprocess.run([sys.executable, ENGINE, spec_path, out_path], env=env, capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"engine {name} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-6000:]}")
    with open(out_path) as f:
        return json.load(f), p.stdout + p.stderr


def in_parallel(*chains):
    """Runs each chain (a callable) on a thread of its own and waits for
    all; the first failure is raised. Chains that touch different indexes
    share the machine instead of taking turns: an engine spends most of its
    start importing vLLM in three processes, one core each, so two chains
    on 2 cores take little longer than the longer one alone."""
    failures = []

    def run(chain):
        try:
            chain()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            failures.append(e)

    threads = [threading.Thread(target=run, args=(c,), name=getattr(c, "__name__", "chain")) for c in chains]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]


def start_engine(spec, tmp, name):
    """Starts one engine; (process, out path). The caller waits on it."""
    spec_path, out_path = os.path.join(tmp, f"{name}.spec.json"), os.path.join(tmp, f"{name}.out.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    env = dict(os.environ, PYTHONPATH=PACKAGE_DIR + os.pathsep + os.environ.get("PYTHONPATH", ""),
               VLLM_LOGGING_LEVEL="WARNING")
    p = subprocess.Popen([sys.executable, ENGINE, spec_path, out_path], env=env, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    return p, out_path


def read_when(path, name, proc, timeout=900):
    """The engine's results once request name is in them."""
    deadline = time.monotonic() + timeout
    while True:
        if os.path.exists(path):
            try:
                with open(path) as f:
                    out = json.load(f)
                if name in out:
                    return out
            except json.JSONDecodeError:
                pass  # being written
        if proc.poll() is not None and proc.returncode != 0:
            raise AssertionError(f"engine exited {proc.returncode}:\n{proc.stderr.read()[-6000:]}")
        assert time.monotonic() < deadline, f"no result for {name} after {timeout} s"
        time.sleep(0.1)


def same(a, b):
    """Two runs agree: the same tokens, and at each step the same 5
    likeliest tokens with logprobs within bf16 noise."""
    if a["tokens"] != b["tokens"] or len(a["top"]) != len(b["top"]):
        return False
    for x, y in zip(a["top"], b["top"]):
        if [t for t, _ in x] != [t for t, _ in y] or any(abs(p - q) > 1e-3 for (_, p), (_, q) in zip(x, y)):
            return False
    return True


def index_keys(device, name, key=None):
    """The entry keys an index of the tier (with tenant key key) holds."""
    import cxltier

    with cxltier.Tier(device) as t:
        ix = t.prefix(name, key=key)
        try:
            return set(ix.keys())
        finally:
            ix.close()


def records(device, index_name):
    """The token records of an index's pages: (page key, parent, tokens)."""
    import cxltier
    from cxltier.tokens import TOKENS_SUFFIX, decode_record

    with cxltier.Tier(device) as t:
        ix = t.prefix(index_name + TOKENS_SUFFIX)
        try:
            keys = ix.keys()
            bufs = [bytearray(ix.stats()["block_bytes"]) for _ in keys]
            out = []
            for k, b in zip(keys, bufs):
                served, lens = ix.get([k], [b])
                assert served == 1, f"token record {k.hex()} went while read"
                page, parent, tokens, _ = decode_record(bytes(b[: lens[0]]))
                out.append((page, parent, tokens))
            return out
        finally:
            ix.close()


def damage(device, index_name, keys, zero=False):
    """Flips a byte of each listed entry's payload in place in the tier, or
    with zero, clears the whole payload."""
    import cxltier
    from cxltier import _native

    t = cxltier.Tier(device)
    try:
        ix = t.prefix(index_name)
        n = len(keys)
        arr = (ctypes.c_uint8 * (n * 32)).from_buffer_copy(b"".join(keys))
        addrs, lens, present, h = (ctypes.c_void_p * n)(), (ctypes.c_int64 * n)(), (ctypes.c_int8 * n)(), ctypes.c_uint64()
        trailers, inplace = (ctypes.c_uint8 * (n * 32))(), (ctypes.c_int8 * n)()
        _native.call("cxl_prefix_pin", ix.handle, arr, n, addrs, lens, trailers, inplace, present, ctypes.byref(h))
        try:
            for i in range(n):
                assert present[i], f"entry {i} of {n} is not in {index_name!r}"
                if zero:
                    ctypes.memset(addrs[i], 0, lens[i])
                    continue
                view = (ctypes.c_uint8 * lens[i]).from_address(addrs[i])
                view[lens[i] // 2] ^= 0xFF
                del view
        finally:
            _native.call("cxl_prefix_unpin", h.value)
    finally:
        t.close()


def forge(device, index_name, key, keys):
    """Replaces each listed entry's payload of a keyed index with bytes of
    its own and their valid CRC, by a process of the tier without the key
    (tests/forge_page.py); the test, which has the key, reads the payloads
    first to say which bytes are whose."""
    import cxltier

    sys.path.insert(0, os.path.join(PACKAGE_DIR, "tests"))
    import forge_page

    with cxltier.Tier(device) as t:
        ix = t.prefix(index_name, key=key)
        bufs = [bytearray(ix.stats()["block_bytes"]) for _ in keys]
        served, lens = ix.get(keys, bufs)
        assert served == len(keys), f"{served} of {len(keys)} entries in {index_name!r}"
        payloads = [bytes(b[:n]) for b, n in zip(bufs, lens)]
        ix.close()
    for k, old in zip(keys, payloads):
        forge_page.forge("/dev/shm/" + device.split(":", 1)[1], k, old, bytes(b ^ 0x5A for b in old))
