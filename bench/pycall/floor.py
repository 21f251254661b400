"""The fixed cost of a library call from Python: CPU per call of the
export with no arguments (ctypes and Go's entry alone), a minimal guarded
call (a handle looked up, its client's gate passed, an error code back) as
the package's generic path makes it and through a prebuilt call, and
PrefixIndex.exists of one key. Rounds interleaved, medians reported with
the ratio to the no-argument export measured in the same run.

    python bench/pycall/floor.py --calls 200000 --out bench/results/pycall-floor.json
"""

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, ".."))

from pybuild import build  # noqa: E402

_tmp = tempfile.mkdtemp()
_lib, CLI = build(_tmp)

import cxltier  # noqa: E402
from cxltier import _native  # noqa: E402


def per_call(fn, calls):
    """CPU seconds per call of fn over calls calls, the loop included (run
    subtracts the empty call's)."""
    t0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t0) / calls


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=200000)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--out", default="")
    args = p.parse_args()

    name = f"pycall-{os.getpid()}"
    cli = CLI
    subprocess.run([cli, "format", "-device", f"shm:{name}", "-size", "64MiB"], check=True, capture_output=True)
    try:
        with cxltier.Tier(f"shm:{name}") as tier:
            ix = tier.prefix("floor", 64, 4096)
            ix.set([bytes(32)], [b"x" * 64])
            rows = run(tier, ix, args)
            ix.close()
    finally:
        subprocess.run([cli, "destroy", f"shm:{name}"], check=True, capture_output=True)
    report(rows, args)


def run(tier, ix, args):
    lib = _native.lib()
    h = ix.handle
    key = bytes(32)
    arr = (ctypes.c_uint8 * 32).from_buffer_copy(key)
    out = ctypes.c_int64()
    nothing = lambda: None  # noqa: E731
    cases = {
        "empty Python call (the loop)": nothing,
        "export with no arguments (cxl_abi_version)": lib.cxl_abi_version,
        "guarded call, generic path (_native.call)": lambda: _native.call("cxl_prefix_verify_reads", h, 1),
        "guarded call, prebuilt (_native.prebuilt)": _native.prebuilt("cxl_prefix_verify_reads", h, 1),
        "exists of one key, generic path": lambda: _native.call("cxl_prefix_exists", h, arr, 1, ctypes.byref(out)),
        "exists of one key, prebuilt": _native.prebuilt("cxl_prefix_exists", h, arr, 1, ctypes.byref(out)),
        "PrefixIndex.exists([key])": lambda: ix.exists([key]),
    }
    samples = {k: [] for k in cases}
    for _ in range(args.rounds):
        for k, fn in cases.items():
            samples[k].append(per_call(fn, args.calls))
    base = statistics.median(samples["empty Python call (the loop)"])
    noargs = statistics.median(samples["export with no arguments (cxl_abi_version)"]) - base
    rows = []
    for k, s in samples.items():
        med = statistics.median(s) - (0 if k.startswith("empty") else base)
        rows.append({"case": k, "cpu_us": med * 1e6, "over_no_arg_export": (med / noargs) if noargs > 0 else None})
    return rows


def report(rows, args):
    print(f"{'case':<48} {'CPU µs/call':>12} {'÷ no-arg export':>16}")
    for r in rows:
        ratio = "" if r["over_no_arg_export"] is None else f"{r['over_no_arg_export']:.2f}×"
        print(f"{r['case']:<48} {r['cpu_us']:>12.3f} {ratio:>16}")
    if args.out:
        doc = {"bench": "pycall-floor", "date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
               "cpus": os.cpu_count(), "python": platform.python_version(), "calls": args.calls,
               "rounds": args.rounds, "note": "CPU time per call, median of interleaved rounds, the empty loop subtracted",
               "rows": rows}
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
