"""One side of a prefill-to-decode transfer for bench/pd/bench.py, as an
OS process of its own: SGLang's KV pool (MHA or MLA) on CPU, its
MetadataBuffers and its transfer backend (cxltier, or SGLang's mooncake
over TCP), the sender made by PrefillBootstrapQueue.create_sender and the
receiver by DecodePreallocQueue._create_receiver_and_enqueue, driven in
the order SGLang's queues drive them (as python/tests_sglang/pd_worker.py
does, which says why the queues themselves are not built).

    python worker.py ROLE JSON
    python worker.py serve FD

Prints JSON lines: {"ready": ...} once the manager is up, then one result
per request: monotonic times (the machine's one clock, shared by both
processes), the process's CPU seconds over the request, bytes moved.
Requests come on stdin, one JSON line each; an empty line ends.

serve is a fork server: it imports torch and SGLang once (about 17 s of
CPU a process, most of a small run's time: a run starts a worker per TP
rank, side, backend and layout), then forks a worker for each request on
the Unix socket FD: a JSON message {"role", "cfg", "env", "rc"} with the
worker's stdin, stdout and stderr attached (SCM_RIGHTS); it answers
{"pid": ...} and writes the worker's exit status to the file rc. Nothing
that starts a thread runs before the fork (the transfer backends start
theirs in the worker), so each worker is a process of its own as a
started one is.
"""

import array
import json
import os
import resource
import socket
import sys
import time
from unittest import mock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "python", "tests_sglang"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import forkserver  # noqa: E402
from linker_stack import kv_pool, layer_buffers  # noqa: E402

BOOTSTRAP_PORT = int(os.environ.get("PD_BENCH_BOOTSTRAP_PORT", "18998"))


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def server_args(cfg, role):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path="dummy", device="cpu", page_size=cfg["page_size"], disaggregation_mode=role,
                      disaggregation_transfer_backend=cfg["backend"], disaggregation_bootstrap_port=BOOTSTRAP_PORT,
                      host="127.0.0.1", tp_size=cfg.get("tp_size", 1))


def kv_args(backend, pool, meta, layers, rank, total_heads):
    """KVArgs as PrefillBootstrapQueue._init_kv_manager fills them, with
    SGLang's own helpers (no draft model, no PP, no Rust server): rank is
    the process's TP rank, total_heads the model's KV heads (each rank's
    pool holds its share)."""
    from sglang.srt.disaggregation.utils import (KVClassType, TransferBackend, build_kv_layer_ids, get_kv_class,
                                                 get_kv_transfer_buf_infos, get_pd_kv_layout, setup_state_kv_args)

    args = get_kv_class(TransferBackend(backend), KVClassType.KVARGS)()
    args.engine_rank, args.pp_rank, args.system_dp_rank, args.rust_http_port = rank, 0, 0, None
    args.kv_cache_dtype_str = "bfloat16"
    args.kv_layout = get_pd_kv_layout(pool)
    args.prefill_start_layer, args.prefill_end_layer = 0, getattr(pool, "end_layer", None)
    args.kv_data_ptrs, args.kv_data_lens, args.kv_item_lens = get_kv_transfer_buf_infos(pool)
    args.num_draft_entries = 0
    args.kv_layer_ids = build_kv_layer_ids(token_to_kv_pool=pool, draft_token_to_kv_pool=None, num_draft_entries=0,
                                           num_hidden_layers=layers)
    if hasattr(pool, "head_num"):
        args.kv_head_num, args.total_kv_head_num = pool.head_num, total_heads
    args.page_size = pool.page_size
    args.aux_data_ptrs, args.aux_data_lens, args.aux_item_lens = meta.get_buf_infos()
    args.ib_device, args.gpu_id = None, 0
    setup_state_kv_args(args, pool, None, layers, req_to_token_pool=None)
    return args


def fill(pool, pages, page_size, seed):
    gen = torch.Generator().manual_seed(seed)
    for layer in range(pool.layer_num):
        for buf, _ in layer_buffers(pool, layer):
            for p in pages:
                rows = buf[p * page_size : (p + 1) * page_size]
                rows.copy_(torch.randn(rows.shape, generator=gen).to(buf.dtype))


