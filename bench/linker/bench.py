"""SGLang's unified-cache linker on cxltier (cxltier.sglang.linker), in one run
beside what it replaces. It needs SGLang (the CI virtualenv), libcxltier
(CXLTIER_LIB, or Go to build it) and the cxltier CLI (CXLTIER_CLI, or Go);
each part runs on a fresh /dev/shm tier, removed at the end.

    python bench/linker/bench.py [--pages 128] [--page-size 16] [--layers 16]
                                 [--repeat 5] [--tp 2,4,8] [--out FILE]

Load (MHA, Llama-3-8B's 8 KV heads of 128 in bf16, one rank): the same
pages, stored once, brought into SGLang's device KV pool; "load ms" is the
copy (for the linker: from the batch's start to SGLang's verdict, the
forward waiting on each layer), "lookup ms" what comes before it (the
linker: SGLang's match through the tree and lookup; L3: batch_exists)

  linker          tier → device pool a layer per gather launch (the cpu
                  engine here), the forward waiting layer by layer through
                  SGLang's LayerWiseLoadCounter, checksums checked
  HiCache L3      what SGLang's hierarchical cache does with the cxltier
                  HiCache backend: tier → host pool (batch_get_v1,
                  checksums checked), then host pool → device pool a layer
                  at a time: the index copies SGLang's "direct" I/O backend
                  makes, done with torch (that backend's transfer_kv_direct
                  comes from sgl_kernel, which has no CPU build)

Tier bytes (MLA, DeepSeek-V3's 512 + 64 latent in bf16, 8 layers): TP
ranks, one OS process each in a gloo group, store the same prompt through
SGLang's tree; the index's bytes in use after all of them, against one
copy. "per rank" keys each rank's pages apart (share_ranks 0), as a store
that cannot share memory between ranks keeps them.
"""

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS_REAL = os.path.join(REPO, "python", "tests_sglang")
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, TESTS_REAL)

from pybuild import ShmTier, build  # noqa: E402


