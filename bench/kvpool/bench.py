"""The KV path every engine adapter moves KV through (cxltier.kvpool: the
vLLM connector, SGLang's prefill-to-decode backend and its unified-cache
linker), beside torch moving the same bytes in the same process, with
every check on. It needs torch, libcxltier (CXLTIER_LIB, or Go to build
it) and the cxltier CLI (CXLTIER_CLI, or Go); each layout runs on a fresh
/dev/shm tier, removed at the end.

    python bench/kvpool/bench.py [--device cpu|cuda] [--mib 512] [--layers N]
                                 [--block-sizes 16,64] [--layouts vllm-fa,sglang-mha,mla]
                                 [--rounds 5] [--out FILE] [--label TEXT]

Layouts (bf16): vllm-fa is vLLM's FlashAttention cache, a [2, blocks,
block, 8, 128] tensor per layer (K and V its two halves); sglang-mha is
SGLang's MHA pool, a K and a V buffer of [tokens, 8, 128] per layer; mla a
DeepSeek latent of [tokens, 1, 576] per layer. A page is a block of tokens
in every layer; about --mib MiB of pages move per call.

Per round (after one not counted), side by side: store (the pool's pages into the tier: one scatter
that checksums what it writes, then publish), load (a layer at a time into
other pages, the gather checksumming what it reads, compared after the
last layer), load with verify=False, and torch copying the same bytes
between the pool and host memory (pinned on a GPU). Wall time gives GB/s;
CPU time (the whole process) is what a pass on the CPU would show in.
After the rounds the loaded pages are compared byte for byte, and a page
damaged in the tier between its store and a load must fail that load; the
run exits non-zero otherwise.
"""

import argparse
import datetime
import json
import mmap
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "bench"))

from pybuild import ShmTier, build, cpu_model  # noqa: E402

HEADS, HEAD_DIM, LATENT = 8, 128, 576
DEFAULT_LAYERS = {"vllm-fa": 32, "sglang-mha": 32, "mla": 61}


def make_pool(torch, layout, layers, block, blocks, device):
    """The layout's tensors, and its buffers as KVPool takes them (views,
    layer-major) with the chunk each page has in a buffer."""
    bf16 = dict(dtype=torch.bfloat16, device=device)
    tensors, views = [], []
    for _ in range(layers):
        if layout == "vllm-fa":
            t = torch.empty(2, blocks, block, HEADS, HEAD_DIM, **bf16)
            tensors.append(t)
            views += [t[0], t[1]]
        elif layout == "sglang-mha":
            k, v = (torch.empty(blocks * block, HEADS, HEAD_DIM, **bf16) for _ in range(2))
            tensors += [k, v]
            views += [k, v]
        else:
            t = torch.empty(blocks * block, 1, LATENT, **bf16)
            tensors.append(t)
            views.append(t)
    for t in tensors:
        t.view(torch.uint8).random_()
    chunk = views[0].numel() * views[0].element_size() // blocks
    return tensors, [v.view(torch.uint8).view(blocks, chunk) for v in views], len(views) // layers, chunk


class Clock:
    """Wall and process CPU time of a call, a GPU's work included."""

    def __init__(self, torch, device):
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def __call__(self, fn):
        self.sync()
        w, c = time.perf_counter(), time.process_time()
        fn()
        self.sync()
        return time.perf_counter() - w, time.process_time() - c


