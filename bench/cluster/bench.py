"""The cluster tier against SGLang's own Mooncake backend, on one master, in
one run. Every number comes from SGLang's real HiCacheController (the
cxltier backend and SGLang's "mooncake" backend, both MLA pools), running in
one OS process per node and rank; each node's tier has its uplink
(python -m cxltier.cluster.uplink) in a process of its own.

    python bench/cluster/bench.py [--repeat 5] [--batches 1,64,256]
        [--page-kib 63,2016] [--ranks 8] [--exists 1000,10000,30000]
        [--protocol tcp] [--hostname 127.0.0.1] [--out FILE]

It needs a Python with SGLang (python/requirements-sglang.txt) and Mooncake
(python/requirements-mooncake.txt) both installed:

    python -m venv v && v/bin/pip install --no-deps -r python/requirements-sglang.txt \\
        -r python/requirements-mooncake.txt
    v/bin/python bench/cluster/bench.py

What it measures, per page size and batch (pages of DeepSeek's MLA latent,
576 values in bf16 a token and layer: 8 tokens x 7 layers = 63 KiB, 64
tokens x 28 layers = 1.97 MiB):

  local hit     node A loads pages its own tier holds (batch_exists, then
                page_get: tier -> host pool)
  cluster hit   node B loads pages only node A stored: B's batch_exists
                asks B's uplink, which fetches them from the cluster into
                B's tier in place; then page_get is a local load
  SGLang        SGLang's Mooncake backend: node A's server stored the pages,
                node B's loads them (batch_exists, then page_get: the
                transfer lands in B's host pool)

and "exists" of many keys (all present): through cxltier on a node that
holds them, and SGLang's backend asking the master. Then the bytes that
cross the network (the loopback counters) for one prefix loaded by TP
ranks on node B, each rank its own process as in a server: cxltier fetches
each page once for the node; SGLang's backend fetches it per rank.

On one machine every "network" byte crosses loopback TCP: the times are
function, not NIC performance (TCP on loopback shares the cores with
everything else). On an RDMA pair run it as written with --protocol rdma
and --hostname set to each node's address.
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "python", "tests"))
sys.path.insert(0, os.path.join(REPO, "bench"))

LATENT = 576  # kv_lora_rank 512 + rope 64, bf16
PAGE_CONFIGS = {63: (8, 7), 2016: (64, 28)}  # KiB -> (tokens a page, layers)


# The worker: one node's (or rank's) SGLang objects, driven line by line.


class Worker:
    def __init__(self, req):
        import torch
        import torch.distributed as dist
        from sglang.srt.runtime_context import get_parallel

        self.torch = torch
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(req["gloo_port"]))
        dist.init_process_group("gloo", rank=0, world_size=1)
        self._parallel = get_parallel().override(attn_dcp_size=1, attn_dcp_rank=0, tp_rank=req["tp_rank"],
                                                 tp_size=req["tp_size"], pp_rank=0, pp_size=1)
        self._parallel.__enter__()
        self.page, self.layers = req["page_tokens"], req["layers"]
        self.capacity = req["pages"]
        self.dev, self.host = self._pools()
        self.controllers = {}
        for backend in req["backends"]:
            self.controllers[backend] = self._controller(dist.group.WORLD, backend, req)

    def _pools(self):
        from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

        tokens = (self.capacity + 2) * self.page
        dev = MLATokenToKVPool(size=tokens, page_size=self.page, dtype=self.torch.bfloat16, kv_lora_rank=512,
                               qk_rope_head_dim=64, layer_num=self.layers, device="cpu", enable_memory_saver=False)
        info = dev.get_device_pool_infos()[0].buffer_info
        host = MLATokenToKVPoolHost(info, host_to_device_ratio=1.0, host_size=0, page_size=self.page,
                                    layout="page_first", pin_memory=False, device="cpu",
                                    device_capacity_tokens=tokens, start_layer=0, end_layer=self.layers,
                                    target_layer_num=self.layers)
        return dev, host

    def _controller(self, group, backend, req):
        import threading

        from sglang.srt.managers.cache_controller import HiCacheController
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

        if backend == "cxltier":
            kind = "dynamic"
            page_bytes = self.page * self.layers * LATENT * 2
            extra = {"backend_name": "cxltier", "module_path": "cxltier.sglang.hicache", "class_name": "CxlTierStorage",
                     "interface_v1": 1, "devices": req["devices"], "index": f"bench-{self.page}x{self.layers}",
                     "blocks": req["blocks"], "block_bytes": page_bytes + 64}  # room for the trailer
        else:
            kind = "mooncake"
            extra = {"master_server_address": req["master"], "metadata_server": "P2PHANDSHAKE",
                     "protocol": req["protocol"], "local_hostname": req["hostname"],
                     "global_segment_size": req["segment"]}
        alloc = TokenToKVPoolAllocator(self.dev.size, self.torch.bfloat16, "cpu", self.dev, False)
        return HiCacheController(alloc, self.host, self.page, group, threading.Event(), storage_backend=kind,
                                 storage_backend_extra_config=extra, model_name="bench/mla")

    def hashes(self, seed, n):
        from sglang.srt.mem_cache.utils import get_hash_str

        g = self.torch.Generator().manual_seed(seed)
        tokens = [int(x) for x in self.torch.randint(0, 120000, (n * self.page,), generator=g)]
        return get_hash_str(tokens, None, page_size=self.page)

    def indices(self, first, n):
        return self.torch.arange(first * self.page, (first + n) * self.page, dtype=self.torch.int64)

    def page_digest(self, p):
        return hashlib.sha256(self.host.get_data_page(p * self.page, flat=True).view(self.torch.int16).numpy()
                              .tobytes()).hexdigest()[:16]

    def fill_pages(self, seed, n):
        g = self.torch.Generator().manual_seed(seed + 1)
        for p in range(1, 1 + n):
            page = self.host.get_data_page(p * self.page, flat=True)
            data = self.torch.randint(-1000, 1000, page.shape, dtype=self.torch.int16, generator=g)
            self.host.set_from_flat_data_page(p * self.page, data.view(page.dtype))

    def op_store(self, req):
        """Stores n pages of seed through backend; returns their digests."""
        ctl = self.controllers[req["backend"]]
        n = req["n"]
        self.fill_pages(req["seed"], n)
        hashes = self.hashes(req["seed"], n)
        for i in range(0, n, 256):
            assert ctl.page_set_func(hashes[i:i + 256], self.indices(1 + i, min(256, n - i))), "page_set failed"
        return {"digests": [self.page_digest(p) for p in range(1, 1 + n)]}

    def op_load(self, req):
        """Loads pages [first, first + n) of seed's run: batch_exists, then
        page_get, timed together; the digests of what landed."""
        ctl = self.controllers[req["backend"]]
        hashes = self.hashes(req["seed"], req["first"] + req["n"])[req["first"]:]
        started = time.perf_counter()
        hit = ctl.storage_backend.batch_exists(hashes)
        got = ctl.page_get_func(_Op(), hashes[:hit], self.indices(1, hit)) if hit else 0
        took = time.perf_counter() - started
        return {"seconds": took, "hit": hit, "got": got,
                "digests": [self.page_digest(p) for p in range(1, 1 + got)] if req.get("digests") else []}

    def op_exists(self, req):
        ctl = self.controllers[req["backend"]]
        hashes = self.hashes(req["seed"], req["n"])
        started = time.perf_counter()
        hit = ctl.storage_backend.batch_exists(hashes)
        return {"seconds": time.perf_counter() - started, "hit": hit}

    def op_stats(self, req):
        b = self.controllers["cxltier"].storage_backend
        return b.get_stats()


class _Op:
    request_id = "bench"

    def is_terminated(self):
        return False


def worker_main():
    w = None
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["op"] == "init":
                w = Worker(req)
                out = {"ok": True}
            else:
                out = getattr(w, "op_" + req["op"])(req)
        except Exception as e:  # reported to the driver, which stops
            import traceback

            out = {"error": f"{e}\n{traceback.format_exc()}"}
        print(json.dumps(out), flush=True)


# The driver.


class Proc:
    """A worker process."""

    def __init__(self, env, init):
        self.p = subprocess.Popen([sys.executable, "-W", "ignore", os.path.abspath(__file__), "--worker"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.call(dict(init, op="init"))

    def call(self, req):
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"worker died on {req['op']}")
        out = json.loads(line)
        if "error" in out:
            raise RuntimeError(f"worker {req['op']}: {out['error']}")
        return out

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=60)


def loopback_bytes():
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[0])
    return 0


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--page-kib", default="63,2016", help="page sizes: 63 (8 tokens x 7 layers), 2016 (64 x 28)")
    ap.add_argument("--max-batch-mib", type=int, default=256,
                    help="skip page-size and batch pairs moving more than this per batch (memory: each node holds "
                         "every page a run stores, in its tier, the cluster store and SGLang's host pool)")
    ap.add_argument("--ranks", type=int, default=8, help="TP ranks on node B for the network-bytes run")
    ap.add_argument("--prefix-pages", type=int, default=32, help="pages of the prefix the ranks load")
    ap.add_argument("--exists", default="1000,10000,30000")
    ap.add_argument("--protocol", default="tcp", choices=["tcp", "rdma"])
    ap.add_argument("--hostname", default="127.0.0.1")
    ap.add_argument("--verbose", action="store_true", help="node B's uplink logs where each fetch's time went")
    ap.add_argument("--fill-part", default="0", help="node B's uplink --fill-part (0: each fetch in one part)")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "cluster-cpu.json"))
    args = ap.parse_args()
    if args.worker:
        return worker_main()

    import cluster_harness as ch
    import sglang
    from pybuild import build

    tmp = tempfile.mkdtemp(prefix="cxltier-cluster-bench-")
    lib, cli = build(tmp)
    py = sys.executable
    env = dict(os.environ, CXLTIER_LIB=lib, PYTHONPATH=os.path.join(REPO, "python"))
    batches = [int(x) for x in args.batches.split(",")]
    sizes = [int(x) for x in args.page_kib.split(",")]
    max_exists = max(int(x) for x in args.exists.split(","))
    small = PAGE_CONFIGS[min(PAGE_CONFIGS)][0] * PAGE_CONFIGS[min(PAGE_CONFIGS)][1] * LATENT * 2
    # Every page any run stores, on a tier (each geometry an index of its
    # own) and in the cluster (both backends' copies).
    def page_bytes_of(kib):
        return PAGE_CONFIGS[kib][0] * PAGE_CONFIGS[kib][1] * LATENT * 2

    def runs(kib):
        return [b for b in batches if b * page_bytes_of(kib) <= args.max_batch_mib << 20]

    stored = (sum(sum(runs(k)) * args.repeat * page_bytes_of(k) for k in sizes)
              + sum(int(x) for x in args.exists.split(",")) * 2 * LATENT * 2 + args.prefix_pages * small)
    tier_size = f"{(stored + stored // 4 + (256 << 20)) >> 20}MiB"
    segment = 2 * stored + stored // 4 + (256 << 20)
    print(f"cluster bench: SGLang {sglang.__version__}, {platform.machine()} with {os.cpu_count()} CPUs, "
          f"{args.protocol} over loopback, tiers of {tier_size}", flush=True)
    master = ch.Master(py, tmp).start()
    nodes = {n: ch.Node(py, cli, lib, tmp, n, size=tier_size) for n in ("a", "b")}
    result = {"date": datetime.date.today().isoformat(),
              "machine": {"arch": platform.machine(), "cpus": os.cpu_count()}, "sglang": sglang.__version__,
              "protocol": args.protocol, "fill_part": args.fill_part, "rows": [], "skipped": [], "exists": [], "network": []}
    try:
        nodes["a"].start_uplink(master, segment=f"{segment >> 20}MiB")
        nodes["b"].start_uplink(master, segment="0",
                                args=(["--verbose"] if args.verbose else []) + ["--fill-part", args.fill_part])
        common = {"backends": ["cxltier", "mooncake"], "master": master.address, "protocol": args.protocol,
                  "hostname": args.hostname, "segment": segment, "tp_size": 1, "tp_rank": 0}
        seed = 100
        for kib in sizes:
            tokens, layers = PAGE_CONFIGS[kib]
            for batch in batches:
                if batch not in runs(kib):
                    print(f"  page {page_bytes_of(kib) / 1024:6.0f} KiB batch {batch:3d}: skipped "
                          f"({batch * page_bytes_of(kib) >> 20} MiB a batch, over --max-batch-mib {args.max_batch_mib})")
                    result["skipped"].append({"page_bytes": page_bytes_of(kib), "batch": batch})
                    continue
                seed += 1
                init = dict(common, page_tokens=tokens, layers=layers, pages=batch * args.repeat,
                            blocks=sum(runs(kib)) * args.repeat + 64)
                with Pair(env, nodes, init) as (a, b):
                    result["rows"].append(load_row(a, b, nodes, args, seed, batch, tokens * layers * LATENT * 2))
        with Pair(env, nodes, dict(common, page_tokens=1, layers=1, pages=max_exists,
                                   blocks=2 * sum(int(x) for x in args.exists.split(",")) + 64)) as (a, b):
            exists_run(result, a, b, args, nodes)
        network_run(result, args, env, nodes, master, segment)
        result["uplink_b"] = nodes["b"].metrics()
        if args.verbose:
            print("node B's uplink, where each fetch's time went:")
            result["uplink_b_fetches"] = [line.split("DEBUG ", 1)[-1].strip()
                                          for line in nodes["b"].tail(400).splitlines() if "fetch of" in line]
            for line in result["uplink_b_fetches"]:
                print("  " + line)
    finally:
        for n in nodes.values():
            n.destroy()
        master.kill()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


class Pair:
    """Node A's and node B's workers for one page geometry."""

    def __init__(self, env, nodes, init):
        import cluster_harness as ch

        # Node B lends no memory to the cluster, for either backend: what it
        # loads crosses the network, as on a node that missed the prefix.
        self.procs = [Proc(env, dict(init, devices=nodes[n].devices, gloo_port=ch.free_port(),
                                     segment=init["segment"] if n == "a" else 0)) for n in ("a", "b")]

    def __enter__(self):
        return self.procs

    def __exit__(self, *exc):
        for p in self.procs:
            if exc[0] is None:
                p.close()
            else:
                p.p.kill()


def store_both(proc, node, seed, n, behind=True):
    """Stores n pages through both backends on node A and (behind) waits for
    A's uplink to have written the cxltier ones behind; their digests."""
    import cluster_harness as ch

    before = node.metrics()
    want = proc.call({"op": "store", "backend": "cxltier", "seed": seed, "n": n})["digests"]
    proc.call({"op": "store", "backend": "mooncake", "seed": seed, "n": n})
    if behind:
        def settled():
            m = node.metrics()
            return m if m["put_pages"] + m["dropped_pages"] >= before["put_pages"] + before["dropped_pages"] + n else None

        m = ch.wait_for(settled, 300, "node A's write-behind")
        if m["dropped_pages"] > before["dropped_pages"]:
            raise RuntimeError(f"node A's uplink dropped {m['dropped_pages'] - before['dropped_pages']:.0f} pages "
                               "instead of writing them behind: see its log")
    return want


