"""Routing by KV events against round-robin, over node tiers joined by the
cluster tier. All parts are real: three node tiers in /dev/shm, each with
its uplink (python -m cxltier.cluster.uplink --master ... --events ...) on one
mooncake_master, and Dynamo's standalone KV indexer subscribed to the
three event streams. Only the servers are not: each request is what an
SGLang server's HiCache L3 does with its prompt on the node it was sent
to (batch_exists, which fills from the cluster past a local miss, then
storing the pages it computed, with their tokens recorded).

    python bench/routing/bench.py [--nodes 3] [--conversations 24]
        [--turns 6] [--groups 4] [--system-tokens 1024] [--user-tokens 128]
        [--reply-tokens 256] [--page 16] [--node-pages 1000,4000] [--page-kib 16]
        [--trace FILE] [--out FILE]

It needs Mooncake (python/requirements-mooncake.txt, with pyzmq) in the
Python named by $CXLTIER_MOONCAKE_PYTHON (or this one) for the uplinks, and
Dynamo's indexer (python/requirements-dynamo.txt) in $CXLTIER_DYNAMO_PYTHON.

The trace is multi-turn chat in the shape of SGLang's bench_multiturn:
conversations in groups that share a system prompt; each turn's prompt is
the whole history so far plus a new user message, and the reply joins the
history. Turns come in rounds (every conversation's turn t, in a shuffled
order), and events have a moment to reach the indexer between rounds, as
a user's next message comes seconds after a reply. Token text is real
prose (a token trace of the Python documentation).

Policies:
  round-robin  request i goes to node i mod N
  kv-events    the indexer's longest matched prefix wins; ties (and no
               match) go to the node with the fewest requests so far

Reported per policy: prompt pages that were local hits, fetched from the
cluster (one network fetch per page per node, counted by the uplinks) or
computed, and the bytes the uplinks moved (fetches, and the write-behind
of computed pages). Ratios compare the two policies of one run.
"""

import argparse
import datetime
import json
import os
import platform
import random
import struct
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "python", "tests"))
sys.path.insert(0, os.path.join(REPO, "bench"))

SHARED_TRACE = os.path.join(os.path.dirname(REPO), "shared", "data", "engram", "pydocs-cl100k.u32")
HEAD_TRACE = os.path.join(REPO, "engram", "testdata", "pydocs-head.u32")


def read_trace(path):
    """Documents of a token trace (uint32 records: n, then n ids), joined."""
    with open(path, "rb") as f:
        raw = f.read()
    out, at = [], 0
    while at + 4 <= len(raw):
        (n,) = struct.unpack_from("<I", raw, at)
        at += 4
        if at + 4 * n > len(raw):
            raise ValueError(f"{path}: a record of {n} tokens runs past the end")
        out.extend(struct.unpack_from(f"<{n}I", raw, at))
        at += 4 * n
    if not out:
        raise ValueError(f"{path}: no tokens")
    return out


class Text:
    """Consecutive slices of the trace, wrapping around."""

    def __init__(self, tokens):
        self.tokens, self.at = tokens, 0

    def take(self, n):
        out = []
        while len(out) < n:
            part = self.tokens[self.at : self.at + n - len(out)]
            out += part
            self.at = (self.at + len(part)) % len(self.tokens)
        return out


def conversations(args, text):
    """[[prompt of each turn]] per conversation, in the bench_multiturn shape."""
    systems = [text.take(args.system_tokens) for _ in range(args.groups)]
    out = []
    for c in range(args.conversations):
        history, turns = list(systems[c % args.groups]), []
        for _ in range(args.turns):
            history += text.take(args.user_tokens)
            turns.append(list(history))
            history += text.take(args.reply_tokens)
        out.append(turns)
    return out


