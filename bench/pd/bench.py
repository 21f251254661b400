"""Prefill to decode: one request's KV from a prefill process to a decode
process, through the tier (cxltier's transfer backend) against SGLang's own
mooncake backend over loopback TCP (SGLang's mooncake_tcp), in one run.

    python bench/pd/bench.py [--layouts mha,mla] [--tokens 1536,3072,6144]
                             [--tp 1,2,2:1] [--repeat 3] [--tier-size 8GiB] [--tier-dir DIR] [--out FILE] [--no-fork] [--no-pause]

Each backend runs as a prefill and a decode of TP ranks each, one OS
process per rank (bench/pd/worker.py), forked by a server that imported
torch and SGLang once (--no-fork: each started anew, importing them
itself, about 17 s of CPU a process): SGLang 0.5.23's
KV pool on CPU with a model's geometry, its MetadataBuffers, its KVArgs as
PrefillBootstrapQueue fills them, the backend's manager, sender and
receiver made by SGLang's queues' own methods, driven in their order. The
mooncake side also runs SGLang's bootstrap server (HTTP), its process
groups (gloo, one group per side across its ranks) and Mooncake's transfer
engine with MC_FORCE_TCP=1. At TP 2 an MHA rank holds half the KV heads
and an MLA rank the whole latent, as in serving. "P:D" runs a prefill of
TP P and a decode of TP D, one dividing the other: an MHA decode rank
holds a share of its prefill rank's heads, or the heads of several prefill
ranks together.

  first       a prompt neither side has seen: the prefill's pages go to the
              decode (through the tier: written to it, then read from it)
  repeat      a second request with the same prompt: mooncake moves the
              pages again; the tier finds them stored and writes nothing

"ms" runs from the transfer's start to the decode's poll() saying Success
(both processes read the machine's one monotonic clock). The transfer
starts at the prefill's first send(), or earlier where the tier's decode
began landing pages already stored before it (a repeated prefix: in
serving, that load overlaps the prefill's forward pass; here it is
counted). "cpu ms" is the CPU time of both processes over the same span,
every thread counted (the decode's from its CPU clock sampled before each
poll, so its polling before the transfer starts is not counted).
The decode's pages are compared with the prefill's, page by page, in
every run. Both backends' workers run at once and each round sends its
request to one, then the other: "speedup" is mooncake's median over the
tier's, "lowest round" the least of the rounds' own ratios (two runs
moments apart, so a shared machine's drift moves both alike). While one
backend's request runs, the other's workers are stopped (SIGSTOP, then
SIGCONT): a host serves with one backend, and idle workers still poll
(140-170 CPU ms of a 2-core machine during each request; --no-pause keeps
them running). The tier's rows also say when the last page was stored
("stored_ms", before the acks): the decode lands pages as they are
published, so the request ends a few milliseconds after it.
Layouts (sizes as flags):

  mha   Llama-3-8B: 32 layers, 8 KV heads of 128, bf16, 16-token pages
  mla   DeepSeek-V3: 61 layers, 512 + 64 latent, bf16, 64-token pages

It needs the SGLang virtualenv of .ci/run (with prometheus-client, which
SGLang's mooncake backend imports), Mooncake's transfer engine (from
$CXLTIER_MOONCAKE_PYTHON's environment, or importable), libcxltier and the
cxltier CLI (CXLTIER_LIB / CXLTIER_CLI, or Go to build them).
"""

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.join(REPO, "python", "tests_sglang"))

import forkserver  # noqa: E402
from pybuild import build  # noqa: E402

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
LAYOUTS = {
    "mha": {"kind": "mha", "layers": 32, "heads": 8, "head_dim": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
            "page_size": 16, "bytes_per_token": 32 * 2 * 8 * 128 * 2},
    "mla": {"kind": "mla", "layers": 61, "heads": 1, "head_dim": 1, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
            "page_size": 64, "bytes_per_token": 61 * 576 * 2},
}


