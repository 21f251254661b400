"""SGLang's DeepSeek-V4.1 Engram host table in the tier against SGLang's own,
with SGLang's real EngramEmbedding and _HostTable, in one run:

    python bench/engramhost/bench.py [--rows 2000000] [--calls 200] [--out FILE]

(in the CI virtualenv, which has SGLang 0.5.23 and torch). Three parts:

  memory    two server instances (separate processes) each build the same
            layer's table: with cxltier (CXLTIER_ENGRAM_HOST_TABLE) the first
            loads it and the second attaches it; with SGLang's own shared
            layout each instance is its own TP group and has its own memfd
            copy. Reported: the node's shared memory added (/proc/meminfo
            Shmem, plus the tier's share for ours), and each process's
            Rss/Pss/Private of the table's mappings (/proc/self/smaps).
  attach    time for the second instance to have a loaded table (build +
            SGLang's weight loaders + finish_load) against the first's load
            through the same calls, per GiB. The checkpoint tensors are in
            memory, so the load is a lower bound of a real one (which also
            reads the file).
  lookup    per call, 24 to 100,000 rows (24 rows a token: V4.1's 3
            n-gram orders × 8 heads) of both planes gathered from the table
            in the tier by cxltier's TierRowStager (one call for both
            planes), by torch's index_select (one per plane) and by SGLang's
            EngramRowStager gather (index_select over its 16-thread pool,
            the same code), all three reading the same tier mapping (so the
            same page size, which the output states); same ids, blocks of
            ten calls per side in rotating order, the table's pages mapped
            before timing. Twice: one thread every side, and every core
            every side. --tier-dir puts the tier on another file system
            (a tmpfs mounted huge=within_size: huge pages).

The table is --rows rows of one layer (V4.1-Flash has 384 M rows, 94.6 GiB,
per layer: this is a scaled-down table; say so when quoting). CPU patches,
as in the tests: torch.cuda.current_device, engram._sorted_host_reads, and
cudaHostRegister (recorded, not called). No GPU is used.
"""

import argparse
import itertools
import datetime
import json
import os
import platform
import re
import socket
import subprocess
import sys
import tempfile
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "bench"))

from pybuild import build  # noqa: E402
DIM, SCALES, LAYER = 256, 8, 1


def smaps_of(addr, nbytes):
    """kB of Rss, Pss and private pages of the mappings over [addr, addr+n)."""
    out = {"rss_kb": 0, "pss_kb": 0, "private_kb": 0}
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            m = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
            if m:
                lo, hi = int(m.group(1), 16), int(m.group(2), 16)
                inside = lo < addr + nbytes and addr < hi
                continue
            if not inside:
                continue
            key, _, rest = line.partition(":")
            kb = int(rest.split()[0]) if rest.split() and rest.split()[0].isdigit() else 0
            if key == "Rss":
                out["rss_kb"] += kb
            elif key == "Pss":
                out["pss_kb"] += kb
            elif key in ("Private_Clean", "Private_Dirty"):
                out["private_kb"] += kb
    return out


def shmem_kb():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("Shmem:"):
                return int(line.split()[1])
    return 0