def load_row(a, b, nodes, args, seed, batch, page_bytes):
    want = store_both(a, nodes["a"], seed, batch * args.repeat)
    row = {"page_bytes": page_bytes, "batch": batch}
    for label, proc, backend in (("local", a, "cxltier"), ("cluster", b, "cxltier"), ("sglang_mooncake", b, "mooncake")):
        times, ok = [], True
        for r in range(args.repeat):
            out = proc.call({"op": "load", "backend": backend, "seed": seed, "first": r * batch, "n": batch,
                             "digests": True})
            ok &= out["got"] == batch and out["digests"] == want[r * batch:(r + 1) * batch]
            times.append(out["seconds"])
        p50 = statistics.median(times)
        row[label] = {"p50_ms": p50 * 1e3, "p99_ms": pct(times, 0.99) * 1e3, "gbps": batch * page_bytes / p50 / 1e9,
                      "byte_identical": ok}
    print(f"  page {page_bytes / 1024:6.0f} KiB batch {batch:3d}: " + " | ".join(
        f"{k} {row[k]['gbps']:6.2f} GB/s p50 {row[k]['p50_ms']:8.2f} p99 {row[k]['p99_ms']:8.2f} ms"
        f"{'' if row[k]['byte_identical'] else ' WRONG BYTES'}" for k in ("local", "cluster", "sglang_mooncake")),
        flush=True)
    return row