def parse_size(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if text.endswith(u):
            return int(text[: -len(u)]) * m
    return int(text)


def parse_tp(text):
    """(prefill TP, decode TP) of "N" or "P:D"; one must divide the other."""
    try:
        p, _, d = text.partition(":")
        tp = (int(p), int(d or p))
    except ValueError:
        raise SystemExit(f"--tp {text!r}: want N or P:D (tensor-parallel sizes)") from None
    if min(tp) < 1 or max(tp) % min(tp):
        raise SystemExit(f"--tp {text!r}: sizes of at least 1, one dividing the other")
    return tp


def mount_of(path):
    """The filesystem holding path, as /proc/mounts says it (type and
    options: a tmpfs's huge= decides the tier's page size)."""
    path, best = os.path.realpath(path), None
    with open("/proc/mounts") as f:
        for line in f:
            dev, at, kind, opts = line.split()[:4]
            at = at.replace("\\040", " ")
            if (path == at or path.startswith(at.rstrip("/") + "/")) and (best is None or len(at) > len(best["at"])):
                best = {"at": at, "type": kind, "options": opts}
    return best


def free_ports(n, rng=random.SystemRandom()):
    """The first of n consecutive loopback ports free now, outside the
    kernel's ephemeral range: the workers bind them seconds later (SGLang's
    bootstrap server, the two sides' gloo stores), and a port in that range
    may be taken meanwhile by any connection's local end (the machine's
    other workers open many). Outside it only a deliberate bind takes one."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split()[:2])
    except (OSError, ValueError):
        low, high = 32768, 60999
    spans = [(a, b - n) for a, b in ((10_000, low), (high + 1, 65_536)) if b - n > a]
    if not spans:
        raise RuntimeError(f"the ephemeral port range {low}-{high} leaves no room for the bench's {n} ports")
    for _ in range(200):
        base = rng.randrange(*rng.choice(spans))
        try:
            for k in range(n):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", base + k))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free loopback ports outside the ephemeral range {low}-{high}")


def cpu_model():
    """The first CPU's model name and the vector features a copy can use,
    from /proc/cpuinfo (None where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read().split("\n\n")[0]
    except OSError:
        return None
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in first.splitlines() if ":" in line)}
    features = set(fields.get("flags", "").split()) & {"avx2", "avx512f", "avx512_bf16", "amx_tile", "erms", "fsrm"}
    return {"model": fields.get("model name"), "features": sorted(features)}


def mooncake_path():
    """The directory holding Mooncake's package, for the workers' PYTHONPATH."""
    py = os.environ.get("CXLTIER_MOONCAKE_PYTHON")
    if not py:
        return None
    out = subprocess.check_output([py, "-c", "import mooncake, os; print(os.path.dirname(os.path.dirname(mooncake.__file__)))"],
                                  text=True)
    return out.strip()


class Forks:
    """The workers' fork server (worker.py serve): torch's and SGLang's
    imports once, then a forked worker per start(), its stdin, stdout and
    stderr handed over on a Unix socket."""

    def __init__(self, env):
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.folder, self.n = tempfile.mkdtemp(prefix="cxltier-pd-bench-workers-"), 0
        self.proc = subprocess.Popen([sys.executable, "-W", "ignore", WORKER, "serve", str(theirs.fileno())], env=env,
                                     pass_fds=[theirs.fileno()])
        theirs.close()
        self.sock.settimeout(600)
        said = self.sock.recv(1 << 16)
        if not said.startswith(b'{"ready"'):
            raise RuntimeError(f"the workers' fork server did not start (exit {self.proc.wait()})")

    def start(self, role, cfg, env):
        self.n += 1
        rc = os.path.join(self.folder, f"{self.n}.rc")
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        err = tempfile.TemporaryFile()
        req = {"role": role, "cfg": cfg, "env": env, "rc": rc}
        socket.send_fds(self.sock, [json.dumps(req).encode()], [in_r, out_w, err.fileno()])
        os.close(in_r)
        os.close(out_w)
        pid = json.loads(self.sock.recv(1 << 16))["pid"]
        return Forked(pid, rc, os.fdopen(in_w, "w"), os.fdopen(out_r, "r"), err)

    def close(self):
        self.sock.close()
        self.proc.wait(timeout=60)


