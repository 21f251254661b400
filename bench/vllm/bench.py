"""vLLM engines sharing prompts through the tier (cxltier.vllm), on vLLM's
real CPU engine, against recomputing them, in one run.

    python bench/vllm/bench.py [--layers 8] [--hidden 1024] [--tokens 4096]
                               [--prompts 3] [--tier-size 4GiB] [--out FILE]

Run it with the Python of the vLLM virtualenv .ci/run builds
(python/requirements-vllm.txt). Engines (each a vLLM process tree of its
own, a Llama of dummy weights with the sizes given, all on one tier):

  first    computes each prompt and stores its blocks, then stays up
  second   started while the first runs: each prompt (the first's blocks,
           from a live peer), then the same prompt under another cache
           salt (nothing to find: recomputed, in the same engine), then
           the prompt again (vLLM's own prefix cache)
  restart  started after both exited: each prompt again
  offload  vLLM's own OffloadingConnector (CPU offload), for the same
           prompts; it needs CUDA, and where it fails to start the row
           says why

TTFT is one generate() with max_tokens=1: scheduling, loads, the prefill
of what was not found, and the first token. Memory: the tier's bytes for
the prompts' blocks (one copy, whatever the number of engines) against
what a per-engine copy takes for two engines.
"""

import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(REPO, "python", "tests_vllm")
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, TESTS)
sys.path.insert(0, os.path.join(REPO, "bench"))

from pybuild import build  # noqa: E402
from vllm_engine import LLAMA, write_model  # noqa: E402

ENGINE = os.path.join(TESTS, "vllm_engine.py")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--prompts", type=int, default=3)
    p.add_argument("--tier-size", default="4GiB")
    p.add_argument("--no-offload", action="store_true", help="skip vLLM's OffloadingConnector (a small run)")
    p.add_argument("--async-load-bytes", default="4MiB",
                   help="the connector's async_load_bytes: loads of at least this many bytes are asynchronous "
                        "(0: all, 1TiB: none)")
    p.add_argument("--out", default=None)
    return p.parse_args()


def prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


class Engine:
    """One engine process running a spec; results read as they land."""

    def __init__(self, spec, tmp, name, env):
        self.name = name
        self.spec_path, self.out_path = os.path.join(tmp, f"{name}.json"), os.path.join(tmp, f"{name}.out.json")
        with open(self.spec_path, "w") as f:
            json.dump(spec, f)
        self.log = open(os.path.join(tmp, f"{name}.log"), "w+")
        self.proc = subprocess.Popen([sys.executable, ENGINE, self.spec_path, self.out_path], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)

    def result(self, request, timeout=1800):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(self.out_path) as f:
                    out = json.load(f)
                if request in out:
                    return out
            except (FileNotFoundError, json.JSONDecodeError):
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"engine {self.name} exited {self.proc.returncode}: {self.tail()}")
            time.sleep(0.1)
        raise TimeoutError(f"engine {self.name}: no {request} after {timeout} s")

    def wait(self):
        if self.proc.wait(timeout=1800) != 0:
            raise RuntimeError(f"engine {self.name} exited {self.proc.returncode}: {self.tail()}")
        with open(self.out_path) as f:
            return json.load(f)

    def tail(self):
        self.log.seek(0)
        lines = [ln for ln in self.log.read().splitlines() if ln.strip()]
        # The root cause comes first; later lines are the engine's own wrap-up.
        errors = [ln for ln in lines if re.search(r"[A-Za-z]+Error(: |$)", ln) and "initialization failed" not in ln]
        return (errors or lines or ["(no output)"])[0][-400:]


def connector(device, role, index_bytes, async_bytes="4MiB", index="bench-vllm"):
    return {"kv_connector": "CxlTierConnector", "kv_connector_module_path": "cxltier.vllm", "kv_role": role,
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"device": device, "index": index, "index_bytes": str(index_bytes),
                                          "async_load_bytes": async_bytes}}