def page_sum(pool, pages, page_size, share=0, shares=1):
    """A cheap fingerprint of pages (sum of their bytes as int64), to check
    that the decode landed the prefill's bytes; with shares, of the
    share-th of that many shares of an MHA page's heads (what a rank of a
    decode of a TP size shares times larger holds)."""
    out = []
    for layer in range(pool.layer_num):
        for buf, _ in layer_buffers(pool, layer):
            sums = []
            for p in pages:
                rows = buf[p * page_size : (p + 1) * page_size]
                if shares > 1:
                    n = rows.shape[1] // shares
                    rows = rows[:, share * n : (share + 1) * n]
                sums.append(int(rows.contiguous().view(torch.uint8).sum()))
            out.append(sums)
    return out


def _reason(side):
    try:
        side.failure_exception()
    except Exception as e:  # the backend's own words for the failure
        return str(e)
    return "no reason given"


def request(tokens, room):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req("r", "", array.array("i", tokens), SamplingParams(max_new_tokens=8))
    req.bootstrap_host, req.bootstrap_port, req.bootstrap_room = "127.0.0.1", BOOTSTRAP_PORT, room
    req.disagg_prefill_dp_rank = 0
    return req


def wait(side, want, limit=120, clock=None):
    """Polls side until it says want (or Failed); clock, when given, gets
    (monotonic time, process CPU seconds) before every poll."""
    from sglang.srt.disaggregation.base import KVPoll

    deadline = time.monotonic() + limit
    while True:
        if clock is not None:
            clock.append((time.monotonic(), cpu_s()))
        st = side.poll()
        if st == want or st == KVPoll.Failed:
            return st
        if time.monotonic() > deadline:
            return None
        time.sleep(0.0002)