class Forked(forkserver.Forked):
    """A forked worker, used as a subprocess.Popen with pipes is: stdin,
    stdout, stderr.read(), wait, kill."""

    def __init__(self, pid, rc, stdin, stdout, err):
        super().__init__(pid, rc, f"worker {pid}")
        self.stdin, self.stdout, self.stderr = stdin, stdout, _Spooled(err)


class _Spooled:
    """A worker's stderr, spooled to a file: read() is all of it so far."""

    def __init__(self, f):
        self.f = f

    def read(self):
        self.f.seek(0)
        return self.f.read().decode(errors="replace")


def start_worker(forks, role, cfg, env):
    """A worker process: forked by forks, or (None) started anew."""
    if forks is not None:
        return forks.start(role, cfg, env)
    return subprocess.Popen([sys.executable, "-W", "ignore", WORKER, role, json.dumps(cfg)], env=env, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


class Pair:
    """The prefill and decode workers of one backend, one process per TP
    rank on each side, fed requests on stdin."""

    def __init__(self, backend, cfg, env, tp, forks=None):
        port = free_ports(3)  # the bootstrap server's, then the prefill's and the decode's gloo stores (worker.py)
        env = dict(env, PD_BENCH_BOOTSTRAP_PORT=str(port))
        self.tp = {"prefill": tp[0], "decode": tp[1]}
        self.procs = {}
        self.barrier = tempfile.mkdtemp(prefix="cxltier-pd-bench-bootstrap-")  # the prefill ranks' (worker.py)
        for role in ("prefill", "decode"):
            for rank in range(self.tp[role]):
                shares = tp[1] // tp[0] if cfg["kind"] == "mha" and tp[1] > tp[0] else 1
                wcfg = dict(cfg, backend=backend, tp_rank=rank, tp_size=self.tp[role], shares=shares, barrier=self.barrier)
                self.procs[role, rank] = start_worker(forks, role, wcfg, env)
        for key in self.procs:
            self.read(key, 600)

    def read(self, key, limit=300):
        p = self.procs[key]
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"{key[0]} rank {key[1]} worker ended (exit {p.wait()}): {p.stderr.read()[-3000:]}")
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError(f"{key[0]} rank {key[1]} worker: no answer in {limit} s")

    def send(self, role, line):
        for rank in range(self.tp[role]):
            self.procs[role, rank].stdin.write(line)
            self.procs[role, rank].stdin.flush()

    def run(self, request):
        """One request on every rank: the prefill makes its KV first (as its
        forward pass would), then the decode is given the request and says
        hello. Returns the prefill's and the decode's results, a list of one
        per rank each."""
        line = json.dumps(request) + "\n"
        self.send("prefill", line)
        filled = [self.read(("prefill", rank)) for rank in range(self.tp["prefill"])]
        if not all("filled" in f for f in filled):
            return filled, [{"state": "not started"}]
        self.send("decode", line)
        return ([self.read(("prefill", rank)) for rank in range(self.tp["prefill"])],
                [self.read(("decode", rank)) for rank in range(self.tp["decode"])])

    def logs(self, tail=1500):
        """The end of every worker's stderr, for a failure's report (SGLang
        logs why a bootstrap or a transfer failed there, not in its state)."""
        def end(p):  # a started worker's pipe reads to its end: only once it has ended
            if isinstance(p, subprocess.Popen) and p.poll() is None:
                return "(still running; --no-fork workers' logs are read when they end)"
            return p.stderr.read()[-tail:]
        return "\n".join(f"--- {role} rank {rank}'s stderr (its end):\n{end(p)}" for (role, rank), p in self.procs.items())

    def pause(self, stop=True):
        """Stops (or resumes) every worker of the pair while another
        backend's request runs: on a real host only one backend's servers
        run, and idle workers still poll (a pair left running took 140-170
        CPU ms of a 2-core machine during each of the other's requests)."""
        for p in self.procs.values():
            p.send_signal(signal.SIGSTOP if stop else signal.SIGCONT)

    def close(self):
        for p in self.procs.values():
            try:
                p.stdin.write("\n")
                p.stdin.close()
                p.wait(timeout=30)
            except Exception:
                p.kill()
        shutil.rmtree(self.barrier, ignore_errors=True)


