"""Engram prefetch in SGLang's forward pass.

Engram's row indices depend only on token ids, so every Engram layer's rows
can be fetched before the first layer runs. EngramForwardHook starts, at the
top of each forward pass, one prefetch per Engram layer from the batch's
input ids; the model consumes them before each Engram layer with
`forward_batch.cxltier_engram.rows(layer)`, which waits for that layer only.

N-grams reach back max_ngram - 1 tokens, across the boundary of what a
forward pass holds: decode steps carry one token per request and extends
carry only the tokens after the cached prefix. The hook keeps the last
max_ngram - 1 compressed ids of every live request (keyed by its
req_pool_index) and forgets a request when SGLang frees its index. When a
request arrives with a cached prefix whose ids the hook never saw, it cannot
hash that request's first positions exactly: the batch is then not
prefetched (rows() returns None, counted as "no_history") and the model must
use its own lookup for that pass; from the next pass on the request's
history is known.

Who it is for: models SGLang does not serve with its own Engram layers —
DeepSeek's Engram reference models (the demo, Engram-27B/40B geometries)
run as an external model package (SGLANG_EXTERNAL_MODEL_PACKAGE) that reads
`forward_batch.cxltier_engram`. For DeepSeek-V4.1, which SGLang 0.5.23
serves natively, the hook switches itself off (serves_engram_natively) and
cxltier.sglang.engram_host puts SGLang's own tables in the tier instead.

install() wraps ModelRunner.forward (see cxltier.sglang.plugin); the hook itself
needs neither SGLang nor torch and is tested without them.
"""

import logging
import os

logger = logging.getLogger(__name__)


class BatchRows:
    """The prefetches of one forward pass, one per Engram layer."""

    def __init__(self, pending, seq_lens, prefetcher):
        self._pending = pending
        self.seq_lens = seq_lens  # new tokens per request, in batch order
        self.prefetcher = prefetcher

    def buffer(self, layer):
        """(device address, bytes, row bytes) of layer's cache (GPU engines)."""
        return self.prefetcher.buffer(layer)

    def rows(self, layer):
        """Waits for layer's rows and returns its Prefetch: `slots` holds the
        cache slot of each row (request, position, then order and head, the
        engram_hash layout) in the prefetcher's layer cache."""
        pf = self._pending[layer]
        pf.wait()
        return pf


