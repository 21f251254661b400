"""A batch of mixed requests in vLLM's real CPU engine: some with their
prompts' blocks in the tier, some with nothing to find. Do the requests
without a hit wait for the others' loads? Synchronous loads against
asynchronous ones (cxltier.vllm's async_load_bytes), in one run.

    python bench/vllm/mixed.py [--layers 8] [--hidden 1024] [--tokens 2048]
                               [--hits 2] [--misses 2] [--rounds 2]
                               [--tier-size 4GiB] [--out FILE]

Run it with the Python of the vLLM virtualenv .ci/run builds. Engines
(each a vLLM process tree, a Llama of dummy weights, all on one tier):

  store   computes every round's tier prompts and stores their blocks,
          then exits
  sync    every load synchronous (async_load_bytes 1TiB)
  async   every load asynchronous (async_load_bytes 0)

sync and async each run, per round, two batches of the same shape: the
hits first (as if they arrived first), then the misses.

  local   the hits are prompts this engine computed just before (vLLM's
          own prefix cache holds them): nothing loads. The baseline.
  tier    the hits are the store engine's prompts: their blocks load
          from the tier.

A hit computes the same tokens either way (its last partial block). Misses
are fresh prompts every time (their own cache salt). TTFT is vLLM's own
per-request first-token latency (from arrival to first token). The result:
the misses' median TTFT in the tier batch over the local one, per engine;
the goal is within 1.1x with asynchronous loads. The hits' tokens are
compared across the engines, and every hit must have found every whole
block but the last.
"""

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from bench import Engine, LLAMA, connector, machine, prompt, scratch_tier, write_model  # noqa: E402