def worker(kind, rows, port, ready_path, go_path):
    """One server instance of one TP rank: builds the layer's table, loads it
    through SGLang's weight loaders, reports, and waits until told to go."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    from sglang.srt.distributed.parallel_state import GroupCoordinator
    from sglang.srt.layers import engram
    from sglang.srt.runtime_context import get_parallel

    torch.cuda.current_device = lambda: 0
    engram._sorted_host_reads = lambda device: False

    class _Cudart:  # cudaHostRegister recorded, not called: no GPU here
        def cudaHostRegister(self, *a):
            return 0

    torch.cuda.cudart = lambda: _Cudart()
    if kind == "tier":
        from cxltier.sglang import engram_host

        engram_host.install()
    group = GroupCoordinator([[0]], 0, "gloo", use_pynccl=False, use_mscclpp=False, use_custom_allreduce=False,
                             use_torch_symm_mem_all_reduce=False, use_hpu_communicator=False,
                             use_xpu_communicator=False, group_name="tp")
    g = torch.Generator().manual_seed(LAYER)
    w = torch.randint(0, 256, (rows, DIM), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn)
    s = torch.randint(100, 140, (rows, SCALES), dtype=torch.uint8, generator=g).view(torch.float8_e8m0fnu)
    with get_parallel().override(tp_group=group, tp_rank=0, tp_size=1):
        t0 = time.perf_counter()
        emb = engram.EngramEmbedding(rows, DIM, LAYER, column_bounds=(0, rows // 2, rows))
        emb.weight.weight_loader(emb.weight, w)
        emb.scale.weight_loader(emb.scale, s)
        emb.finish_load(f"layer {LAYER}")
        took = time.perf_counter() - t0
    del w, s
    table = emb.host_table
    # Read every page once, as a server's lookups do: the table's memory is
    # then resident in this process, and smaps shows whose it is.
    pages = table.bytes[:: 4096].sum()
    assert int(pages) >= 0
    res = {"kind": kind, "seconds": took, "skipped": getattr(table, "skipped_loads", 0),
           "table_open_seconds": getattr(table, "open_seconds", None)}
    with open(ready_path + ".tmp", "w") as f:
        json.dump(res, f)
    os.rename(ready_path + ".tmp", ready_path)
    # Memory is read once every instance is up: whose pages are whose
    # depends on who else maps them.
    while not os.path.exists(go_path):
        time.sleep(0.05)
    res.update(smaps_of(table.bytes.data_ptr(), table.nbytes))
    with open(ready_path + ".mem.tmp", "w") as f:
        json.dump(res, f)
    os.rename(ready_path + ".mem.tmp", ready_path + ".mem")


def run_instances(kind, rows, tmp, env):
    """Two instances of kind, the second started once the first is loaded;
    both alive while memory is read. Returns their reports and the Shmem
    the node gained."""
    before = shmem_kb()
    go = os.path.join(tmp, f"go-{kind}")
    procs, reports = [], []
    for i in range(2):
        ready = os.path.join(tmp, f"ready-{kind}-{i}")
        port = _free_port()
        procs.append(subprocess.Popen([sys.executable, "-W", "ignore", __file__, "--worker", kind, "--rows", str(rows),
                                       "--port", str(port), "--ready", ready, "--go", go], env=env))
        deadline = time.time() + 600
        while not os.path.exists(ready):
            if procs[-1].poll() is not None or time.time() > deadline:
                raise SystemExit(f"{kind} instance {i} failed (exit {procs[-1].poll()})")
            time.sleep(0.05)
    gained = shmem_kb() - before
    open(go, "w").close()
    for p in procs:
        p.wait(timeout=120)
    for i in range(2):
        with open(os.path.join(tmp, f"ready-{kind}-{i}.mem")) as f:
            reports.append(json.load(f))
    return reports, gained


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SIZES = (24, 96, 768, 6144, 30000, 100000)  # rows a call: 1, 4, 32, 256, 1250 and ~4167 tokens


def lookup(device, rows, calls, sizes=SIZES):
    """p50 µs per call of three gathers of both planes (rows, then scales)
    from the one table in the tier, same ids: cxltier's TierRowStager, torch's
    index_select, and SGLang's EngramRowStager gather. Two modes: "one" (one
    thread every side: torch's intra-op threads, SGLang's pool and ours all
    1) and "all" (every core: torch's default threads, SGLang's own 16-thread
    pool, ours 0 = every core). Calls run in blocks of ten per side, the
    sides in every order in turn (each follows each other equally often),
    so that one side's worker threads (torch's OpenMP workers spin after a
    call, as ours do; SGLang's pool wakes 16) are not measured against the
    next side alone."""
    import torch
    from concurrent.futures import ThreadPoolExecutor

    import cxltier
    from cxltier.sglang import engram_host, engram_staging
    from cxltier import objects
    from sglang.srt.layers import engram_staging as sglang_staging

    t = cxltier.Tier(device)
    name = engram_host.table_name("bench-model", f"sglang_engram_{LAYER}")
    obj = objects.TierObject.open(t, name, read_only=True)
    raw = obj.tensor()
    weight, scale = raw[: rows * DIM].view(rows, DIM), raw[rows * DIM: rows * (DIM + SCALES)].view(rows, SCALES)
    int(raw[::4096].sum())  # a serving process has the table's pages mapped already
    resident_kb, huge_kb, huge_kind = engram_host.huge_page_report(raw.data_ptr(), rows * (DIM + SCALES))
    pages = {"backing": engram_host.backing_kind(raw.data_ptr()), "resident_kb": resident_kb,
             "huge_kb": huge_kb, "huge_kind": huge_kind}
    out = {"pages": pages, "modes": {}}
    for mode in ("one", "all"):
        threads = 1 if mode == "one" else os.cpu_count()
        torch.set_num_threads(threads)
        pool = ThreadPoolExecutor(1 if mode == "one" else sglang_staging._GATHER_THREADS)

        def sglang_gather(table, ids):
            # EngramRowStager._gather of SGLang 0.5.23, less pin_memory (no GPU)
            res = torch.empty((ids.numel(), table.shape[1]), dtype=table.dtype)
            step = -(-ids.numel() // sglang_staging._GATHER_THREADS)
            chunks = [pool.submit(torch.index_select, table, 0, ids[i: i + step], out=res[i: i + step])
                      for i in range(0, ids.numel(), step)]
            for c in chunks:
                c.result()
            return res

        cls = engram_staging.make_stager_class()
        ours = cls.__new__(cls)  # TierRowStager's gather, without the CUDA stream of __init__
        ours.bind_init(threads=1 if mode == "one" else 0)
        ours.bind_planes(obj, rows, DIM, SCALES, weight.data_ptr(), scale.data_ptr())
        sides = {
            "cxltier": lambda ids: (ours._gather(weight, ids), ours._gather(scale, ids)),
            "index_select": lambda ids: (torch.index_select(weight, 0, ids), torch.index_select(scale, 0, ids)),
            "sglang": lambda ids: (sglang_gather(weight, ids), sglang_gather(scale, ids)),
        }
        gen = torch.Generator().manual_seed(7)
        results = []
        for n in sizes:
            per_side = max(20, min(calls, 3_000_000 // n))
            sets = [torch.randint(0, rows, (n,), generator=gen) for _ in range(per_side)]
            got = {k: f(sets[0]) for k, f in sides.items()}
            for k in ("index_select", "sglang"):
                if not (torch.equal(got["cxltier"][0], got[k][0]) and torch.equal(got["cxltier"][1], got[k][1])):
                    raise SystemExit(f"{mode}, {n} rows: cxltier's rows differ from {k}'s")
            del got
            times = {k: [] for k in sides}
            orders = list(itertools.permutations(sides))  # each side follows each other equally often
            for block in range(0, per_side, 10):
                for who in orders[block // 10 % len(orders)]:
                    f = sides[who]
                    for ids in sets[block: block + 10]:
                        t0 = time.perf_counter()
                        f(ids)
                        times[who].append((time.perf_counter() - t0) * 1e6)
            row = {"rows": n, "calls": per_side}
            for k, v in times.items():
                v.sort()
                row[f"{k}_p50_us"], row[f"{k}_p10_us"], row[f"{k}_p90_us"] = v[len(v) // 2], v[len(v) // 10], v[9 * len(v) // 10]
            row["vs_index_select"] = row["index_select_p50_us"] / row["cxltier_p50_us"]
            row["vs_sglang"] = row["sglang_p50_us"] / row["cxltier_p50_us"]
            results.append(row)
            print(f"  lookup {mode}: {n} rows done", file=sys.stderr)
        out["modes"][mode] = {"threads": threads, "rows": results}
        pool.shutdown()
    torch.set_num_threads(os.cpu_count())
    obj.close()
    t.close()
    return out


def print_memory(ours, ours_shmem, theirs, theirs_shmem, gib):
    print("\nmemory: two instances of one model (each its own TP group)")
    print(f"{'':>22} {'node shmem added':>17} {'inst. 1 rss/pss/private MiB':>28} {'inst. 2 rss/pss/private MiB':>28}")
    for label, reps, shm in (("cxltier tier table", ours, ours_shmem), ("SGLang shared layout", theirs, theirs_shmem)):
        cols = [f"{r['rss_kb'] / 1024:.0f}/{r['pss_kb'] / 1024:.0f}/{r['private_kb'] / 1024:.0f}" for r in reps]
        print(f"{label:>22} {shm / 1024:>13.0f} MiB {cols[0]:>28} {cols[1]:>28}")
    print("  (the tier's pages were committed when it was formatted: cxltier's table adds no shmem; it is in the tier once)")
    load, attach = ours[0]["seconds"], ours[1]["seconds"]
    print(f"\nattach: the second instance's EngramEmbedding had its table in {attach * 1e3:.0f} ms "
          f"(the tier table's own open: {ours[1]['table_open_seconds'] * 1e3:.1f} ms), the first's load took {load:.2f} s")
    print(f"attach: load {load / gib:.3f} s/GiB, attach {attach / gib * 1e3:.2f} ms/GiB: {load / attach:.0f}× "
          f"(second instance skipped {ours[1]['skipped']} loader calls); SGLang's second instance loads again: "
          f"{theirs[1]['seconds'] / gib:.3f} s/GiB")


def print_lookups(lookups):
    p = lookups["pages"]
    huge = f"{p['huge_kb'] / 1024:.0f} of {p['resident_kb'] / 1024:.0f} MiB on {p['huge_kind']}" if p["huge_kb"] else \
        "4 KiB pages (no huge pages)"
    print(f"\nlookup, µs per call (p50), both planes, every side reading the same tier mapping: {p['backing']}, {huge}")
    for mode, m in lookups["modes"].items():
        label = "one thread every side" if mode == "one" else f"every core ({m['threads']} threads) every side"
        print(f"  {label}:")
        print(f"  {'rows':>7} {'cxltier':>9} {'index_select':>13} {'SGLang stager':>14} {'÷ index_select':>15} {'÷ SGLang':>9}")
        for r in m["rows"]:
            print(f"  {r['rows']:>7} {r['cxltier_p50_us']:>9.1f} {r['index_select_p50_us']:>13.1f} {r['sglang_p50_us']:>14.1f} "
                  f"{r['vs_index_select']:>14.2f}× {r['vs_sglang']:>8.2f}×")
    print("  (÷: the other side's time over cxltier's; above 1, cxltier is faster)")


def load_only(rows, tmp, env):
    """Loads the table into the tier through SGLang's loaders, in a worker
    process, for a lookup-only run."""
    ready, go = os.path.join(tmp, "ready-load"), os.path.join(tmp, "go-load")
    p = subprocess.Popen([sys.executable, "-W", "ignore", __file__, "--worker", "tier", "--rows", str(rows),
                          "--port", str(_free_port()), "--ready", ready, "--go", go], env=env)
    deadline = time.time() + 600
    while not os.path.exists(ready):
        if p.poll() is not None or time.time() > deadline:
            raise SystemExit(f"loader failed (exit {p.poll()})")
        time.sleep(0.05)
    open(go, "w").close()
    p.wait(timeout=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=2_000_000, help="rows of the layer's table (264 B each)")
    ap.add_argument("--calls", type=int, default=200, help="lookup calls per side and size (fewer for large sizes)")
    ap.add_argument("--tier-dir", help="make the tier a file in this directory (a tmpfs mounted huge=within_size "
                    "gives it huge pages) instead of shm")
    ap.add_argument("--lookup-only", action="store_true", help="skip the memory and attach parts")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="rows per lookup call, comma-separated")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "local", "engram-host.json"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--port", help=argparse.SUPPRESS)
    ap.add_argument("--ready", help=argparse.SUPPRESS)
    ap.add_argument("--go", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker, a.rows, a.port, a.ready, a.go)
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes {a.sizes!r}: want whole numbers separated by commas")
    if a.rows < 64 or a.calls < 1 or not sizes or min(sizes) < 1:
        ap.error("--rows must be at least 64, --calls and every size positive")
    nbytes = a.rows * (DIM + SCALES)
    with tempfile.TemporaryDirectory() as tmp:
        _, cli = build(tmp)
        name = f"cxltier-bench-engram-{uuid.uuid4().hex[:8]}"
        size_mib = nbytes // (1 << 20) + 64
        path = os.path.join(a.tier_dir, name) if a.tier_dir else f"/dev/shm/{name}"
        device = f"file:{path}" if a.tier_dir else f"shm:{name}"
        subprocess.check_call([cli, "format", "-device", device, "-size", f"{size_mib}MiB", "-chunk", "1MiB"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            env = dict(os.environ, CXLTIER_DEVICES=device, CXLTIER_ENGRAM_MODEL="bench-model",
                       SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE="1", SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT="shared")
            print(f"table: {a.rows} rows × 264 B = {nbytes / 2**30:.2f} GiB (V4.1-Flash: 94.6 GiB a layer)", file=sys.stderr)
            if a.lookup_only:
                load_only(a.rows, tmp, env)
                ours = theirs = None
            else:
                ours, ours_shmem = run_instances("tier", a.rows, tmp, env)
                theirs, theirs_shmem = run_instances("sglang", a.rows, tmp, env)
            lookups = lookup(device, a.rows, a.calls, sizes)
        finally:
            os.remove(path)
    gib = nbytes / 2**30
    hw = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    print(f"\nEngram host table, one layer of {gib:.2f} GiB; {hw}, Python {platform.python_version()}")
    if ours is not None:
        print_memory(ours, ours_shmem, theirs, theirs_shmem, gib)
    print_lookups(lookups)
    rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    import sglang

    report = {"run": {"commit": rev or "unknown", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                      "python": platform.python_version(), "cores": os.cpu_count(), "sglang": sglang.__version__,
                      "hardware": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"},
              "table": {"rows": a.rows, "bytes": nbytes, "note": "one layer, scaled down from V4.1-Flash's 384 M rows"},
              "lookup": lookups}
    if ours is not None:
        load, attach = ours[0]["seconds"], ours[1]["seconds"]
        report["memory"] = {"cxltier": {"instances": ours, "node_shmem_added_kb": ours_shmem},
                            "sglang_shared": {"instances": theirs, "node_shmem_added_kb": theirs_shmem}}
        report["attach"] = {"load_s_per_gib": load / gib, "attach_s_per_gib": attach / gib, "speedup": load / attach,
                            "sglang_second_load_s_per_gib": theirs[1]["seconds"] / gib}
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