class EngramForwardHook:
    """Starts Engram prefetches from a forward pass's ids.

    prefetcher: a cxltier.EngramPrefetcher. raw_ids: whether the ids are raw
    tokenizer ids to map through the geometry's lookup table (default: when
    the geometry has one).
    """

    def __init__(self, prefetcher, raw_ids=None):
        self.prefetcher = prefetcher
        self.layers = list(prefetcher.layers)
        self.raw_ids = prefetcher.has_lookup if raw_ids is None else raw_ids
        if self.raw_ids and not prefetcher.has_lookup:
            raise ValueError("raw ids need a geometry with a lookup table")
        self._keep = prefetcher.max_ngram - 1
        self._history = {}  # req -> (tokens seen, their last max_ngram-1 compressed ids, whether those are all known)
        self.counters = {"passes": 0, "prefetched": 0, "no_history": 0, "skipped": 0, "errors": 0}

    def begin(self, reqs, seqs, prefix_lens):
        """Starts every layer's prefetch for requests reqs whose new ids are
        seqs[i], preceded by prefix_lens[i] tokens of the same request.
        Returns a BatchRows, or None when a request's history is unknown."""
        self.counters["passes"] += 1
        if not (len(reqs) == len(seqs) == len(prefix_lens)):
            raise ValueError(f"{len(reqs)} requests, {len(seqs)} id lists, {len(prefix_lens)} prefix lengths")
        seqs = [self.prefetcher.compress(s) if self.raw_ids else list(s) for s in seqs]
        tails = [self._tail(req, prefix) for req, prefix in zip(reqs, prefix_lens)]
        for req, prefix, s, (tail, whole) in zip(reqs, prefix_lens, seqs, tails):
            # A tail the hook saw only part of becomes whole once it and
            # the new ids reach back max_ngram - 1 ids.
            ids = (tail + s)[-self._keep :]
            self._history[req] = (prefix + len(s), ids, whole or len(ids) == self._keep)
        known = all(whole for _, whole in tails)
        hists = [tail for tail, _ in tails]
        if not known:
            self.counters["no_history"] += 1
            return None
        pending = {layer: self.prefetcher.prefetch(layer, seqs, hists) for layer in self.layers}
        self.counters["prefetched"] += 1
        return BatchRows(pending, [len(s) for s in seqs], self.prefetcher)

    def _tail(self, req, prefix):
        """The last ids before a request's new ones that the hook saw, and
        whether they are all the hash needs."""
        if prefix == 0:
            return [], True
        seen, last, whole = self._history.get(req, (0, [], False))
        if seen != prefix:
            return [], False
        return last, whole

    def forget(self, reqs):
        """Drops the history of requests whose index SGLang freed."""
        for r in reqs:
            self._history.pop(r, None)

    def begin_forward(self, forward_batch):
        """begin() from an SGLang ForwardBatch: decode passes carry one id per
        request after seq_len - 1 tokens; extend and mixed passes carry
        extend_seq_lens_cpu ids after extend_prefix_lens_cpu. Other passes
        (idle, speculative verify) are not prefetched."""
        mode = forward_batch.forward_mode
        if mode.is_idle():
            return None
        reqs = [int(r) for r in _list(forward_batch.req_pool_indices)]
        ids = [int(x) for x in _list(forward_batch.input_ids)]
        if mode.is_decode():
            lens = [1] * len(reqs)
            prefix = [int(n) - 1 for n in _list(_first(forward_batch, "seq_lens_cpu", "seq_lens"))]
        elif mode.is_extend() and not _is(mode, "is_target_verify") and not _is(mode, "is_draft_extend"):
            lens = [int(n) for n in forward_batch.extend_seq_lens_cpu]
            prefix = [int(n) for n in forward_batch.extend_prefix_lens_cpu]
        else:
            self.counters["skipped"] += 1
            return None
        if sum(lens) != len(ids):
            raise ValueError(f"{len(ids)} input ids for sequence lengths summing to {sum(lens)}")
        seqs, at = [], 0
        for n in lens:
            seqs.append(ids[at : at + n])
            at += n
        return self.begin(reqs, seqs, prefix)


    def begin_forward_safely(self, forward_batch):
        """begin_forward, but a failure is logged (the first in full) and
        counted instead of failing the pass: the model then uses its own
        lookup, as it does for a batch without history."""
        try:
            return self.begin_forward(forward_batch)
        except Exception:
            self.counters["errors"] += 1
            if self.counters["errors"] == 1:
                logger.exception("cxltier: Engram prefetch failed; this pass uses the model's own lookup")
            return None


def _list(x):
    """A tensor or sequence as a Python list (a GPU tensor is copied)."""
    return x.tolist() if hasattr(x, "tolist") else list(x)


def _first(obj, *names):
    for n in names:
        v = getattr(obj, n, None)
        if v is not None:
            return v
    raise AttributeError(f"forward batch has none of {names}")


def _is(mode, name):
    f = getattr(mode, name, None)
    return bool(f and f())


def wrap_model_runner(cls, make_hook):
    """Wraps cls.forward (SGLang's ModelRunner) so that every pass first
    starts its Engram prefetches and hands them to the model as
    forward_batch.cxltier_engram. make_hook(runner) builds a runner's hook
    on its first pass; freeing request indices in its req_to_token_pool
    makes the hook forget them. Returns False when cls is wrapped already."""
    if getattr(cls.forward, "_cxltier_engram", False):
        return False
    original = cls.forward

    def forward(self, forward_batch, *args, **kwargs):
        rows = None
        try:
            hook = self.__dict__.get("_cxltier_engram_hook")
            if hook is None:
                hook = self._cxltier_engram_hook = make_hook(self)
                if hook is not False:
                    _forget_on_free(self, hook)
            if hook is not False:
                rows = hook.begin_forward_safely(forward_batch)
        except Exception:
            # No tier, no tables, a bad geometry: this runner runs without
            # the prefetch (the model's own lookup), and says so once.
            self._cxltier_engram_hook = False
            logger.exception("cxltier: Engram prefetch hook disabled for this runner")
        forward_batch.cxltier_engram = rows
        return original(self, forward_batch, *args, **kwargs)

    forward._cxltier_engram = True
    forward.__wrapped__ = original
    cls.forward = forward
    return True