BLOCK = 128  # vLLM's CPU block size


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=2048, help="tokens of every prompt")
    p.add_argument("--hits", type=int, default=2)
    p.add_argument("--misses", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tier-size", default="4GiB")
    p.add_argument("--out", default=None)
    return p.parse_args()


def main():
    args = parse_args()
    args.load_before = os.getloadavg()
    if min(args.hits, args.misses, args.rounds) < 1 or args.hits + args.misses > 8:
        sys.exit("mixed: --hits, --misses and --rounds at least 1, hits + misses at most 8")
    with scratch_tier("bench-mixed", args.tier_size) as (tier, env):
        result = run(args, tier, env)
    report(args, result)


def run(args, tier, env):
    heads = max(2, args.hidden // 64)
    kv_bytes = args.layers * 2 * (heads // 2) * 64 * 2 * (args.tokens + BLOCK)  # per prompt, bf16
    stored = [[prompt(1000 * r + i, args.tokens) for i in range(args.hits)] for r in range(args.rounds)]
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(os.path.join(tmp, "model"), LLAMA, weights=False, hidden_size=args.hidden,
                            intermediate_size=2 * args.hidden, num_hidden_layers=args.layers,
                            num_attention_heads=heads, num_key_value_heads=heads // 2, head_dim=64,
                            max_position_embeddings=max(4096, args.tokens + BLOCK))
        n = args.hits + args.misses
        base = {"model_dir": model, "max_model_len": args.tokens + BLOCK, "stats": True, "max_num_seqs": n,
                "kv_cache_bytes": max(256 << 20, 4 * n * kv_bytes)}
        room = 4 * args.rounds * args.hits * kv_bytes
        one = lambda name, toks, **kw: {"name": name, "tokens": toks, "max_tokens": 1, **kw}  # noqa: E731
        warm = lambda i: one(f"warm{i}", prompt(900 + i, 64))  # noqa: E731
        print(f"store: computing {args.rounds * args.hits} prompts of {args.tokens} tokens...", flush=True)
        Engine({**base, "connector": connector(tier, "kv_both", room, "4MiB", index="bench-mixed"), "requests": [warm(0)] + [
            {"batch": [one(f"h{r}.{i}", p) for i, p in enumerate(hs)]} for r, hs in enumerate(stored)]},
            tmp, "store", env).wait()
        out = {}
        for mode, async_bytes in (("sync", "1TiB"), ("async", "0")):
            reqs = [warm(1)]
            for r in range(args.rounds):
                misses = lambda tag: [one(f"{tag}{r}.m{i}", prompt(500 + 10 * r + i, args.tokens),  # noqa: E731
                                          salt=f"{mode}-{tag}{r}") for i in range(args.misses)]
                local = [prompt(7000 + 1000 * r + i, args.tokens) for i in range(args.hits)]
                reqs.append({"batch": [one(f"compute{r}.h{i}", p) for i, p in enumerate(local)]})
                reqs.append({"batch": [one(f"local{r}.h{i}", p) for i, p in enumerate(local)] + misses("local")})
                reqs.append({"batch": [one(f"tier{r}.h{i}", p) for i, p in enumerate(stored[r])] + misses("tier")})
            print(f"{mode}: {args.rounds} rounds of {args.hits} hits and {args.misses} misses, from vLLM's cache "
                  "and from the tier...", flush=True)
            out[mode] = Engine({**base, "connector": connector(tier, "kv_both", room, async_bytes, index="bench-mixed"), "requests": reqs},
                               tmp, mode, env).wait()
    return out


def summary(args, got):
    ttft = lambda tag: [got[f"{tag}{r}.m{i}"]["ttft"] * 1e3 for r in range(args.rounds)  # noqa: E731
                        for i in range(args.misses)]
    local, tier = ttft("local"), ttft("tier")
    hits = lambda tag: [got[f"{tag}{r}.h{i}"] for r in range(args.rounds) for i in range(args.hits)]  # noqa: E731
    return {"misses_local_ms": statistics.median(local), "misses_tier_ms": statistics.median(tier),
            "ratio": statistics.median(tier) / statistics.median(local),
            "hits_local_ms": statistics.median(h["ttft"] * 1e3 for h in hits("local")),
            "hits_tier_ms": statistics.median(h["ttft"] * 1e3 for h in hits("tier")),
            "hits_cached_tokens": sorted({h["cached"] for h in hits("tier") + hits("local")}),
            "misses_local_all_ms": local, "misses_tier_all_ms": tier}


def report(args, out):
    want_cached = (args.tokens - 1) // BLOCK * BLOCK
    rows = {mode: summary(args, got) for mode, got in out.items()}
    agree = all(out["sync"][f"tier{r}.h{i}"]["tokens"] == out["async"][f"tier{r}.h{i}"]["tokens"]
                for r in range(args.rounds) for i in range(args.hits))
    print(f"\nengine: vLLM CPU, Llama {args.layers} layers, hidden {args.hidden}; prompts of {args.tokens} tokens; "
          f"{args.hits} hits then {args.misses} misses a batch, {args.rounds} rounds; TTFT medians")
    print(f"{'loads':7} {'misses, hits local':>19} {'misses, hits from tier':>23} {'tier / local':>13} "
          f"{'hits local':>11} {'hits tier':>10}")
    for mode, r in rows.items():
        print(f"{mode:7} {r['misses_local_ms']:16.1f} ms {r['misses_tier_ms']:20.1f} ms {r['ratio']:12.2f}x "
              f"{r['hits_local_ms']:8.1f} ms {r['hits_tier_ms']:7.1f} ms")
    ok_cached = all(r["hits_cached_tokens"] == [want_cached] for r in rows.values())
    print(f"every hit found every whole block but the last ({want_cached} tokens): {ok_cached}; "
          f"the tier hits' tokens agree between sync and async: {agree}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "machine": machine(args.load_before),
                       "args": {k: v for k, v in vars(args).items() if k != "load_before"},
                       "rows": rows, "hits_agree": agree, "hits_found_all": ok_cached}, f, indent=1)
        print(f"wrote {args.out}")
    if not (agree and ok_cached):
        sys.exit("mixed: a hit did not find what was stored, or sync and async disagree")


if __name__ == "__main__":
    main()