def load_rows(cli, pages, page_size, layers, repeat):
    import torch
    from linker_stack import MODEL, Stack, publish_server_args

    from cxltier.sglang.hicache import CxlTierStorage
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.runtime_context import reset_context

    tokens = list(range(10, 10 + pages * page_size))
    page_bytes = 2 * layers * page_size * MODEL["head_num"] * MODEL["head_dim"] * 2
    size = f"{max(256, 3 * pages * page_bytes // (1 << 20) + 64)}MiB"
    out = {}
    with ShmTier(cli, size, "linker-bench") as tier:
        args = publish_server_args(tier.spec, page_size, index="load", blocks=pages + 8)
        pool_tokens = 2 * len(tokens) + page_size
        a = Stack(args, "mha", page_size, tokens=pool_tokens, layers=layers, dims=MODEL)
        a.store(tokens, seed=1)
        a.close()

        times, lookups = [], []
        for r in range(repeat):
            b = Stack(args, "mha", page_size, tokens=pool_tokens, layers=layers, dims=MODEL)
            hit, _, _, failed = b.load(tokens, rid=f"r{r}", snapshot=False)
            assert hit == len(tokens) and not failed, (hit, failed)
            times.append(b.timings["load"])
            lookups.append(b.timings["match"])
            b.close()
        out["linker"] = times

        # The HiCache L3 path for the same pages: the backend stores them
        # from a host pool, then each run loads them into the host pool and
        # copies them to the device pool a layer at a time.
        dev = Stack(args, "mha", page_size, tokens=pool_tokens, layers=layers, dims=MODEL)
        info = dev.pool.get_device_pool_infos()[0].buffer_info
        host = MHATokenToKVPoolHost(info, host_to_device_ratio=2.0, host_size=0, page_size=page_size, layout="layer_first",
                                    pin_memory=False, device="cpu", device_capacity_tokens=pool_tokens, start_layer=0,
                                    end_layer=layers)
        cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                   is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
                                   model_name="dummy", extra_config={"devices": tier.spec, "index": "hicache",
                                                                     "blocks": 2 * pages + 8, "block_bytes": page_bytes // 2})
        storage = CxlTierStorage(cfg, host)
        from sglang.srt.mem_cache.utils import get_hash_str

        keys = get_hash_str(tokens, None, page_size=page_size)
        host_idx = torch.arange(0, len(tokens), dtype=torch.int64)
        assert all(storage.batch_set_v1(keys, host_idx))
        times, exists = [], []
        for _ in range(repeat):
            started = time.perf_counter()
            assert storage.batch_exists(keys) == pages
            exists.append(time.perf_counter() - started)
            dev_idx = dev.alloc.alloc(len(tokens))
            started = time.perf_counter()
            assert all(storage.batch_get_v1(keys, host_idx))
            for layer in range(layers):  # SGLang's direct transfer needs sgl_kernel: the same copy in torch
                dev.pool.k_buffer[layer][dev_idx] = host.k_buffer[layer][host_idx]
                dev.pool.v_buffer[layer][dev_idx] = host.v_buffer[layer][host_idx]
            times.append(time.perf_counter() - started)
            dev.alloc.free(dev_idx)
        out["HiCache L3"] = times
        storage.close()
        dev.close()
        reset_context()
    total = pages * page_bytes
    rows = []
    base = statistics.median(out["HiCache L3"])
    probe = {"linker": lookups, "HiCache L3": exists}
    for name, ts in out.items():
        med = statistics.median(ts)
        rows.append({"path": name, "median_ms": med * 1e3, "per_layer_ms": med * 1e3 / layers,
                     "gb_per_s": total / med / 1e9, "vs_hicache": med / base, "runs": [t * 1e3 for t in ts],
                     "lookup_ms": statistics.median(probe[name]) * 1e3})
    return rows, total


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tier_bytes_rows(cli, tps, pages, page_size):
    import cxltier

    rows = []
    one_copy = None
    for tp in tps:
        for label, extra in (("linker (shared)", {}), ("per rank", {"share_ranks": 0})):
            with ShmTier(cli, f"{max(256, 2 * max(tps) * pages * 160 // 1024 + 64)}MiB", "linker-bench") as tier:
                port = free_port()
                env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS_REAL, os.path.join(REPO, "python")]))
                procs = [subprocess.Popen([sys.executable, "-W", "ignore", os.path.join(TESTS_REAL, "linker_stack.py"),
                                           str(r), str(tp), str(port), tier.spec, "mla", str(page_size), str(pages), "store",
                                           json.dumps({"blocks": tp * pages * 3 // 2 + 8, **extra})],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                         for r in range(tp)]
                for p in procs:
                    out, err = p.communicate(timeout=600)
                    if p.returncode:
                        raise RuntimeError(err[-2000:])
                t = cxltier.Tier(tier.spec)
                st = t.prefix("linker").stats()
                t.close()
                used = st["ready"] * st["block_bytes"]
                if one_copy is None:
                    one_copy = pages * st["block_bytes"]
                rows.append({"tp": tp, "keys": label, "entries": st["ready"], "bytes": used, "copies": used / one_copy})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tp", default="2,4,8")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    if a.pages < 1 or a.page_size < 1 or a.layers < 1 or a.repeat < 1:
        ap.error("--pages, --page-size, --layers and --repeat must be at least 1")
    try:
        tps = [int(x) for x in a.tp.split(",") if x]
    except ValueError:
        ap.error(f"--tp {a.tp!r}: a comma-separated list of TP sizes")
    if not tps or min(tps) < 1:
        ap.error("--tp: sizes of at least 1")
    import tempfile

    tmp = tempfile.mkdtemp(prefix="cxltier-linker-bench-")
    _, cli = build(tmp)
    import sglang

    print(f"linker bench: SGLang {sglang.__version__}, {platform.machine()} with {os.cpu_count()} CPUs, cpu engine",
          flush=True)
    print(f"load: {a.pages} pages of {a.page_size} tokens, {a.layers} layers (MHA 8x128 bf16), median of {a.repeat}",
          flush=True)
    load, total = load_rows(cli, a.pages, a.page_size, a.layers, a.repeat)
    print(f"{'path':<12} {'load ms':>9} {'ms/layer':>9} {'GB/s':>7} {'vs L3':>6} {'lookup ms':>10}")
    for r in load:
        print(f"{r['path']:<12} {r['median_ms']:9.2f} {r['per_layer_ms']:9.3f} {r['gb_per_s']:7.2f} {r['vs_hicache']:6.2f}"
              f" {r['lookup_ms']:10.2f}")
    print(f"\ntier bytes: MLA (512+64 bf16, 8 layers), {a.pages} pages of {a.page_size} tokens stored by every rank", flush=True)
    tb = tier_bytes_rows(cli, tps, a.pages, a.page_size)
    print(f"{'tp':>3} {'keys':<16} {'entries':>8} {'MiB':>8} {'copies':>7}")
    for r in tb:
        print(f"{r['tp']:>3} {r['keys']:<16} {r['entries']:>8} {r['bytes'] / 2**20:8.1f} {r['copies']:7.2f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"bench": "linker", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                       "machine": {"arch": platform.machine(), "cpus": os.cpu_count()}, "sglang": sglang.__version__,
                       "config": vars(a), "load_bytes": total, "load": load, "tier_bytes": tb}, f, indent=1)


if __name__ == "__main__":
    main()