def tp_name(tp):
    """"2" for a prefill and a decode of TP 2, "2:1" for a TP 2 prefill and a TP 1 decode."""
    return str(tp[0]) if tp[0] == tp[1] else f"{tp[0]}:{tp[1]}"


def measure(backends, name, cfg, sizes, repeat, env, tp, forks, pause=True):
    """Every backend's pair at once, a request to each in turn, round by
    round: each round's ratio compares runs a few hundred milliseconds
    apart, so a machine whose speed drifts over minutes (a shared host)
    moves both alike."""
    pairs = {}
    try:
        for backend in backends:
            print(f"  starting {backend}'s {sum(tp)} workers ({name}, TP {tp_name(tp)}"
                  + ("" if forks else ": SGLang's imports take a while") + ")...", flush=True)
            pairs[backend] = Pair(backend, cfg, env, tp, forks)
        return measure_pairs(pairs, name, cfg, sizes, repeat, tp, pause)
    finally:
        for pair in pairs.values():
            pair.close()


def measure_pairs(pairs, name, cfg, sizes, repeat, tp, pause=True):
    name_tp = tp_name(tp)
    rows = []
    room = 1
    for tokens in sizes:
        for case in ("first", "repeat"):
            took = {b: [] for b in pairs}
            cpu = {b: [] for b in pairs}
            written = {b: [] for b in pairs}
            stored = {b: [] for b in pairs}
            for r in range(repeat):
                # A prompt of its own for each size, round and TP (an MLA page is
                # one for every TP: the same prompt at TP 2 would not be a first).
                base = 10_000_000 * (r + 1) + 1_000_000 * (tp[0] + 8 * tp[1])
                prompt = list(range(base + tokens, base + 2 * tokens))
                for backend, pair in pairs.items():
                    room += 1
                    slot = 1 + (room % 2) * (cfg["pool_tokens"] // (2 * cfg["page_size"]))
                    # The KV of a prompt is a function of its tokens (as a model's is): the seed is the prompt's.
                    others = [q for b, q in pairs.items() if b != backend and pause]
                    for q in others:
                        q.pause()
                    try:
                        prs, drs = pair.run({"tokens": prompt, "room": room, "first_slot_page": slot, "seed": prompt[0]})
                    finally:
                        for q in others:
                            q.pause(False)
                    try:
                        check(backend, name, tokens, name_tp, cfg["kind"], tp, prs, drs)
                    except RuntimeError as e:
                        raise RuntimeError(f"{e}\n{pair.logs()}") from None
                    # The transfer starts at the first rank's send, or earlier where
                    # a decode rank began landing pages already stored (a repeated
                    # prefix), and ends when the last decode rank has its pages.
                    began = min([p["t_send"] for p in prs] + [d["t_started"] for d in drs if d.get("t_started")])
                    took[backend].append((max(d["t_done"] for d in drs) - began) * 1e3)
                    cpu[backend].append((sum(p["cpu_s"] for p in prs) + sum(decode_cpu_since(d, began) for d in drs)) * 1e3)
                    written[backend].append(sum(p.get("written") or 0 for p in prs) if backend == "cxltier" else None)
                    if all("t_stored" in p for p in prs):  # the last page stored, before the acks
                        stored[backend].append((max(p["t_stored"] for p in prs) - began) * 1e3)
            for backend in pairs:
                rows.append({"backend": backend, "layout": name, "tp": name_tp, "tokens": tokens, "case": case,
                             "kv_bytes": tokens * cfg["bytes_per_token"], "ms": statistics.median(took[backend]),
                             "ms_all": took[backend], "cpu_ms": statistics.median(cpu[backend]), "cpu_ms_all": cpu[backend],
                             "pages_written": written[backend][-1],
                             "stored_ms": statistics.median(stored[backend]) if stored[backend] else None})
                print(f"  {backend:9} {name} TP {name_tp:>3} {tokens:6} {case:7} {rows[-1]['ms']:9.1f} ms "
                      f"{rows[-1]['cpu_ms']:9.1f} cpu ms" + (f"  pages written {written[backend][-1]}" if backend == "cxltier" else "")
                      + (f", the last stored at {rows[-1]['stored_ms']:.1f} ms" if rows[-1]["stored_ms"] is not None else ""),
                      flush=True)
    return rows


def check(backend, name, tokens, name_tp, kind, tp, prs, drs):
    """Every rank succeeded and every decode rank holds the bytes it must."""
    if any(x.get("state") != "success" for x in prs + drs):
        said = [{k: v for k, v in x.items() if k in ("state", "reason", "room")} for x in prs + drs]
        raise RuntimeError(f"{backend} {name} {tokens} TP {name_tp}: prefill ranks then decode ranks: {said}")
    sources = expected_sums(kind, tp, prs, len(drs))
    if any(want != d["sum"] or d["first_token"] != 4242 for want, d in zip(sources, drs)):
        raise RuntimeError(f"{backend} {name} {tokens} TP {name_tp}: the decode's pages are not the prefill's")


def expected_sums(kind, tp, prs, decode_ranks):
    """What each decode rank's pages must sum to: an MLA rank's, the latent
    every prefill rank holds; an MHA rank's, its share of the heads of
    prefill rank j // k (a decode of k times the prefill's TP size; all of
    them at one size), or of a decode k times smaller the heads of prefill
    ranks j*k .. j*k+k-1 together (a byte sum adds up over heads: the
    bench's 8 heads are never replicated)."""
    if kind != "mha":
        return [prs[0]["sum"]] * decode_ranks
    if tp[1] >= tp[0]:
        k = tp[1] // tp[0]
        return [prs[j // k]["shares"][j % k] for j in range(decode_ranks)]
    k = tp[0] // tp[1]
    out = []
    for j in range(decode_ranks):
        parts = [prs[j * k + q]["sum"] for q in range(k)]
        out.append([[sum(x) for x in zip(*pages)] for pages in zip(*parts)])
    return out


def decode_cpu_since(dr, began):
    """The decode's CPU seconds from began (the transfer's start) to its
    Success: its clock samples (taken before each poll) give the CPU it had
    used by then; time it spent polling before is not counted."""
    at = [c for t, c in dr["clock"] if t <= began]
    start = at[-1] if at else dr["clock"][0][1]
    return dr["cpu_end"] - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layouts", default="mha,mla")
    ap.add_argument("--tokens", default="1536,3072,6144")
    ap.add_argument("--layers", type=int, default=0, help="override the layouts' layer counts (small runs)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tp", default="1", help="tensor-parallel sizes: N both sides, P:D a prefill of P and a decode of D "
                    "(one dividing the other), e.g. 1,2,1:2,2:1")
    ap.add_argument("--tier-size", default="8GiB")
    ap.add_argument("--tier-dir", default="", help="make each tier a file in this directory instead of /dev/shm (e.g. a "
                    "tmpfs mounted huge=always: a tier on huge pages; /dev/shm's are 4 KiB unless mounted so)")
    ap.add_argument("--backends", default="mooncake,cxltier", help="mooncake alone is the baseline of every ratio")
    ap.add_argument("--out", default="")
    ap.add_argument("--no-pause", action="store_true", help="leave the other backends' workers running (idle, polling) "
                    "while one backend's request runs; by default they are stopped (SIGSTOP) for it")
    ap.add_argument("--no-fork", action="store_true", help="start each worker anew instead of forking it from a server "
                    "that imported SGLang once (slower to start; the same once running)")
    args = ap.parse_args()
    sizes = [int(x) for x in args.tokens.split(",")]
    tps = [parse_tp(x) for x in args.tp.split(",")]
    lib, cli = build(tempfile.mkdtemp(prefix="cxltier-pd-bench-"))
    mpath = mooncake_path()
    env = dict(os.environ, CXLTIER_LIB=lib, PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), mpath])))
    rows = []
    forks = None
    if not args.no_fork:
        print("starting the workers' fork server (it imports torch and SGLang once)...", flush=True)
        forks = Forks(env)
    try:
        rows = run_all(args, cli, env, sizes, tps, forks)
    finally:
        if forks is not None:
            forks.close()
    table(rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       "machine": {"cpus": os.cpu_count(), "cpu": cpu_model(), "platform": platform.platform(),
                                   "python": platform.python_version()},
                       "tier_fs": mount_of(args.tier_dir or "/dev/shm"), "args": vars(args), "rows": rows,
                       "ratios": ratios(rows)}, f, indent=1)
        print(f"wrote {args.out}")