def prefill(cfg, pool, meta, mgr, r):
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
    from sglang.srt.disaggregation.utils import TransferBackend

    page = cfg["page_size"]
    q = object.__new__(PrefillBootstrapQueue)
    q.kv_manager, q.transfer_backend, q.bootstrap_port, q.max_input_len = mgr, TransferBackend(cfg["backend"]), BOOTSTRAP_PORT, 1 << 30
    q.token_to_kv_pool = pool  # as SGLang's queue holds it: the plugin's wrap hands it to the manager
    # The KV first (the decode holds no prefix here), as a prefill's forward
    # pass makes it: the decode's hello then comes just before the send.
    n_pages = -(-len(r["tokens"]) // page)
    pages = list(range(r["first_slot_page"], r["first_slot_page"] + n_pages))
    # An MHA rank's heads are its own; an MLA rank's latent is every rank's.
    fill(pool, pages, page, seed=r["seed"] + (cfg.get("tp_rank", 0) if cfg["kind"] == "mha" else 0))
    aux_index = r["room"] % 8
    meta.output_ids[aux_index][0] = 4242
    shares = cfg.get("shares", 1)  # an MHA decode of a larger TP: each of its ranks holds a share of the heads
    out = {"sum": page_sum(pool, pages, page)}
    out["shares"] = [page_sum(pool, pages, page, k, shares) for k in range(shares)] if shares > 1 else [out["sum"]]
    print(json.dumps({"filled": r["room"]}), flush=True)  # the bench starts the decode's request now
    req = request(r["tokens"], r["room"])
    assert q.create_sender(req, num_kv_heads=cfg["heads"])
    sender = req.disagg_kv_sender
    st = wait(sender, KVPoll.WaitingForInput)
    if st != KVPoll.WaitingForInput:
        return {"state": "failed" if st == KVPoll.Failed else "bootstrap timeout", "reason": _reason(sender)}
    bootstrap_together(cfg, r["room"])
    prefix = sender.pop_decode_prefix_len() if hasattr(sender, "pop_decode_prefix_len") else 0
    if prefix:
        return {"state": "failed", "reason": f"the decode holds {prefix} tokens; this bench sends whole prompts"}
    sender.init(n_pages, aux_index)
    if hasattr(sender, "_finish"):  # when the last page is stored (before the acks), for the timeline
        finish = sender._finish
        def timed_finish():
            out["t_stored"] = time.monotonic()
            return finish()
        sender._finish = timed_finish
    c0, t0 = cpu_s(), time.monotonic()
    chunk = cfg.get("chunk_pages", n_pages)
    for i in range(0, n_pages, chunk):
        sender.send(np.array(pages[i : i + chunk], dtype=np.int32), None)
    st = wait(sender, KVPoll.Success)
    out.update(t_send=t0, t_done=time.monotonic(), cpu_s=cpu_s() - c0,
               state={KVPoll.Success: "success", KVPoll.Failed: "failed", None: "timeout"}.get(st, str(st)))
    if st != KVPoll.Success:
        out["reason"] = _reason(sender)
    out["written"] = getattr(sender, "written", None)
    if hasattr(sender, "clear"):
        sender.clear()
    return out


def bootstrap_together(cfg, room, limit=120):
    """SGLang's bootstrap queue all-reduces its senders' states over the
    prefill's TP ranks: a request goes on past its bootstrap once every
    rank's sender has. So no rank sends before the slowest rank found the
    decode (one that stands by, of an MLA decode of a smaller TP size,
    would otherwise look for a room its peers and the decode had already
    freed). The ranks meet in a directory: a file each."""
    if cfg.get("tp_size", 1) == 1:
        return
    here = os.path.join(cfg["barrier"], str(room))
    os.makedirs(here, exist_ok=True)
    open(os.path.join(here, str(cfg["tp_rank"])), "w").close()
    deadline = time.monotonic() + limit
    while len(os.listdir(here)) < cfg["tp_size"] and time.monotonic() < deadline:
        time.sleep(0.0005)


def decode(cfg, pool, meta, mgr, r):
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.decode import DecodePreallocQueue
    from sglang.srt.disaggregation.utils import TransferBackend

    page = cfg["page_size"]
    q = object.__new__(DecodePreallocQueue)
    q.kv_manager, q.transfer_backend, q.queue = mgr, TransferBackend(cfg["backend"]), []
    q.token_to_kv_pool = pool
    req = request(r["tokens"], r["room"])
    decode_req = q._create_receiver_and_enqueue(req)
    receiver = decode_req.kv_receiver
    # The prealloc queue's slow path (_ensure_prefill_info), then _init_receiver.
    addr, deadline = f"127.0.0.1:{BOOTSTRAP_PORT}", time.monotonic() + 60
    while not mgr.try_ensure_parallel_info(addr):
        if time.monotonic() > deadline:
            return {"state": "failed", "reason": f"no parallel info from {addr}"}
        time.sleep(0.05)
    receiver.init(0)
    if wait(receiver, KVPoll.WaitingForInput) != KVPoll.WaitingForInput:  # the prealloc queue's poll
        return {"state": "failed", "reason": _reason(receiver)}
    n_pages = -(-len(r["tokens"]) // page)
    pages = list(range(r["first_slot_page"], r["first_slot_page"] + n_pages))
    aux_index = r["room"] % 8
    clock = []  # the bench counts this side's CPU from the prefill's first send, not from its own polling
    receiver.send_metadata(np.array(pages, dtype=np.int32), aux_index, None)
    st = wait(receiver, KVPoll.Success, clock=clock)
    t1, c1 = time.monotonic(), cpu_s()
    return {"t_done": t1, "cpu_end": c1, "clock": clock, "t_started": getattr(receiver, "started", None),
            "streamed": getattr(receiver, "streamed", None), "sum": page_sum(pool, pages, page),
            "first_token": int(meta.output_ids[aux_index][0]),
            "state": {KVPoll.Success: "success", KVPoll.Failed: "failed", None: "timeout"}.get(st, str(st)),
            **({} if st == KVPoll.Success else {"reason": _reason(receiver)})}


def manager(cfg, role, pool, meta):
    """The backend's manager for this process's rank: the mooncake side
    builds what a launched server builds first (the runtime context at its
    rank, the process groups on gloo across this side's processes,
    Mooncake's engine); the bootstrap server runs in rank 0 of the prefill, as SGLang
    starts one per prefill server."""
    from sglang.srt.disaggregation.utils import DisaggregationMode, KVClassType, TransferBackend, get_kv_class

    backend, rank, tp = cfg["backend"], cfg.get("tp_rank", 0), cfg.get("tp_size", 1)
    sa = server_args(cfg, role)
    server = None
    if role == "prefill" and rank == 0:
        # SGLang starts it before the schedulers (start_disagg_service), so
        # every rank finds it when it registers. Here it starts before the
        # process groups, which no other prefill rank passes without this one.
        server = get_kv_class(TransferBackend(backend), KVClassType.BOOTSTRAP_SERVER)(host="127.0.0.1", port=BOOTSTRAP_PORT)
        if backend == "mooncake":
            await_bootstrap_server(BOOTSTRAP_PORT)
    if backend == "mooncake":
        os.environ["MC_FORCE_TCP"] = "1"
        from sglang.srt.runtime_context import SpawnRanks, publish
        from sglang.srt.distributed.device_communicators.mooncake_transfer_engine import init_mooncake_transfer_engine

        publish(sa, role="test", ranks=SpawnRanks(world_rank=rank, dp_rank=None))
        from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel
        from sglang.srt.platforms import current_platform

        # The process groups a launched server builds, on gloo across this
        # side's ranks. SGLang opens NCCL for a group of two or more unless its
        # platform says it has none: on a machine without CUDA, say so (the
        # platform's own capabilities already do; only the in-tree check
        # overrides them). The KV moves through Mooncake's engine, not them.
        init_distributed_environment(world_size=tp, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{BOOTSTRAP_PORT + (1 if role == 'prefill' else 2)}")
        with mock.patch.object(type(current_platform), "is_out_of_tree", lambda _self: True):
            assert not current_platform.capabilities.supports_pynccl
            initialize_model_parallel(backend="gloo")
        init_mooncake_transfer_engine(hostname="127.0.0.1", gpu_id=rank, ib_device=None)
    cls = get_kv_class(TransferBackend(backend), KVClassType.MANAGER)
    args = kv_args(backend, pool, meta, cfg["layers"], rank, cfg["heads"])
    mgr = cls(args, DisaggregationMode(role), sa, is_mla_backend=cfg["kind"] == "mla")
    return mgr, server


def await_bootstrap_server(port, limit=60):
    """Until SGLang's bootstrap server answers on port: it binds in a thread
    of its own and only logs a failure there (a port taken since the bench
    chose it), after which every rank's registration and the decode's query
    would fail quietly and the request time out a minute later."""
    deadline = time.monotonic() + limit
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
                status = s.recv(64).split(b"\r\n", 1)[0]  # "HTTP/1.1 200 OK"
                if status.startswith(b"HTTP/1.") and status.split()[1:2] == [b"200"]:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"SGLang's bootstrap server is not answering on 127.0.0.1:{port} after {limit} s "
                               "(its log above says why: a port in use?)")
        time.sleep(0.05)


def main():
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
        return
    work(sys.argv[1], json.loads(sys.argv[2]))


def work(role, cfg):
    if cfg["backend"] == "cxltier":
        from cxltier.sglang import disagg

        disagg.install()
    from sglang.srt.disaggregation.utils import MetadataBuffers

    # An MHA rank holds its share of the KV heads; an MLA rank the whole latent.
    dims = {"head_num": max(1, cfg["heads"] // cfg.get("tp_size", 1)), "head_dim": cfg["head_dim"], "kv_lora_rank": cfg["kv_lora_rank"],
            "qk_rope_head_dim": cfg["qk_rope_head_dim"]}
    pool = kv_pool(cfg["kind"], cfg["page_size"], cfg["pool_tokens"], layers=cfg["layers"], dims=dims)
    meta = MetadataBuffers(8, hidden_size=16, hidden_states_dtype=torch.bfloat16, max_sampling_mask_tokens=1)
    mgr, _server = manager(cfg, role, pool, meta)
    print(json.dumps({"ready": role}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        r = json.loads(line)
        out = (prefill if role == "prefill" else decode)(cfg, pool, meta, mgr, r)
        out["room"] = r["room"]
        print(json.dumps(out), flush=True)
    os._exit(0)  # the mooncake engine's threads do not end on their own


def serve(fd):
    """The fork server (see the module comment)."""
    import cxltier.sglang.disagg  # noqa: F401 - libcxltier loads at its first call, in a worker
    from sglang.srt.disaggregation.decode import DecodePreallocQueue  # noqa: F401
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue  # noqa: F401
    from sglang.srt.disaggregation.utils import MetadataBuffers  # noqa: F401
    from sglang.srt.managers.schedule_batch import Req  # noqa: F401
    from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: F401
    from sglang.srt.server_args import ServerArgs  # noqa: F401

    server = forkserver.Server("worker serve")
    sock = socket.socket(fileno=fd)
    sock.send(json.dumps({"ready": True}).encode())
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 3)
        if not msg:
            break
        req = json.loads(msg)
        pid = server.fork(req["rc"], lambda: _child(req, fds, sock))
        for f in fds:
            os.close(f)
        sock.send(json.dumps({"pid": pid}).encode())
    server.close()  # the run is over


def _child(req, fds, sock):
    """A forked worker: the request's environment and standard streams,
    then work() as a started worker runs it."""
    global BOOTSTRAP_PORT
    sock.close()
    forkserver.redirect(req["env"], fds)
    BOOTSTRAP_PORT = int(os.environ.get("PD_BENCH_BOOTSTRAP_PORT", "18998"))
    work(req["role"], req["cfg"])


if __name__ == "__main__":
    main()
