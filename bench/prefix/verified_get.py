"""A verified PrefixIndex.get against an unverified one from Python, by
where the destination buffers start past a 4 KiB page (numpy, torch and
malloc buffers usually start 16 bytes past one), on a shm tier whose
blocks start at a page.

    python bench/prefix/verified_get.py [--sizes 2MiB,64KiB] [--batch-bytes 128MiB]
                                        [--offsets 0,16,64,2048] [--rounds 6] [--out FILE]

CPU time of this process (every thread), verified and unverified
alternating round by round into the same buffers; the table gives medians
and their ratio. It needs libcxltier and the cxltier CLI (CXLTIER_LIB /
CXLTIER_CLI, or Go to build them).
"""

import argparse
import ctypes
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "bench"))

from pybuild import build  # noqa: E402


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def page_buffers(n, size, off, keep):
    """n (address, size) destinations, each off bytes past a page."""
    out = []
    for _ in range(n):
        raw = (ctypes.c_char * (size + 8192))()
        keep.append(raw)
        addr = ctypes.addressof(raw)
        out.append((addr + (4096 - addr % 4096) % 4096 + off, size))
    return out


def measure(ix, keys, bufs, rounds):
    times = {True: [], False: []}
    for _ in range(rounds):
        for verify in (True, False):
            ix.verify_reads(verify)
            started = cpu_seconds()
            served, _ = ix.get(keys, bufs)
            times[verify].append(cpu_seconds() - started)
            if served != len(keys):
                raise RuntimeError(f"served {served} of {len(keys)}")
    ix.verify_reads(True)
    return statistics.median(times[True]), statistics.median(times[False])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="2MiB,64KiB")
    p.add_argument("--batch-bytes", default="128MiB", help="bytes per get: the batch is this over the page size")
    p.add_argument("--offsets", default="0,16,64,2048")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--out")
    args = p.parse_args()
    lib, cli = build(tempfile.mkdtemp(prefix="cxltier-bench-get-"))
    import cxltier
    from cxltier.sizes import parse_size

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    batch_bytes = parse_size(args.batch_bytes)
    offsets = [int(o) for o in args.offsets.split(",")]
    dev = f"shm:cxltier-bench-get-{uuid.uuid4().hex[:8]}"
    subprocess.check_call([cli, "format", "-device", dev, "-size", str(3 * batch_bytes * len(sizes) + (64 << 20))],
                          stdout=subprocess.DEVNULL)
    rows = []
    try:
        with cxltier.Tier(dev) as t:
            for size in sizes:
                n = max(1, batch_bytes // size)
                ix = t.prefix(f"get-{size}", 2 * n, size)  # blocks of exactly a page start at a page; room to spare in every shard
                keys = [cxltier.string_key(f"{size}/{i}") for i in range(n)]
                ix.set(keys, [os.urandom(size) for _ in range(n)])
                for off in offsets:
                    keep = []
                    verified, plain = measure(ix, keys, page_buffers(n, size, off, keep), args.rounds)
                    rows.append({"page_bytes": size, "pages": n, "dst_offset": off, "verified_cpu_ms": verified * 1e3,
                                 "unverified_cpu_ms": plain * 1e3, "ratio": verified / plain})
                    print(f"{size >> 10:6d} KiB × {n:4d}  dst +{off:<5d} verified {verified * 1e3:7.1f} ms  "
                          f"unverified {plain * 1e3:7.1f} ms  {verified / plain:.2f}x", flush=True)
                ix.close()
    finally:
        subprocess.run([cli, "destroy", "-force", dev], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "args": vars(args),
                       "rows": rows}, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