def exists_run(result, a, b, args, nodes):
    """exists of many stored pages: cxltier on the node that holds them
    (local probes), SGLang's backend asking the master."""
    for n in (int(x) for x in args.exists.split(",")):
        seed = 10_000 + n
        store_both(a, nodes["a"], seed, n, behind=False)  # node A's own pages: exists asks nothing of the cluster
        row = {"keys": n}
        for label, proc, backend in (("cxltier_local", a, "cxltier"), ("sglang_mooncake", b, "mooncake")):
            times = []
            for _ in range(args.repeat):
                out = proc.call({"op": "exists", "backend": backend, "seed": seed, "n": n})
                if out["hit"] != n:
                    raise RuntimeError(f"exists {label}: {out['hit']} of {n}")
                times.append(out["seconds"])
            row[label] = {"p50_ms": statistics.median(times) * 1e3, "p99_ms": pct(times, 0.99) * 1e3}
        result["exists"].append(row)
        print(f"  exists of {n:6d} keys: cxltier (local) p50 {row['cxltier_local']['p50_ms']:7.2f} ms | "
              f"SGLang's Mooncake backend p50 {row['sglang_mooncake']['p50_ms']:7.2f} ms", flush=True)


def network_run(result, args, env, nodes, master, segment):
    """One prefix loaded by TP ranks of node B, each its own process: the
    bytes on loopback while they load, cxltier against SGLang's backend."""
    import concurrent.futures as cf

    import cluster_harness as ch

    tokens, layers = PAGE_CONFIGS[min(PAGE_CONFIGS)]
    page_bytes = tokens * layers * LATENT * 2
    n = args.prefix_pages
    init = {"page_tokens": tokens, "layers": layers, "pages": n, "master": master.address, "protocol": args.protocol,
            "hostname": args.hostname, "segment": 0, "blocks": 4 * n + 64}
    seed = 77
    writer = Proc(env, dict(init, backends=["cxltier", "mooncake"], devices=nodes["a"].devices, tp_rank=0, tp_size=1,
                            segment=segment, gloo_port=ch.free_port()))
    store_both(writer, nodes["a"], seed, n)
    for backend in ("cxltier", "mooncake"):
        ranks = [Proc(env, dict(init, backends=[backend], devices=nodes["b"].devices, tp_rank=r, tp_size=args.ranks,
                                gloo_port=ch.free_port())) for r in range(args.ranks)]
        before = loopback_bytes()
        started = time.perf_counter()
        with cf.ThreadPoolExecutor(len(ranks)) as ex:
            outs = list(ex.map(lambda p: p.call({"op": "load", "backend": backend, "seed": seed, "first": 0, "n": n}),
                               ranks))
        took = time.perf_counter() - started
        moved = loopback_bytes() - before
        for p in ranks:
            p.close()
        row = {"backend": "cxltier" if backend == "cxltier" else "sglang_mooncake", "ranks": args.ranks, "pages": n,
               "page_bytes": page_bytes, "prefix_bytes": n * page_bytes, "loopback_bytes": moved, "seconds": took,
               "all_hit": all(o["got"] == n for o in outs)}
        result["network"].append(row)
        print(f"  TP{args.ranks} MLA prefix of {n} pages ({n * page_bytes / 1e6:.1f} MB) on node B: {row['backend']:16s} "
              f"{moved / 1e6:8.1f} MB on the network ({moved / (n * page_bytes):.2f}x the prefix), "
              f"every rank hit: {row['all_hit']}", flush=True)
    writer.close()


if __name__ == "__main__":
    sys.exit(main())
