"""What a cluster fill's parts cost: node B's uplink, its tier on the node's
link (CXLTIER_LINK, so every part is a link turn and every page of the
commit another), fetches pages that node A stored, with --fill-part each of
the sizes asked (0: the fetch in one part). A part is one call of the
transfer engine, and a fill on a node's link gives way to deadlines only
between its calls: the smaller the part, the sooner a deadline transfer
gets the link, and the more calls the fetch pays for. Each round restarts
B's uplink once per size, in turn, and times B's exists() of the pages (it
asks B's uplink, which fetches, checks and publishes them, then answers);
B's copies are deleted after each fetch, so the next one fetches again.

    python bench/cluster/parts.py [--pages 32] [--page-kib 1024]
        [--parts 0,1MiB,2MiB,4MiB,8MiB,16MiB] [--repeat 5] [--out FILE]

It needs a Python with Mooncake (python/requirements-mooncake.txt):

    python -m venv v && v/bin/pip install --no-deps -r python/requirements-mooncake.txt
    v/bin/python bench/cluster/parts.py

On one machine the transfers cross loopback TCP, which shares the cores
with the checks: the ratios say what a call costs over that transport;
on an RDMA pair run it with --protocol rdma and --hostname.
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "python", "tests"))
sys.path.insert(0, os.path.join(REPO, "bench"))


def parse_parts(text):
    from cxltier.cluster.uplink import parse_size

    parts = [parse_size(x.strip()) for x in text.split(",") if x.strip()]
    if not parts or any(p < 0 for p in parts):
        raise SystemExit(f"--parts {text!r}: want sizes of 0 or more, comma-separated")
    return parts



def _part_name(part):
    """A part size as the table names it: 0 is the fetch in one part."""
    return "one part" if part == 0 else f"{part >> 10} KiB"

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=32, help="pages a fetch brings")
    ap.add_argument("--page-kib", type=int, default=1024, help="KiB of a page")
    ap.add_argument("--parts", default="0,1MiB,2MiB,4MiB,8MiB,16MiB", help="the --fill-part sizes to compare")
    ap.add_argument("--repeat", type=int, default=5, help="rounds (each fetches once at every size)")
    ap.add_argument("--protocol", default="tcp", choices=["tcp", "rdma"])
    ap.add_argument("--hostname", default="127.0.0.1")
    ap.add_argument("--out", default=os.path.join(REPO, "bench", "results", "local", "cluster-parts.json"))
    args = ap.parse_args()
    if args.pages < 1 or args.page_kib < 1 or args.repeat < 1:
        raise SystemExit("--pages, --page-kib and --repeat must be positive")
    parts = parse_parts(args.parts)

    import cluster_harness as ch
    import cxltier
    from pybuild import build, cpu_model

    tmp = tempfile.mkdtemp(prefix="cxltier-parts-bench-")
    lib, cli = build(tmp)
    os.environ["CXLTIER_LIB"] = lib
    page = args.page_kib << 10
    block = page + (64 << 10)  # the page and its trailer, in one piece
    total = args.pages * page
    tier_size = f"{(2 * args.pages * block + (128 << 20)) >> 20}MiB"
    print(f"parts bench: {args.pages} pages of {args.page_kib} KiB a fetch ({total / 2**20:.0f} MiB), "
          f"{platform.machine()} with {os.cpu_count()} CPUs, {args.protocol} over loopback", flush=True)
    master = ch.Master(sys.executable, tmp).start()
    a = ch.Node(sys.executable, cli, lib, tmp, "a", size=tier_size)
    b = ch.Node(sys.executable, cli, lib, tmp, "b", size=tier_size)
    times = {p: [] for p in parts}
    try:
        a.start_uplink(master, segment=f"{(2 * total + (64 << 20)) >> 20}MiB")
        ta, tb = cxltier.Tier(a.devices), cxltier.Tier(b.devices)
        ia = ta.prefix("parts", blocks=args.pages, block_bytes=block)
        ib = tb.prefix("parts", blocks=args.pages, block_bytes=block)
        keys = [cxltier.string_key(f"parts-{i}") for i in range(args.pages)]
        payloads = [os.urandom(page) for _ in keys]
        assert ia.set(keys, payloads) == ["stored"] * args.pages
        ch.wait_for(lambda: a.metrics().get("put_pages", 0) >= args.pages, 60, "node A's pages in the cluster")
        for rnd in range(args.repeat):
            for p in parts:
                b.start_uplink(master, segment="0", env={"CXLTIER_LINK": "1"}, args=["--fill-part", str(p)])
                try:
                    t0 = time.perf_counter()
                    got = ib.exists(keys)
                    took = time.perf_counter() - t0
                    if got != args.pages:
                        raise SystemExit(f"part {p}: {got} of {args.pages} pages fetched: {b.tail(20)}")
                    times[p].append(took)
                    ib.delete(keys)
                finally:
                    b.stop_uplink()
            print(f"round {rnd + 1}: " + ", ".join(f"{_part_name(p)} {times[p][-1] * 1e3:.1f} ms" for p in parts),
                  flush=True)
        ta.close()
        tb.close()
    finally:
        a.destroy()
        b.destroy()
        master.kill()
    one = statistics.median(times[parts[0]])
    rows = []
    print(f"\n{'part':>10} {'fetch ms (median)':>18} {'GB/s':>6} {'of the first size':>18}")
    for p in parts:
        med = statistics.median(times[p])
        rows.append({"part_bytes": p, "fetch_ms": [t * 1e3 for t in times[p]], "median_ms": med * 1e3,
                     "gb_per_s": total / med / 1e9, "of_first": one / med})
        print(f"{_part_name(p):>10} {med * 1e3:18.1f} {total / med / 1e9:6.2f} "
              f"{one / med:17.2f}x")
    result = {"date": datetime.date.today().isoformat(), "bench": "cluster-parts",
              "machine": {"arch": platform.machine(), "cpus": os.cpu_count(), "cpu": cpu_model()},
              "protocol": args.protocol, "pages": args.pages, "page_bytes": page, "link": True, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