def run_all(args, cli, env, sizes, tps, forks):
    rows = []
    for name in args.layouts.split(","):
        cfg = dict(LAYOUTS[name])
        if args.layers:
            cfg["bytes_per_token"] = cfg["bytes_per_token"] // cfg["layers"] * args.layers
            cfg["layers"] = args.layers
        pages = -(-max(sizes) // cfg["page_size"])
        cfg["pool_tokens"] = 2 * (pages + 1) * cfg["page_size"]
        for tp in tps:
            rows += measure_tp(args, cli, env, name, cfg, sizes, tp, forks)
    return rows


def measure_tp(args, cli, env, name, cfg, sizes, tp, forks):
    """Both backends at one TP pair, over a tier of its own whose index has
    blocks of a prefill rank's page (an MHA rank's holds 1/TP of the heads;
    an index made for the whole page would leave most of each block empty)."""
    file = f"cxltier-pd-bench-{uuid.uuid4().hex[:10]}"
    tier = f"file:{os.path.join(args.tier_dir, file)}" if args.tier_dir else f"shm:{file}"
    subprocess.check_call([cli, "format", "-device", tier, "-size", args.tier_size, "-chunk", "1MiB"],
                          stdout=subprocess.DEVNULL)
    page_bytes = cfg["page_size"] * cfg["bytes_per_token"] // (tp[0] if cfg["kind"] == "mha" else 1)
    blocks = parse_size(args.tier_size) * 3 // 4 // (page_bytes + 64)
    tenv = dict(env, CXLTIER_DEVICES=tier, CXLTIER_PD_INDEX=f"pd-bench-{name}", CXLTIER_PD_BLOCKS=str(blocks))
    try:
        rows = measure(args.backends.split(","), name, cfg, sizes, args.repeat, tenv, tp, forks, not args.no_pause)
    finally:
        gone = subprocess.run([cli, "destroy", "-force", tier], capture_output=True, text=True)
        if gone.returncode:  # a tier left behind holds its size in RAM: say so
            print(f"bench/pd: could not remove {tier}: {gone.stderr.strip()}", file=sys.stderr)
    return rows


def ratios(rows):
    out = []
    by = {(r["backend"], r["layout"], r["tp"], r["tokens"], r["case"]): r for r in rows}
    for (b, layout, tp, tokens, case), r in sorted(by.items()):
        if b != "cxltier" or ("mooncake", layout, tp, tokens, case) not in by:
            continue
        m = by[("mooncake", layout, tp, tokens, case)]
        rounds = [a / b for a, b in zip(m["ms_all"], r["ms_all"])]  # each round's, the two runs side by side
        out.append({"layout": layout, "tp": tp, "tokens": tokens, "case": case, "mooncake_ms": m["ms"], "tier_ms": r["ms"],
                    "kv_bytes": r["kv_bytes"], "speedup": m["ms"] / r["ms"], "speedup_rounds": rounds,
                    "speedup_low": min(rounds), "cpu_ratio": r["cpu_ms"] / m["cpu_ms"], "pages_written": r["pages_written"]})
    return out


def table(rows):
    print(f"\n{'layout':6} {'TP':>3} {'tokens':>6} {'case':7} {'KV MiB':>7} {'mooncake ms':>11} {'tier ms':>8} {'speedup':>7} "
          f"{'lowest round':>12} {'cpu (tier/mc)':>13} {'tier pages written':>18}")
    for q in ratios(rows):
        print(f"{q['layout']:6} {q['tp']:>3} {q['tokens']:6} {q['case']:7} {q['kv_bytes'] / 2**20:7.0f} {q['mooncake_ms']:11.1f} "
              f"{q['tier_ms']:8.1f} {q['speedup']:6.2f}x {q['speedup_low']:11.2f}x {q['cpu_ratio']:12.2f}x "
              f"{q['pages_written']!s:>18}")


if __name__ == "__main__":
    main()