def run_layout(torch, cli, layout, block, layers, target_bytes, rounds, device):
    from cxltier import ChecksumError, Tier as CxlTier
    from cxltier.kvpool import KVPool
    from cxltier.prefix import part_keys, string_key

    probe = make_pool(torch, layout, 1, block, 1, "cpu")
    page_bytes = probe[3] * probe[2] * layers
    pages = max(4, target_bytes // page_bytes)
    blocks = 2 * pages + 1  # sources, destinations, and the damaged page
    tensors, bufs, per_layer, chunk = make_pool(torch, layout, layers, block, blocks, device)
    tier_mib = (pages + 2) * page_bytes * 3 // 2 // 2**20 + 64
    src, dst = list(range(pages)), list(range(pages, 2 * pages))
    clock = Clock(torch, device)
    engine = "cuda" if device == "cuda" else "cpu"
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0
    pin = device == "cuda"
    host = [torch.zeros(pages, chunk, dtype=torch.uint8, pin_memory=pin) for _ in bufs]  # touched: no page faults timed
    times = {op: [] for op in ("store", "load", "load-unverified", "torch-store", "torch-load")}
    with ShmTier(cli, f"{tier_mib}MiB", "kvpool-bench") as tier:
        t = CxlTier(tier.spec)
        try:
            index = t.prefix("bench", pages + 2, page_bytes)
            spans = [(b.data_ptr(), b.numel()) for b in bufs]
            pool = KVPool(index, spans, per_layer, chunk, chunk, engine=engine, stream=stream, device=device == "cuda")
            unverified = KVPool(index, spans, per_layer, chunk, chunk, engine=engine, stream=stream,
                                device=device == "cuda", verify=False)
            mask = [string_key("kvpool-bench")]

            def load(p):
                ld = p.load(keys, dst)
                for i in range(layers):
                    ld.layer(i)
                ld.close()

            for r in range(-1, rounds):  # round -1 warms every path up and is not counted
                names = [string_key(f"{layout}/{block}/{r}/{i}").hex() for i in range(pages)]
                keys = part_keys(names, mask)
                stored = []
                times["store"].append(clock(lambda: stored.extend(pool.store(keys, src))))
                if stored != ["stored"] * pages:
                    raise SystemExit(f"{layout}: store answered {sorted(set(stored))}")
                for b in bufs:
                    b[pages:2 * pages].zero_()
                times["load"].append(clock(lambda: load(pool)))
                for i, b in enumerate(bufs):
                    if not torch.equal(b[pages:2 * pages], b[:pages]):
                        raise SystemExit(f"{layout} block {block}: buffer {i}: loaded pages differ from the stored")
                times["load-unverified"].append(clock(lambda: load(unverified)))
                times["torch-store"].append(clock(lambda: [h.copy_(b[:pages], non_blocking=pin) for h, b in zip(host, bufs)]))
                times["torch-load"].append(clock(lambda: [b[pages:2 * pages].copy_(h, non_blocking=pin)
                                                          for h, b in zip(host, bufs)]))
                index.delete([keys.hex(i) for i in range(pages)])
                if r < 0:
                    for ts in times.values():
                        ts.clear()
            damage = damaged_load_fails(torch, tier, pool, index, bufs, blocks - 1, layers, part_keys, string_key, mask,
                                        ChecksumError)
            unverified.close()
            pool.close()
        finally:
            t.close()
    total = pages * page_bytes
    row = {"layout": layout, "block": block, "layers": layers, "page_bytes": page_bytes, "pages": pages,
           "bytes": total, "damage_detected": damage}
    for op, ts in times.items():
        wall = statistics.median(w for w, _ in ts)
        row[op] = {"wall_ms": wall * 1e3, "cpu_ms": statistics.median(c for _, c in ts) * 1e3,
                   "gb_per_s": total / wall / 1e9, "runs_wall_ms": [w * 1e3 for w, _ in ts]}
    row["store_vs_torch"] = row["store"]["gb_per_s"] / row["torch-store"]["gb_per_s"]
    row["load_vs_torch"] = row["load"]["gb_per_s"] / row["torch-load"]["gb_per_s"]
    row["verified_over_unverified_cpu"] = row["load"]["cpu_ms"] / row["load-unverified"]["cpu_ms"]
    row["verified_over_unverified_wall"] = row["load"]["wall_ms"] / row["load-unverified"]["wall_ms"]
    return row


def damaged_load_fails(torch, tier, pool, index, bufs, page, layers, part_keys, string_key, mask, checksum_error):
    """Stores one page, changes a byte of it in the tier, and reports
    whether the verified load failed and dropped the entry."""
    keys = part_keys([string_key("kvpool-bench/damaged").hex()], mask)
    if pool.store(keys, [page]) != ["stored"]:
        return False
    needle = bufs[-1][page][-64:].cpu().numpy().tobytes()
    with open(f"/dev/shm/{tier.name}", "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        at = m.find(needle)
        if at < 0:
            return False
        m[at + 7] ^= 0x20
    ld = pool.load(keys, [page])
    failed = False
    try:
        for i in range(layers):
            ld.layer(i)
    except checksum_error:
        failed = True
    try:
        ld.close()
    except checksum_error:
        failed = True
    return failed and index.exists_block(keys) == 0


def provenance(device, torch):
    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    cpu = cpu_model()
    out = {"commit": git("rev-parse", "HEAD") or os.environ.get("CXLTIER_COMMIT", ""),
           "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "cpu": cpu, "cpus": os.cpu_count(),
           "arch": platform.machine(), "torch": torch.__version__, "device": device}
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--mib", type=int, default=512, help="MiB of pages a call moves (at least 4 pages)")
    ap.add_argument("--layers", type=int, default=0, help="layers of every layout (0: 32 for MHA, 61 for MLA)")
    ap.add_argument("--block-sizes", default="16,64")
    ap.add_argument("--layouts", default="vllm-fa,sglang-mha,mla")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument("--label", default="", help="a note kept in the JSON (which library, what changed)")
    a = ap.parse_args()
    layouts = [x for x in a.layouts.split(",") if x]
    if not layouts or any(x not in DEFAULT_LAYERS for x in layouts):
        ap.error(f"--layouts: a comma-separated subset of {','.join(DEFAULT_LAYERS)}")
    try:
        blocks = [int(x) for x in a.block_sizes.split(",") if x]
    except ValueError:
        ap.error(f"--block-sizes {a.block_sizes!r}: a comma-separated list of token counts")
    if not blocks or min(blocks) < 1 or a.mib < 1 or a.rounds < 1 or a.layers < 0:
        ap.error("--block-sizes, --mib and --rounds must be at least 1, --layers at least 0")
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device")
    _, cli = build(tempfile.mkdtemp(prefix="cxltier-kvpool-bench-"))
    run = provenance(a.device, torch)
    run["label"] = a.label
    where = run.get("gpu", f"{run['cpu']} x {run['cpus']}")
    print(f"KV path: {a.device} ({where}), ~{a.mib} MiB a call, median of {a.rounds} rounds; GB/s by wall time,"
          " CPU ms of the whole process", flush=True)
    print(f"{'layout':<11} {'blk':>4} {'MiB':>5} | {'store':>6} {'torch':>6} {'ratio':>5} | {'load':>6} {'torch':>6}"
          f" {'ratio':>5} | {'unver':>6} {'v/u cpu':>7} {'v/u wall':>8} | damage")
    rows, bad = [], []
    for layout in layouts:
        for block in blocks:
            r = run_layout(torch, cli, layout, block, a.layers or DEFAULT_LAYERS[layout], a.mib << 20, a.rounds,
                           a.device)
            rows.append(r)
            if not r["damage_detected"]:
                bad.append(f"{layout}/{block}: a damaged page was served")
            print(f"{layout:<11} {block:>4} {r['bytes'] >> 20:>5} | {r['store']['gb_per_s']:6.2f}"
                  f" {r['torch-store']['gb_per_s']:6.2f} {r['store_vs_torch']:5.2f} | {r['load']['gb_per_s']:6.2f}"
                  f" {r['torch-load']['gb_per_s']:6.2f} {r['load_vs_torch']:5.2f} | {r['load-unverified']['gb_per_s']:6.2f}"
                  f" {r['verified_over_unverified_cpu']:7.2f} {r['verified_over_unverified_wall']:8.2f} |"
                  f" {'caught' if r['damage_detected'] else 'MISSED'}", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"bench": "kvpool", "run": run, "config": vars(a), "rows": rows}, f, indent=1)
    if bad:
        raise SystemExit("; ".join(bad))


if __name__ == "__main__":
    main()
