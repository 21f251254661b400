"""HiCache batch_exists through the Python package, beside its parts and the
path it replaced, in one run: SGLang's prefetch asks it for every request
(tens of thousands of pages for a long prompt), on the scheduler's time.

    python bench/hicache/exists.py [--pages 30000] [--repeat 30] [--out FILE]

It needs libcxltier (CXLTIER_LIB, or Go to build it) and the cxltier CLI
(CXLTIER_CLI, or Go), and uses SGLang's real MHA host pool where SGLang is
installed (the CI virtualenv); elsewhere it says so and uses the pool's
layout name alone, which is all batch_exists reads of it. The tier is a
fresh /dev/shm region, removed at the end. Rows:

  batch_exists   the backend call SGLang makes: one library call with the
                 NUL-joined page strings, keys made as they are probed
  keys + probe   two calls: the batch's keys built (part_keys), then probed
  part keys      building the keys alone
  probe only     the index probe of prebuilt keys (the Go index's own time
                 plus one ctypes call)
  old path       the keys as the package built them before: an array of
                 string ends built in Python and a fresh key array per call
                 (today's Go behind it); then the probe
  python set     the baseline: the page strings looked up in a Python set
                 (no tier, no keys), the least any check in Python costs;
                 it tells a loaded machine from a slow call, so a reader
                 judges the run by the ratio beside it, not the milliseconds
"""

import argparse
import ctypes
import datetime
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from itertools import accumulate
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "bench"))

from pybuild import build  # noqa: E402


def host_pool():
    """SGLang's real MHA host pool (layout layer_first), or why not."""
    try:
        import torch
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    except ImportError as e:
        return SimpleNamespace(layout="layer_first"), f"SGLang not installed ({e}): the layout name stands in"
    dev = MHATokenToKVPool(size=64, page_size=4, dtype=torch.bfloat16, head_num=2, head_dim=8, layer_num=2,
                           device="cpu", enable_memory_saver=False, enable_alt_stream=False)
    info = dev.get_device_pool_infos()[0].buffer_info
    host = MHATokenToKVPoolHost(info, host_to_device_ratio=2.0, host_size=0, page_size=4, layout="layer_first",
                                pin_memory=False, device="cpu", device_capacity_tokens=64, start_layer=0, end_layer=2)
    import sglang

    return host, f"sglang {sglang.__version__} MHATokenToKVPoolHost"


def timed(fns, repeat):
    """min, median and max milliseconds of repeat calls of each of fns, and
    each one's last result. The calls go round the functions in turn, so
    that a slow spell of a shared machine falls on all of them alike."""
    times, results = [[] for _ in fns], [None] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            results[i] = fn()
            times[i].append((time.perf_counter() - t0) * 1e3)
    out = []
    for t in times:
        t.sort()
        out.append({"min_ms": t[0], "p50_ms": t[len(t) // 2], "max_ms": t[-1]})
    return out, results


def old_part_keys(pages, masks):
    """The keys as the package built them before: ends array, fresh array."""
    from cxltier import _native
    from cxltier.prefix import KEY_BYTES, KeyBlock

    n, m = len(pages), len(masks)
    out = (ctypes.c_uint8 * (n * m * KEY_BYTES))()
    text = "".join(pages).encode()
    ends = (ctypes.c_int64 * n)(*accumulate(map(len, pages)))
    raw = b"".join(masks)
    _native.call("cxl_prefix_part_keys", text, ends, n, (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw), m, out)
    return KeyBlock(out, n * m)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=30000, help="pages per batch_exists call")
    ap.add_argument("--repeat", type=int, default=30, help="calls per row")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "local", "hicache-exists.json"))
    a = ap.parse_args()
    if a.pages < 1 or a.repeat < 1:
        ap.error("--pages and --repeat must be positive")
    with tempfile.TemporaryDirectory() as tmp:
        _, cli = build(tmp)
        import cxltier
        from cxltier.sglang.hicache import HiCacheAdapter
        from cxltier.prefix import part_keys

        name = f"cxltier-bench-exists-{uuid.uuid4().hex[:8]}"
        subprocess.check_call([cli, "format", "-device", f"shm:{name}", "-size", "512MiB", "-chunk", "1MiB"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            pool, pool_note = host_pool()
            backend = HiCacheAdapter()
            cfg = SimpleNamespace(model_name="bench/model", is_mla_model=False, tp_rank=0, tp_size=1,
                                  extra_config={"devices": f"shm:{name}", "index": "bench",
                                                "blocks": 2 * a.pages + 1024, "block_bytes": 64})
            backend._setup(cfg, pool)
            pages = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(a.pages)]
            print(f"storing {a.pages} pages' keys...", file=sys.stderr)
            keys = part_keys(pages, backend._kv_masks)
            hexes = [keys.hex(i) for i in range(len(keys))]
            for i in range(0, len(hexes), 8192):
                st = backend.index.set(hexes[i:i + 8192], [b"\0" * 64] * len(hexes[i:i + 8192]))
                if "no_space" in st:
                    raise SystemExit("the bench index is too small")
            cases = [
                ("batch_exists", lambda: backend.batch_exists(pages)),
                ("keys + probe", lambda: backend.index.exists_block(part_keys(pages, backend._kv_masks)) // 2),
                ("part keys", lambda: len(part_keys(pages, backend._kv_masks))),
                ("probe only", lambda: backend.index.exists_block(keys) // 2),
                ("old path", lambda: backend.index.exists_block(old_part_keys(pages, backend._kv_masks)) // 2),
                ("python set", lambda: sum(p in present for p in pages)),
            ]
            present = set(pages)
            stats, results = timed([fn for _, fn in cases], a.repeat)
            rows = []
            for (label, _), t, got in zip(cases, stats, results):
                want = a.pages if label != "part keys" else 2 * a.pages
                if got != want:
                    raise SystemExit(f"{label}: {got}, want {want}")
                rows.append(dict(row=label, **t))
            backend.close()
        finally:
            os.remove(f"/dev/shm/{name}")
    base = next(r for r in rows if r["row"] == "old path")["p50_ms"]
    floor = next(r for r in rows if r["row"] == "python set")["p50_ms"]
    print(f"HiCache batch_exists of {a.pages} pages (2 parts each), {a.repeat} calls per row, rows in turn; pool: {pool_note}")
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}\n")
    print(f"{'row':>14} {'min ms':>8} {'p50 ms':>8} {'max ms':>8} {'vs old p50':>10} {'vs set p50':>10}")
    for r in rows:
        print(f"{r['row']:>14} {r['min_ms']:8.2f} {r['p50_ms']:8.2f} {r['max_ms']:8.2f} {base / r['p50_ms']:9.2f}× "
              f"{r['p50_ms'] / floor:9.2f}×")
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    report = {"run": {"commit": rev or "unknown", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                      "python": platform.python_version(), "cores": os.cpu_count()},
              "pages": a.pages, "parts": 2, "repeat": a.repeat, "pool": pool_note, "rows": rows}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
