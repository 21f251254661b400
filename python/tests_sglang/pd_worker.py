"""One side of SGLang's prefill-decode disaggregation through the tier, on
CPU, as a process of its own: SGLang's real KV pool (MHA or MLA) and
metadata buffers, its KVArgs built as PrefillBootstrapQueue._init_kv_manager
and DecodePreallocQueue build them, the transfer backend's classes found by
SGLang's get_kv_class, the sender made by SGLang's own
PrefillBootstrapQueue.create_sender and the receiver by
DecodePreallocQueue._create_receiver_and_enqueue (the cxltier plugin's
wraps hand them the prompt), then the calls in the order SGLang's queues
make them. The queues themselves need a running scheduler (a model runner,
a tree cache) that a CPU machine cannot build: the worker makes the
queue objects with only the fields those two methods read, and drives
them as follows.

- prefill: create_sender; poll until the decode's hello (bootstrap);
  pop_decode_prefix_len and init(num_pages, aux_index) (finalize_bootstrap);
  the KV written as a forward would; send() per chunk (send_kv_chunk);
  poll until Success or Failed (the inflight queue).
- decode: _create_receiver_and_enqueue; init(0); send_metadata(pages it
  allocated, aux_index, decode_prefix_len) (the prealloc queue); poll
  until Success or Failed (the transfer queue).

    python pd_worker.py ROLE JSON
    python pd_worker.py serve

serve: a fork server. Importing torch and SGLang takes a process about
17 s of CPU, most of a test's time when every test starts two to six
workers; the server imports them once (nothing that starts a thread or
loads libcxltier, whose Go runtime would not survive a fork) and forks a
worker for each line on stdin (forkserver.serve_lines: the child runs as
a worker started with ROLE and JSON would).

JSON: the job (kind, tokens, room, seed, pages; tp_rank and tp_size for a
rank of a TP group, heads for an MHA rank's KV heads, shares for the
digests of a page's heads in that many shares (a prefill's, of a larger
decode; a decode's, of a larger prefill), delay for a slow
rank, barrier for a directory where the prefill ranks of a group wait for
each other after their bootstrap as SGLang's all-reduce of their states
makes them, poll_after for a decode that polls late, poll_gate for a
prefill that polls only once that file exists, model for the model
path: see the tests).

prints one JSON line: the outcome and a digest of every page it holds.
"""

import array
import hashlib
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import forkserver  # noqa: E402
from linker_stack import SMALL, kv_pool, layer_buffers  # noqa: E402


def server_args(kind, tp_size, model):
    from sglang.srt.server_args import ServerArgs

    return ServerArgs(model_path=model, device="cpu", page_size=PAGE, disaggregation_mode=ROLE,
                      disaggregation_transfer_backend="cxltier", tp_size=tp_size)


def kv_args(pool, meta, tp_rank):
    """KVArgs as PrefillBootstrapQueue._init_kv_manager makes them (the
    fields this backend reads, from the same SGLang calls)."""
    from sglang.srt.disaggregation.utils import KVClassType, TransferBackend, get_kv_class, get_kv_transfer_buf_infos

    args = get_kv_class(TransferBackend("cxltier"), KVClassType.KVARGS)()
    args.engine_rank, args.pp_rank = tp_rank, 0
    args.kv_cache_dtype_str = "auto"  # what SGLang's model runner gives with --kv-cache-dtype auto (the default)
    args.kv_data_ptrs, args.kv_data_lens, args.kv_item_lens = get_kv_transfer_buf_infos(pool)
    args.page_size = pool.page_size
    args.aux_data_ptrs, args.aux_data_lens, args.aux_item_lens = meta.get_buf_infos()
    args.state_types, args.num_draft_entries = [], 0
    return args