def _forget_on_free(runner, hook):
    """Makes the hook forget requests whose rows the runner's
    req_to_token_pool frees. SGLang 0.5.23 releases every row through
    free_rows(indices) (free(req) calls it with req.kv.req_pool_idx); an
    older pool has only free(indices). The wrapper never raises into SGLang:
    a row it cannot read is logged once and the real call goes on."""
    pool = getattr(runner, "req_to_token_pool", None)
    name = "free_rows" if callable(getattr(pool, "free_rows", None)) else "free"
    real = getattr(pool, name, None)
    if not callable(real):
        logger.warning("cxltier: no req_to_token_pool.free_rows or free to follow; Engram histories are kept until reused")
        return

    def forgetting(arg, *args, **kwargs):
        try:
            hook.forget(_rows(arg))
        except Exception:
            hook.counters["errors"] += 1
            if not getattr(hook, "_free_warned", False):
                hook._free_warned = True
                logger.exception("cxltier: could not read the rows freed by req_to_token_pool.%s", name)
        return real(arg, *args, **kwargs)

    setattr(pool, name, forgetting)


def _rows(arg):
    """Request rows from what a pool's free takes: a row, rows (a list or
    tensor), or a request (req.kv.req_pool_idx, or req.req_pool_idx)."""
    kv = getattr(arg, "kv", None)
    if kv is not None and hasattr(kv, "req_pool_idx"):
        arg = kv.req_pool_idx
    elif hasattr(arg, "req_pool_idx"):
        arg = arg.req_pool_idx
    if arg is None:
        return []
    if isinstance(arg, int):
        return [arg]
    return [int(i) for i in _list(arg)]


def hook_from_env(runner):
    """The hook the plugin gives a runner: geometry from CXLTIER_ENGRAM (a
    preset name or a geometry JSON file; its "lookup" file beside it), the
    tier from CXLTIER_DEVICES, the row buffers on the runner's GPU and
    current stream when torch has CUDA, CXLTIER_ENGRAM_SLOTS rows per layer,
    the hot-row cache on when CXLTIER_ENGRAM_CACHE=1, hashing and cache
    bookkeeping on the engine when CXLTIER_ENGRAM_PLANNER=engine."""
    from ..engram import EngramPrefetcher
    from ..tier import Tier

    if serves_engram_natively(getattr(runner, "model", None)):
        logger.info("cxltier: SGLang serves this model's Engram layers itself; the forward hook stays off "
                    "(CXLTIER_ENGRAM_HOST_TABLE=1 puts their tables in the tier)")
        return False
    spec = os.environ["CXLTIER_ENGRAM"]
    if os.path.exists(spec):
        from ..engram import geometry_spec

        spec = geometry_spec(os.path.abspath(spec))
    engine, stream = "cpu", 0
    try:
        import torch

        if torch.cuda.is_available():
            engine, stream = "cuda", torch.cuda.current_stream().cuda_stream
    except ImportError:
        pass
    tier = Tier(os.environ.get("CXLTIER_DEVICES", "shm:cxltier"), name=f"engram-{os.getpid()}")
    slots = int(os.environ.get("CXLTIER_ENGRAM_SLOTS", 1 << 17))
    cache = os.environ.get("CXLTIER_ENGRAM_CACHE", "0") == "1"
    planner = os.environ.get("CXLTIER_ENGRAM_PLANNER", "host")
    pf = EngramPrefetcher(tier, spec, engine=engine, stream=stream, slots=slots, cache=cache, planner=planner)
    runner._cxltier_engram_tier = tier  # lives as long as the runner
    logger.info("cxltier: Engram prefetch for layers %s on the %s engine", pf.layers, engine)
    return EngramForwardHook(pf)


def serves_engram_natively(model):
    """Whether model has SGLang's own Engram layers (DeepSeek-V4.1 in SGLang
    0.5.23), which read their rows from SGLang's host table, not from this
    hook."""
    if model is None or not hasattr(model, "modules"):
        return False
    try:
        from sglang.srt.layers.engram import EngramEmbedding
    except ImportError:
        return False
    return any(isinstance(m, EngramEmbedding) for m in model.modules())


def install():
    """Wraps SGLang's ModelRunner.forward; False when SGLang is absent."""
    try:
        from sglang.srt.model_executor.model_runner import ModelRunner
    except ImportError:
        return False
    return wrap_model_runner(ModelRunner, hook_from_env)