class Server:
    """What an SGLang server's HiCache L3 does with a prompt on one node."""

    def __init__(self, node, args, capacity):
        from cxltier.tokens import TokenRecorder
        from cxltier.tier import Tier

        self.node, self.page = node, args.page
        self.tier = Tier(node.devices, name="bench-server")
        self.index = self.tier.prefix("chat", capacity, args.page_kib * 1024 + 64)
        self.recorder = TokenRecorder(self.tier, "chat", None, capacity, args.page)
        self.payload = bytes(args.page_kib * 1024)

    def serve(self, tokens):
        """(local, fetched, computed) pages of the prompt."""
        import cxltier

        keys = [bytes.fromhex(k) for k in cxltier.page_keys(tokens, self.page)]
        before = self.node.metrics()["fetched_pages"]
        hit = self.index.exists(keys)  # past a local miss, the uplink fills from the cluster
        fetched = int(self.node.metrics()["fetched_pages"] - before)
        if hit < len(keys):
            self.index.set(keys[hit:], [self.payload] * (len(keys) - hit))  # the pages prefill computed
        self.recorder.record(keys, keys, None, tokens)  # what the wraps of SGLang's controller record
        return hit - fetched, fetched, len(keys) - hit

    def close(self):
        self.recorder.close()
        self.tier.close()


def choose(policy, i, tokens, indexer, load):
    if policy == "round-robin":
        return i % len(load)
    matched = indexer.matched(tokens, "chat")
    best = max(matched.values(), default=0)
    candidates = [n for n in range(len(load)) if matched.get(n + 1, 0) == best]
    return min(candidates, key=lambda n: load[n])