def page_digest(pool, page, share=0, shares=1):
    """sha256 over every layer's bytes of one page (K then V, or the
    latent); with shares, of the share-th of that many equal shares of its
    heads (what a decode rank of a TP size shares times larger holds)."""
    h = hashlib.sha256()
    for layer in range(pool.layer_num):
        for buf, _ in layer_buffers(pool, layer):
            rows = buf[page * PAGE : (page + 1) * PAGE]
            if shares > 1:
                n = rows.shape[1] // shares
                rows = rows[:, share * n : (share + 1) * n]
            h.update(rows.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fill(pool, page, seed):
    gen = torch.Generator().manual_seed(seed)
    for layer in range(pool.layer_num):
        for buf, _ in layer_buffers(pool, layer):
            rows = buf[page * PAGE : (page + 1) * PAGE]
            rows.copy_(torch.randn(rows.shape, generator=gen).to(buf.dtype))


def request(tokens, room):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req("r", "", array.array("i", tokens), SamplingParams(max_new_tokens=8))
    req.bootstrap_host, req.bootstrap_port, req.bootstrap_room = "127.0.0.1", 8998, room
    req.disagg_prefill_dp_rank = None
    return req


def wait(side, states, limit):
    from sglang.srt.disaggregation.base import KVPoll

    deadline = time.monotonic() + limit
    while True:
        st = side.poll()
        if st in states or st == KVPoll.Failed:
            return st
        if time.monotonic() > deadline:
            return None
        time.sleep(0.001)


def prefill(job, pool, meta, mgr):
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
    from sglang.srt.disaggregation.utils import TransferBackend

    time.sleep(job.get("delay", 0))  # a slow rank
    q = object.__new__(PrefillBootstrapQueue)  # only what create_sender reads: see the module comment
    q.kv_manager, q.transfer_backend, q.bootstrap_port, q.max_input_len = mgr, TransferBackend("cxltier"), 8998, 1 << 20
    q.token_to_kv_pool = pool
    req = request(job["tokens"], job["room"])
    assert q.create_sender(req, num_kv_heads=2)
    sender = req.disagg_kv_sender
    out = {"role": "prefill"}
    if wait(sender, (KVPoll.WaitingForInput,), job.get("bootstrap_limit", 30)) != KVPoll.WaitingForInput:
        out["state"], out["reason"] = "failed", sender.reason
        return out
    if job.get("barrier"):  # SGLang's bootstrap queue: a request goes on once every TP rank bootstrapped
        open(os.path.join(job["barrier"], f"prefill-{job.get('tp_rank', 0)}"), "w").close()
        deadline = time.monotonic() + job.get("bootstrap_limit", 30)
        while len(os.listdir(job["barrier"])) < job.get("tp_size", 1) and time.monotonic() < deadline:
            time.sleep(0.01)
    prefix = sender.pop_decode_prefix_len()
    n_pages = -(-(len(job["tokens"]) - prefix) // PAGE)
    aux_index = job.get("aux_index", 3)
    sender.init(n_pages, aux_index)
    first = prefix // PAGE
    pages = [job["first_slot_page"] + i for i in range(n_pages)]
    for i, p in enumerate(pages):
        fill(pool, p, seed=job["seed"] * 1000 + first + i)
    meta.output_ids[aux_index][0] = job["first_token"]
    out["digests"] = [page_digest(pool, p) for p in pages]
    shares = job.get("shares", 1)
    out["shares"] = [[page_digest(pool, p, k, shares) for p in pages] for k in range(shares)]
    if job.get("keys_gate"):  # another writer takes the request's pages first: the test, told their keys
        keys = mgr.page_keys(job["tokens"][: (len(job["tokens"]) // PAGE) * PAGE])
        print(json.dumps({"role": "prefill", "state": "keys", "keys": [keys.hex(i) for i in range(len(keys))],
                          "page_bytes": mgr.page_bytes}), flush=True)
        deadline = time.monotonic() + job.get("bootstrap_limit", 30)
        while not os.path.exists(job["keys_gate"]) and time.monotonic() < deadline:
            time.sleep(0.01)
    if job.get("die_before_send"):
        print(json.dumps({"role": "prefill", "state": "about to die"}), flush=True)
        time.sleep(60)
    chunk = job.get("chunk_pages", 2)
    for i in range(0, n_pages, chunk):
        if i:
            time.sleep(job.get("send_gap", 0))  # a chunked prefill computing its next chunk
        sender.send(np.array(pages[i : i + chunk], dtype=np.int32), None,
                    num_kv_tokens=min(chunk * PAGE, len(job["tokens"]) - prefix - i * PAGE))
    if job.get("poll_gate"):  # a prefill scheduler busy elsewhere: it polls only once the test says so
        deadline = time.monotonic() + job.get("limit", 30)
        while not os.path.exists(job["poll_gate"]) and time.monotonic() < deadline:
            time.sleep(0.01)
    st = wait(sender, (KVPoll.Success,), job.get("limit", 30))
    out["state"] = {KVPoll.Success: "success", KVPoll.Failed: "failed", None: "timeout"}.get(st, str(st))
    out["reason"] = sender.reason
    out["written"], out["present"] = sender.written, sender.present
    out["metric"] = sender.get_transfer_metric().transfer_total_bytes
    if st == KVPoll.Success:
        sender.clear()  # as SGLang's inflight queue: it clears a sender after a success only
    return out


def decode(job, pool, meta, mgr):
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.decode import DecodePreallocQueue
    from sglang.srt.disaggregation.utils import TransferBackend

    time.sleep(job.get("delay", 0))  # a slow rank
    q = object.__new__(DecodePreallocQueue)  # only what _create_receiver_and_enqueue reads
    q.kv_manager, q.transfer_backend, q.queue, q.token_to_kv_pool = mgr, TransferBackend("cxltier"), [], pool
    req = request(job["tokens"], job["room"])
    decode_req = q._create_receiver_and_enqueue(req)
    receiver = decode_req.kv_receiver
    receiver.init(0)
    prefix = job.get("decode_prefix_len", 0)
    n_pages = -(-(len(job["tokens"]) - prefix) // PAGE)
    pages = [job["first_slot_page"] + i for i in range(n_pages)]
    aux_index = 5
    receiver.send_metadata(np.array(pages, dtype=np.int32), aux_index, None, decode_prefix_len=prefix)
    if job.get("abort_after"):
        time.sleep(job["abort_after"])
        receiver.abort()
        receiver.clear()
        return {"role": "decode", "state": "aborted"}
    time.sleep(job.get("poll_after", 0))  # a decode scheduler busy elsewhere: it lands nothing until it polls
    st = wait(receiver, (KVPoll.Success,), job.get("limit", 30))
    receiver.clear()  # as SGLang's decode queues, after a success or a failure
    out = {"role": "decode", "state": {KVPoll.Success: "success", KVPoll.Failed: "failed", None: "timeout"}.get(st, str(st)),
           "reason": receiver.reason, "digests": [page_digest(pool, p) for p in pages],
           "first_token": int(meta.output_ids[aux_index][0]), "streamed": getattr(receiver, "streamed", None)}
    shares = job.get("shares", 1)  # a decode rank of a smaller TP size holds several prefill ranks' heads
    out["shares"] = [[page_digest(pool, p, k, shares) for p in pages] for k in range(shares)]
    return out


def many(job, pool, meta, mgr):
    """job["many"] requests in flight at once, each of its own room (room
    + k), prompt and pages: the decode says hello in every room first and
    then polls them all; the prefill serves them one after another."""
    out = {"role": ROLE, "states": [], "digests": [], "first_tokens": []}
    side = prefill if ROLE == "prefill" else None
    jobs = [dict(job, room=job["room"] + k, tokens=[t + 10000 * k for t in job["tokens"]], seed=job["seed"] + k,
                 first_slot_page=job["first_slot_page"] + 2 * k, aux_index=k, first_token=job["first_token"] + k)
            for k in range(job["many"])]
    if side is not None:
        for j in jobs:
            r = side(j, pool, meta, mgr)
            out["states"].append(r["state"] if r["state"] == "success" else f"{r['state']}: {r['reason']}")
            out["digests"].append(r.get("digests"))
        return out
    receivers = [start_decode(j, pool, mgr) for j in jobs]
    from sglang.srt.disaggregation.base import KVPoll

    deadline = time.monotonic() + job.get("limit", 60)
    states = [None] * len(receivers)
    while None in states and time.monotonic() < deadline:
        for k, (receiver, _) in enumerate(receivers):
            if states[k] is None:
                st = receiver.poll()
                if st in (KVPoll.Success, KVPoll.Failed):
                    states[k] = "success" if st == KVPoll.Success else f"failed: {receiver.reason}"
        time.sleep(0.001)
    for k, (receiver, pages) in enumerate(receivers):
        out["states"].append(states[k] or "timeout")
        out["digests"].append([page_digest(pool, p) for p in pages])
        out["first_tokens"].append(int(meta.output_ids[k][0]))
        receiver.clear()
    return out


def start_decode(job, pool, mgr):
    """A receiver of job's request, its hello said: (receiver, its pages)."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue
    from sglang.srt.disaggregation.utils import TransferBackend

    q = object.__new__(DecodePreallocQueue)
    q.kv_manager, q.transfer_backend, q.queue, q.token_to_kv_pool = mgr, TransferBackend("cxltier"), [], pool
    receiver = q._create_receiver_and_enqueue(request(job["tokens"], job["room"])).kv_receiver
    receiver.init(0)
    pages = [job["first_slot_page"] + i for i in range(-(-len(job["tokens"]) // PAGE))]
    receiver.send_metadata(np.array(pages, dtype=np.int32), job["aux_index"], None, decode_prefix_len=0)
    return receiver, pages


def main(argv):
    if argv[0] == "serve":
        serve()
        return
    run(argv[0], json.loads(argv[1]))


def run(role, job):
    global ROLE, PAGE
    ROLE, PAGE = role, job["page_size"]
    from cxltier.sglang import disagg

    disagg.install()  # what the plugin does in every SGLang process, before SGLang looks the backend up
    from sglang.srt.disaggregation.utils import DisaggregationMode, KVClassType, MetadataBuffers, TransferBackend, get_kv_class
    pool = kv_pool(job["kind"], PAGE, job["pool_tokens"], dims=dict(SMALL, head_num=job.get("heads", SMALL["head_num"])))
    meta = MetadataBuffers(max(8, job.get("many", 0)), hidden_size=16, hidden_states_dtype=torch.bfloat16, max_sampling_mask_tokens=1)
    mgr_class = get_kv_class(TransferBackend("cxltier"), KVClassType.MANAGER)
    try:
        mgr = mgr_class(kv_args(pool, meta, job.get("tp_rank", 0)), DisaggregationMode(ROLE),
                        server_args(job["kind"], job.get("tp_size", 1), job.get("model", "pd-test-model")),
                        is_mla_backend=job["kind"] == "mla")
    except Exception as e:
        print(json.dumps({"role": ROLE, "state": "refused", "reason": str(e)}), flush=True)
        return
    out = (many if job.get("many") else prefill if ROLE == "prefill" else decode)(job, pool, meta, mgr)
    print(json.dumps(out), flush=True)
    mgr.close()


def serve():
    """The fork server (see the module comment)."""
    import cxltier.sglang.disagg  # noqa: F401 - SGLang's modules, torch; libcxltier loads at its first call
    from sglang.srt.disaggregation.decode import DecodePreallocQueue  # noqa: F401
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue  # noqa: F401
    from sglang.srt.disaggregation.utils import MetadataBuffers  # noqa: F401
    from sglang.srt.managers.schedule_batch import Req  # noqa: F401
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: F401
    from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: F401
    from sglang.srt.server_args import ServerArgs  # noqa: F401

    forkserver.serve_lines("pd_worker serve", main)


if __name__ == "__main__":
    main(sys.argv[1:])