@contextlib.contextmanager
def scratch_tier(name, size):
    """(tier, engines' environment): the library and CLI built from this
    checkout, and a tier of size in /dev/shm, destroyed after."""
    lib, cli = build(tempfile.mkdtemp(prefix=f"cxltier-{name}-"))
    env = dict(os.environ, CXLTIER_LIB=lib, VLLM_LOGGING_LEVEL="WARNING",
               PYTHONPATH=os.path.join(REPO, "python") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    os.environ["CXLTIER_LIB"] = lib
    tier = f"shm:cxltier-{name}-{uuid.uuid4().hex[:8]}"
    subprocess.check_call([cli, "format", "-device", tier, "-size", size], stdout=subprocess.DEVNULL)
    try:
        yield tier, env
    finally:
        subprocess.run([cli, "destroy", "-force", tier], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            os.remove("/dev/shm/" + tier.removeprefix("shm:"))
        except FileNotFoundError:
            pass


def machine(load_before):
    """The machine of a run, with its load averages (1, 5 and 15 min) as
    the run began and ended: a run beside other work says so in its JSON."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "load_average": {"before": [round(x, 2) for x in load_before],
                             "after": [round(x, 2) for x in os.getloadavg()]}}


def main():
    args = parse_args()
    args.load_before = os.getloadavg()
    with scratch_tier("bench-vllm", args.tier_size) as (tier, env):
        import cxltier

        rows, memory, offload = run(args, tier, env, cxltier)
    report(args, rows, memory, offload)


def run(args, tier, env, cxltier):
    heads = max(1, args.hidden // 64)
    prompts = [prompt(100 + i, args.tokens) for i in range(args.prompts)]
    kv_bytes = args.layers * 2 * (heads // 2) * 64 * 2 * (args.tokens + 128)  # per prompt, bf16
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(os.path.join(tmp, "model"), LLAMA, weights=False, hidden_size=args.hidden,
                            intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                            num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=64,
                            max_position_embeddings=max(4096, args.tokens + 128))
        base = {"model_dir": model, "max_model_len": args.tokens + 128,
                "kv_cache_bytes": max(256 << 20, 2 * kv_bytes)}
        one = lambda name, toks, **kw: {"name": name, "tokens": toks, "max_tokens": 1, **kw}  # noqa: E731
        # The index: room for every prompt twice over (the second engine stores the salted copies too).
        room = 4 * args.prompts * kv_bytes
        gate = os.path.join(tmp, "first-may-go")
        # Each engine's first generate() pays for warming up: a short prompt of its own goes first.
        warm = lambda i: one("warm", prompt(900 + i, 64))  # noqa: E731
        first = Engine({**base, "connector": connector(tier, "kv_both", room, args.async_load_bytes), "requests": [
            warm(0), *(one(f"p{i}", p) for i, p in enumerate(prompts)),
            one("done", prompts[0], wait_for=gate)]}, tmp, "first", env)
        print(f"first engine: computing {args.prompts} prompts of {args.tokens} tokens...", flush=True)
        first.result(f"p{args.prompts - 1}")
        with cxltier.Tier(tier) as t:  # the prompts' blocks, stored once
            ix = t.prefix("bench-vllm")
            st = ix.stats()
            ix.close()
        second = Engine({**base, "connector": connector(tier, "kv_both", room, args.async_load_bytes), "requests": [warm(1)] + [
            r for i, p in enumerate(prompts) for r in (one(f"tier{i}", p), one(f"recompute{i}", p, salt=f"s{i}"),
                                                       one(f"local{i}", p))]}, tmp, "second", env)
        print("second engine, beside the first...", flush=True)
        out2 = second.wait()
        open(gate, "w").close()
        out1 = first.wait()
        print("restarted engine...", flush=True)
        out3 = Engine({**base, "connector": connector(tier, "kv_both", room, args.async_load_bytes), "requests": [warm(2)] + [
            one(f"restart{i}", p) for i, p in enumerate(prompts)]}, tmp, "restart", env).wait()
        out4, offload = {}, "not run (--no-offload)"
        if not args.no_offload:
            out4, offload = offload_run(args, base, one, warm, prompts, kv_bytes, tmp, env)
    rows = []
    for case, src, name in (("first engine computes", out1, "p"), ("recompute (other salt)", out2, "recompute"),
                            ("second engine, from the tier", out2, "tier"), ("vLLM's own prefix cache", out2, "local"),
                            ("restart, from the tier", out3, "restart"), ("vLLM OffloadingConnector", out4, "offload")):
        got = [src[f"{name}{i}"] for i in range(args.prompts) if f"{name}{i}" in src]
        if got:
            rows.append({"case": case, "ttft_ms": statistics.median(g["seconds"] for g in got) * 1e3,
                         "cached_tokens": statistics.median(g["cached"] for g in got)})
    same = all(out2[f"tier{i}"]["tokens"] == out2[f"recompute{i}"]["tokens"] == out3[f"restart{i}"]["tokens"]
               for i in range(args.prompts))
    tier_bytes = st["used_blocks"] * st["block_bytes"]
    memory = {"tier_bytes_all_engines": tier_bytes, "stats": st, "two_engine_copies_bytes": 2 * tier_bytes,
              "tokens_agree": same}
    return rows, memory, offload


def offload_run(args, base, one, warm, prompts, kv_bytes, tmp, env):
    """vLLM's own OffloadingConnector on the same prompts: (results, what happened)."""
    print("vLLM's OffloadingConnector...", flush=True)
    conn = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
            "kv_connector_extra_config": {"cpu_bytes_to_use": 2 * kv_bytes}}
    off = Engine({**base, "connector": conn, "requests": [warm(3)] + [
        one(f"offload{i}", p) for i, p in enumerate(prompts)]}, tmp, "offload", env)
    try:
        return off.wait(), "ran"
    except RuntimeError as e:
        return {}, f"did not start on this platform: {e}"


def report(args, rows, memory, offload):
    base = next(r["ttft_ms"] for r in rows if r["case"].startswith("recompute"))
    print(f"\nengine: vLLM CPU, Llama {args.layers} layers, hidden {args.hidden}; prompts of {args.tokens} tokens, "
          f"median of {args.prompts}")
    print(f"{'case':34} {'TTFT ms':>9} {'vs recompute':>12} {'cached tokens':>14}")
    for r in rows:
        r["speedup"] = base / r["ttft_ms"]
        print(f"{r['case']:34} {r['ttft_ms']:9.1f} {r['speedup']:11.2f}x {r['cached_tokens']:14.0f}")
    print(f"vLLM's OffloadingConnector: {offload}")
    print(f"tokens through the tier equal the recomputed ones: {memory['tokens_agree']}")
    print(f"memory for the prompts' KV: {memory['tier_bytes_all_engines'] / 2**20:.1f} MiB in the tier for every "
          f"engine; a copy per engine: {memory['two_engine_copies_bytes'] / 2**20:.1f} MiB for two")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "machine": machine(args.load_before),
                       "args": {k: v for k, v in vars(args).items() if k != "load_before"},
                       "rows": rows, "memory": memory, "offloading_connector": offload}, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