def run(policy, capacity, args, convs, env):
    import cluster_harness as ch

    master = ch.Master(env["mooncake"], env["tmp"]).start()
    indexer = ch.Indexer(env["dynamo"], env["tmp"]).start()
    nodes, servers = [], []
    try:
        for n in range(args.nodes):
            node = ch.Node(env["mooncake"], env["cli"], env["lib"], env["tmp"], f"{policy}-{n}", size=args.tier_size)
            nodes.append(node)
            events, replay = f"tcp://127.0.0.1:{ch.free_port()}", f"tcp://127.0.0.1:{ch.free_port()}"
            node.start_uplink(master, args=["--events", events, "--events-replay", replay,
                                            "--events-interval", str(args.events_interval)])
            indexer.register(n + 1, events, replay, "chat", args.page)
            servers.append(Server(node, args, capacity))
        load = [0] * args.nodes
        pages = {"local": 0, "fetched": 0, "computed": 0}
        rng = random.Random(args.seed)
        i = 0
        for turn in range(args.turns):
            order = list(range(len(convs)))
            rng.shuffle(order)
            for c in order:
                tokens = convs[c][turn]
                n = choose(policy, i, tokens, indexer, load)
                load[n] += 1
                local, fetched, computed = servers[n].serve(tokens)
                pages["local"] += local
                pages["fetched"] += fetched
                pages["computed"] += computed
                i += 1
            time.sleep(args.settle)
        uplinks = [node.metrics() for node in nodes]
        total = sum(pages.values())
        row = {"policy": policy, "node_pages": capacity, "requests": i, "prompt_pages": total, "pages": pages,
               "local_hit": pages["local"] / total, "fetched": pages["fetched"] / total,
               "computed": pages["computed"] / total, "requests_per_node": load,
               "fetched_bytes": sum(u["fetched_bytes"] for u in uplinks),
               "put_bytes": sum(u["put_bytes"] for u in uplinks),
               "events_stored": sum(u.get("events_stored", 0) for u in uplinks),
               "events_removed": sum(u.get("events_removed", 0) for u in uplinks)}
        return row
    finally:
        for s in servers:
            s.close()
        for node in nodes:
            node.destroy()
        indexer.kill()
        master.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--conversations", type=int, default=24)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--groups", type=int, default=4, help="system prompts, each shared by a group of conversations")
    ap.add_argument("--system-tokens", type=int, default=1024)
    ap.add_argument("--user-tokens", type=int, default=128)
    ap.add_argument("--reply-tokens", type=int, default=256)
    ap.add_argument("--page", type=int, default=16, help="tokens a page")
    ap.add_argument("--page-kib", type=int, default=16, help="bytes a page stores (its KV), in KiB")
    ap.add_argument("--node-pages", default="1000,4000",
                    help="pages a node tier's index holds (then LRU evicts); a list runs each")
    ap.add_argument("--tier-size", default="96MiB")
    ap.add_argument("--events-interval", type=float, default=0.1)
    ap.add_argument("--settle", type=float, default=0.6, help="seconds between rounds of turns")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--trace", default=SHARED_TRACE if os.path.exists(SHARED_TRACE) else HEAD_TRACE)
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "routing-cpu.json"))
    args = ap.parse_args()

    import cluster_harness as ch
    import pybuild

    mooncake = ch.mooncake_python() or (sys.executable if _has_mooncake() else None)
    dynamo = ch.dynamo_python()
    if mooncake is None or dynamo is None:
        sys.exit("bench/routing: needs $CXLTIER_MOONCAKE_PYTHON (Mooncake + pyzmq) and $CXLTIER_DYNAMO_PYTHON "
                 "(Dynamo's indexer): see python/requirements-mooncake.txt and requirements-dynamo.txt")
    with tempfile.TemporaryDirectory() as tmp:
        lib, cli = pybuild.build(tmp)
        env = {"mooncake": mooncake, "dynamo": dynamo, "lib": lib, "cli": cli, "tmp": tmp}
        convs = conversations(args, Text(read_trace(args.trace)))
        distinct = len({p for turns in convs for t in turns for p in _pages(t, args.page)})
        print(f"{args.conversations} conversations x {args.turns} turns on {args.nodes} nodes: "
              f"{distinct} distinct pages of {args.page} tokens", flush=True)
        rows = []
        for capacity in [int(x) for x in str(args.node_pages).split(",")]:
            for policy in ("round-robin", "kv-events"):
                print(f"  {policy}, {capacity} pages a node", flush=True)
                rows.append(run(policy, capacity, args, convs, env))
    print()
    print(f"{'node pages':>10} {'policy':12} {'requests':>8} {'pages':>7} {'local':>7} {'cluster':>8} "
          f"{'computed':>9} {'fetch MiB':>10} {'write MiB':>10}  requests a node")
    for r in rows:
        print(f"{r['node_pages']:10d} {r['policy']:12} {r['requests']:8d} {r['prompt_pages']:7d} {r['local_hit']:7.1%} "
              f"{r['fetched']:8.1%} {r['computed']:9.1%} {r['fetched_bytes'] / 2**20:10.1f} "
              f"{r['put_bytes'] / 2**20:10.1f}  {r['requests_per_node']}")
    ratios = []
    print()
    for rr, kv in zip(rows[::2], rows[1::2]):
        ratio = {"node_pages": rr["node_pages"],
                 "local_hit": kv["local_hit"] / rr["local_hit"] if rr["local_hit"] else None,
                 "fetched_bytes": kv["fetched_bytes"] / rr["fetched_bytes"] if rr["fetched_bytes"] else None}
        ratios.append(ratio)
        print(f"{rr['node_pages']} pages a node, kv-events / round-robin: local hits x{_x(ratio['local_hit'])}, "
              f"network fetch bytes x{_x(ratio['fetched_bytes'])}")
    result = {"bench": "routing", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version()},
              "args": vars(args) | {"trace": os.path.basename(args.trace)}, "distinct_pages": distinct,
              "rows": rows, "ratios": ratios}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


def _pages(tokens, page):
    import cxltier

    return cxltier.page_keys(tokens, page)


def _x(v):
    return "n/a" if v is None else f"{v:.2f}"


def _has_mooncake():
    try:
        import mooncake.store  # noqa: F401

        return True
    except ImportError:
        return False


if __name__ == "__main__":
    main()
