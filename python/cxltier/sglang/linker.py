"""SGLang's unified-cache external linker on a cxltier prefix index: KV
pages move straight between SGLang's device pools and the tier, with no
host staging pool, and one copy of an MLA or DSA page serves every TP rank.

    --enable-unified-cache-external-linker \\
    --unified-cache-external-linker-backend dynamic \\
    --unified-cache-external-linker-config '{"linker": "CxlTierLinker",
        "linker_module_path": "cxltier.sglang.linker",
        "linker_extra_config": {"devices": "shm:cxltier", "index": "dsv32"}}'

linker_extra_config takes the HiCache backend's keys (devices, index, key,
blocks, block_bytes, verify, kv_dtype), engine ("cpu", "cuda"; default:
the pools' device) and share_ranks (default 1; 0 stores MLA and DSA pages
once per rank). With blocks and no block_bytes a missing index is made
with blocks as large as one page.

A page of a pool is one entry: its layers in order, each layer's buffers
(K then V for MHA; the latent for MLA; DSA's indexer keys are a second pool
of their own entries). Entries are keyed by SGLang's page hash XOR a mask
naming the model, the pool, its geometry and KV dtype, and for pools that
differ between TP ranks (MHA heads) the rank: MLA and DSA pages carry no
rank, so every rank finds the page the first rank stored and loads the same
tier bytes, with no broadcast between ranks.

Loads go a layer at a time on a thread of their own: SGLang's forward waits
for layer l (LayerWiseLoadCounter) while later layers land. Entries are
pinned for the whole load, and their checksums are accumulated layer by
layer and compared after the last: a damaged page fails the batch's load
(SGLang aborts its requests, so what landed is never used) and is dropped
from the index, so the next lookup misses it.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
from dataclasses import dataclass

import torch

from . import pagekeys
from .._native import CxlTierError
from .hicache import _kv_dtype
from ..kvpool import KVPool
from ..prefix import part_keys
from ..tier import Tier

logger = logging.getLogger(__name__)

try:  # SGLang is only there on serving machines.
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import LayerWiseLoadCounter, UnifiedCacheLinker
except ImportError:  # pragma: no cover - exercised where SGLang is installed
    UnifiedCacheLinker = None


class LinkerError(ValueError):
    """A pool, component or configuration the linker does not serve."""


@dataclass
class PoolPart:
    """Buffers of one pool that share a geometry, layer-major: page p's
    chunk in each is chunk bytes at p * stride."""

    buffers: list  # tensors, per_layer per layer
    per_layer: int
    chunk: int
    stride: int


@dataclass
class DevicePool:
    """A pool the linker moves: its parts, the transfer whose keys and
    slots it takes (SGLang's KV or SWA transfer), and the model layer of
    each of its layers."""

    name: str
    parts: list
    source: str  # "kv" or "swa"
    layers: list


def _part_of(name, layers, page_size, rows_are_pages):
    """The PoolPart of layers (each a list of tensors whose first dimension
    is a row: a token, or a page when rows_are_pages)."""
    flat = [t for layer in layers for t in layer]
    geoms = set()
    for t in flat:
        row = t[0].numel() * t.element_size() if t.shape[0] else 0
        stride = t.stride(0) * t.element_size()
        if rows_are_pages:
            geoms.add((row, stride))
        else:
            if stride != row or not t[0].is_contiguous():
                raise LinkerError(f"cxltier linker: pool {name}: token rows are not contiguous (stride {stride}, row {row})")
            geoms.add((page_size * row, page_size * row))
    if len(geoms) != 1:
        raise LinkerError(f"cxltier linker: pool {name}: buffers of differing geometries {sorted(geoms)}")
    chunk, stride = geoms.pop()
    if chunk <= 0:
        raise LinkerError(f"cxltier linker: pool {name}: empty rows")
    return PoolPart(flat, len(layers[0]), chunk, stride)


def _mha_parts(name, pool, page_size):
    """K and V of an MHA pool: one part when they share a geometry, else a
    part each."""
    if getattr(pool, "k_scale_buffer", None) is not None or getattr(pool, "native_k_scale_buffer", None) is not None:
        raise LinkerError("cxltier linker: scaled (fp4/mxfp8) MHA KV caches are not supported")
    ks, vs = list(pool.k_buffer), list(pool.v_buffer)
    if [(k.shape[1:], k.dtype) for k in ks] == [(v.shape[1:], v.dtype) for v in vs]:
        return [_part_of(name, [[k, v] for k, v in zip(ks, vs)], page_size, False)]
    return [_part_of(f"{name}.k", [[k] for k in ks], page_size, False), _part_of(f"{name}.v", [[v] for v in vs], page_size, False)]


def device_pools(kvcache, page_size):
    """([DevicePool], whether the pools are the same on every TP rank) of a
    device KV pool, read from its buffers (SGLang's
    resolve_hybrid_device_pool_group serves neither plain MHA nor MLA):
    MHA (K and V), MLA (the latent), DSA (the latent, and the indexer's keys
    a row per page), full + sliding-window MHA (SWAKVPool: the window's
    layers a pool of their own). Anything else is refused."""
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    kind = type(kvcache)
    if getattr(kvcache, "page_size", page_size) != page_size:
        raise LinkerError(f"cxltier linker: KV pool page size {kvcache.page_size} is not the tree's {page_size}")
    if kind is MHATokenToKVPool:
        return [DevicePool("kv", _mha_parts("kv", kvcache, page_size), "kv", list(range(len(kvcache.k_buffer))))], False
    if kind in (MLATokenToKVPool, DSATokenToKVPool):
        layers = list(range(len(kvcache.kv_buffer)))
        pools = [DevicePool("kv", [_part_of("kv", [[t] for t in kvcache.kv_buffer], page_size, False)], "kv", layers)]
        if kind is DSATokenToKVPool:
            indexer = _part_of("indexer", [[t] for t in kvcache.index_k_with_scale_buffer], page_size, True)
            pools.append(DevicePool("indexer", [indexer], "kv", layers))
        return pools, True
    if kind is SWAKVPool and type(kvcache.full_kv_pool) is MHATokenToKVPool and type(kvcache.swa_kv_pool) is MHATokenToKVPool:
        by_kind = {False: [], True: []}
        for gid, (lid, is_swa) in sorted(kvcache.layers_mapping.items(), key=lambda kv: kv[1][0]):
            by_kind[is_swa].append(gid - kvcache.start_layer)
        return [DevicePool("kv", _mha_parts("kv", kvcache.full_kv_pool, page_size), "kv", by_kind[False]),
                DevicePool("swa", _mha_parts("swa", kvcache.swa_kv_pool, page_size), "swa", by_kind[True])], False
    inner = f" of {type(kvcache.full_kv_pool).__name__}" if isinstance(kvcache, SWAKVPool) else ""
    raise LinkerError(f"cxltier linker: the {kind.__name__}{inner} KV pool is not supported (MHA, MLA, DSA and "
                      "SWAKVPool of MHA pools are); use the HiCache backend (cxltier.sglang.hicache) for this model")


def _rank(params):
    """(tp rank, tp size) in the group the KV is sharded over."""
    group = getattr(params, "attn_tp_cache_group", None) or getattr(params, "tp_cache_group", None)
    if group is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(group=group), torch.distributed.get_world_size(group=group)
    return 0, 1


_KEYS = ("devices", "index", "key", "blocks", "block_bytes", "verify", "kv_dtype", "engine", "share_ranks", "kv_events")


def _settings(extra, model):
    """linker_extra_config, checked: an unknown key or a malformed number
    is refused by name rather than ignored."""
    unknown = sorted(set(extra) - set(_KEYS))
    if unknown:
        raise LinkerError(f"cxltier linker: unknown linker_extra_config keys {unknown} (known: {', '.join(_KEYS)})")

    def number(name, default):
        try:
            n = int(extra.get(name, default))
        except (TypeError, ValueError):
            raise LinkerError(f"cxltier linker: linker_extra_config {name!r} is {extra[name]!r}, not a number") from None
        if n < 0:
            raise LinkerError(f"cxltier linker: linker_extra_config {name!r} is negative ({n})")
        return n

    engine = extra.get("engine")
    if engine is not None and not isinstance(engine, str):
        raise LinkerError(f"cxltier linker: linker_extra_config 'engine' is {engine!r}, not a name")
    return {
        "devices": extra.get("devices") or os.environ.get("CXLTIER_DEVICES") or "shm:cxltier",
        "index": extra.get("index") or model,
        "key": extra.get("key") or os.environ.get("CXLTIER_PREFIX_KEY") or None,
        "blocks": number("blocks", 0),
        "block_bytes": number("block_bytes", 0),
        "verify": bool(number("verify", 1)),
        "share_ranks": bool(number("share_ranks", 1)),
        "kv_events": bool(number("kv_events", 0)),
        "engine": engine,
    }


def _pages(indices, page_size):
    """The page numbers of slots that SGLang's paged allocator gives (whole,
    aligned pages), checked."""
    slots = indices.detach().to("cpu", torch.int64).flatten()
    if slots.numel() % page_size:
        raise LinkerError(f"cxltier linker: {slots.numel()} slots are not whole pages of {page_size}")
    pages = slots.reshape(-1, page_size)
    starts = pages[:, 0]
    if torch.any(starts % page_size) or not torch.equal(pages, starts[:, None] + torch.arange(page_size)):
        raise LinkerError("cxltier linker: slots are not aligned contiguous pages")
    return (starts // page_size).tolist()


class _Base:
    """The linker without SGLang's base class (CxlTierLinker adds it)."""

    def __init__(self, server_args, params, *, components, extra_config=None, forward_stream=None):
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

        if set(components) - {ComponentType.FULL, ComponentType.SWA}:
            names = sorted(c.name for c in components)
            raise LinkerError(f"cxltier linker: tree components {names}: FULL and SWA attention are supported, "
                              "Mamba state is not; use the HiCache backend for this model")
        self.forward_stream = forward_stream
        self.page_size = params.page_size
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()
        pools, replicated = device_pools(kvcache, self.page_size)
        if (ComponentType.SWA in components) != any(p.source == "swa" for p in pools):
            raise LinkerError(f"cxltier linker: tree components {sorted(c.name for c in components)} do not match "
                              f"the {type(kvcache).__name__} KV pool")
        extra = dict(extra_config or {})
        model = str(getattr(server_args, "model_path", None) or "default").replace("/", "-")
        cfg = _settings(extra, model)
        # share_ranks 0 keys rank-replicated pools per rank too (one copy
        # per rank, as stores without a shared tier keep them).
        self.rank_replicated = replicated and cfg["share_ranks"]
        names = {"kv": PoolName.KV, "indexer": PoolName.INDEXER, "swa": PoolName.SWA}
        self.pools = {names[p.name]: p for p in pools}  # what SGLang's wrapper reads: SWA pages are ours to restore
        self.on_device = pools[0].parts[0].buffers[0].is_cuda
        self.num_layers = 1 + max(layer for p in pools for layer in p.layers)
        self.tp_rank, self.tp_size = _rank(params)
        self.key_suffix = pagekeys.key_suffix(model, self.tp_rank, self.tp_size, params.pp_rank, params.pp_size,
                                              params.attn_cp_rank, params.attn_cp_size, self.rank_replicated)
        engine = cfg["engine"] or ("cuda" if self.on_device else "cpu")
        self.tier = Tier(cfg["devices"], name=f"sglang-linker-{os.getpid()}")
        try:
            self._open_pools(pools, cfg, engine, _kv_dtype(extra, kvcache))
        except BaseException:
            self.tier.close()
            raise
        self._masks = {src: [m for p, _, m in self._kvpools if p.source == src] for src in ("kv", "swa")}
        # KV events (cxltier.cluster.kvevents): each offloaded page's tokens, which
        # the plugin's wrap of SGLang's _offload_node hands over with it.
        self._recorder = None
        if cfg["kv_events"]:
            from ..tokens import TokenRecorder

            self._recorder = TokenRecorder(self.tier, cfg["index"], cfg["key"],
                                           max(64, self.index.stats()["blocks"] // max(1, len(self._kvpools))),
                                           self.page_size)
        self._node_tokens = threading.local()  # set by the wrap for the offload call it makes
        self._lookup_tokens = threading.local()  # set by the wrap of match for the lookup it makes
        # Which parts copy a layer of theirs at each model layer, in order.
        self._schedule = [[i for i, (p, _, _) in enumerate(self._kvpools) if layer in p.layers]
                          for layer in range(self.num_layers)]
        self.layer_done_counter = LayerWiseLoadCounter(self.num_layers)
        self.stats = {"lookup": 0, "lookup_pages": 0, "load_batches": 0, "load_pages": 0, "offloads": 0,
                      "offload_pages": 0, "entries_written": 0, "entries_present": 0, "load_failures": 0, "offload_failures": 0}
        self._pending = {}  # rid -> {source: (keys, pages)}, until the next start
        self._loads = queue.Queue()
        self._offloads = queue.Queue()
        self._results = queue.Queue()
        self._threads = [threading.Thread(target=self._run, args=(q, f), daemon=True, name=f"cxltier-linker-{n}-tp{self.tp_rank}")
                         for n, q, f in (("load", self._loads, self._load_batch), ("offload", self._offloads, self._offload_one))]
        for t in self._threads:
            t.start()
        logger.info("cxltier linker on %s, index %r: %s pool, %d layers, %s engine, rank %d/%d%s",
                    cfg["devices"], cfg["index"], type(kvcache).__name__, self.num_layers, engine,
                    self.tp_rank, self.tp_size, " (one copy for all ranks)" if self.rank_replicated else "")

    def _open_pools(self, pools, cfg, engine, dtype):
        """The index (made when missing and blocks are given) and a KVPool
        with its key mask for each part of each pool."""
        page_bytes = max(part.chunk * len(part.buffers) for p in pools for part in p.parts)
        # 64 bytes past the page: room for the trailer a page carries to and
        # from the cluster (cxltier.cluster.uplink), so it moves in one transfer.
        self.index = self.tier.prefix(cfg["index"], cfg["blocks"], cfg["block_bytes"] or page_bytes + 64, cfg["key"])
        have = self.index.stats()["block_bytes"]
        if have < page_bytes:
            raise LinkerError(f"cxltier linker: index {cfg['index']!r} has {have}-byte blocks; a page of this "
                              f"model is {page_bytes} bytes: create an index with --block-bytes {page_bytes} or more")
        self._kvpools = []  # (DevicePool, KVPool, mask) for each part
        for p in pools:
            for j, part in enumerate(p.parts):
                buffers = [(t.data_ptr(), (t.shape[0] - 1) * t.stride(0) * t.element_size() + t[0].numel() * t.element_size())
                           for t in part.buffers]
                pool = KVPool(self.index, buffers, part.per_layer, part.chunk, part.stride, engine=engine,
                              device=self.on_device, verify=cfg["verify"])
                mask = pagekeys.pool_mask(self.key_suffix, p.name, j, self.page_size,
                                          pagekeys.layout(len(p.layers), part.per_layer, part.chunk, dtype))
                self._kvpools.append((p, pool, mask))

    # SGLang passes a KV transfer (the full-attention pages) and, for SWA
    # models, an SWA transfer (the trailing window's pages); the DSA
    # indexer rides the KV pages, as SGLang's own pool group sources it.

    @staticmethod
    def _by_source(transfers):
        out = {}
        for t in transfers:
            if t.name == PoolName.KV:
                out["kv"] = t
            elif t.name == PoolName.SWA:
                out["swa"] = t
            else:
                raise LinkerError(f"cxltier linker: a transfer of pool {t.name}, which this linker does not serve")
        return out

    def lookup(self, rid, transfers):
        """Every restorable length: full-attention pages present from the
        start and, for SWA models, the window of SWA pages ending there
        (present only where a node ended when it was offloaded)."""
        by = self._by_source(transfers)
        kv = by.get("kv")
        if kv is None or not kv.keys:
            return []
        keys = list(kv.keys)
        n = self.index.exists_pages(keys, self._masks["kv"])
        looked_up = getattr(self._lookup_tokens, "value", None)
        if n and looked_up is not None and self._recorder is not None:
            # Hits may be pages the node's uplink just brought from the
            # cluster, which this server never offloaded: recorded now, they
            # are announced too (a record already there is left as it is).
            tokens, prefix = looked_up
            self._record(keys[:n], tokens[: n * self.page_size], prefix)
        lengths = list(range(1, n + 1))
        swa = by.get("swa")
        if swa is not None and n:
            window = max(1, len(swa.keys or ()))
            have = [self.index.exists_pages([k], self._masks["swa"]) == 1 for k in keys[:n]]
            lengths = [m for m in lengths if all(have[max(0, m - window) : m])]
        self.stats["lookup"] += 1
        self.stats["lookup_pages"] += lengths[-1] if lengths else 0
        return lengths

    def _pages_of(self, t):
        pages = _pages(t.device_indices, self.page_size)
        if len(pages) != len(t.keys):
            raise LinkerError(f"cxltier linker: pool {t.name}: {len(t.keys)} keys for {len(pages)} pages")
        return list(t.keys), pages

    def _planned(self, transfers):
        """{source: (keys, pages)} of the transfers that carry pages."""
        return {src: self._pages_of(t) for src, t in self._by_source(transfers).items()
                if t.keys and t.device_indices is not None}

    def load(self, rid, transfers):
        plan = self._planned(transfers)
        if "kv" not in plan:
            return False
        if rid in self._pending:
            raise RuntimeError(f"cxltier linker: a load for {rid} is already queued")
        self._pending[rid] = plan
        return True

    def cancel_queued_load(self, rid):
        return self._pending.pop(rid, None) is not None

    def start_layer_wise_loading(self):
        if not self._pending:
            return -1
        pending, self._pending = self._pending, {}
        batch = {}
        for plan in pending.values():
            for src, (keys, pages) in plan.items():
                k, p = batch.setdefault(src, ([], []))
                k.extend(keys)
                p.extend(pages)
        index = self.layer_done_counter.update_producer()
        self._loads.put((index, batch, self._ready_events(offload=False)))
        self.stats["load_batches"] += 1
        self.stats["load_pages"] += len(batch["kv"][1])
        return index

    def finish_layer_wise_loading(self, counter_index):
        return self.layer_done_counter.finish(counter_index)

    def offload(self, transfers, session_id=None):
        plan = self._planned(transfers)
        if "kv" not in plan:
            return False
        tokens = getattr(self._node_tokens, "value", None)
        self._node_tokens.value = None
        if tokens is not None and self._recorder is not None:
            plan["tokens"] = tokens
        self._offloads.put((plan, self._ready_events(offload=True)))
        return True

    def num_completed_offloads(self):
        return self._results.qsize()

    def pop_completed_offload(self):
        return self._results.get_nowait()

    def reset(self):
        self._pending.clear()
        self._loads.join()
        self._offloads.join()
        while True:
            try:
                self._results.get_nowait()
            except queue.Empty:
                break
        self.layer_done_counter.reset()

    def close(self):
        if self.tier is None:
            return
        self.reset()
        for q in (self._loads, self._offloads):
            q.put(None)
        for t in self._threads:
            t.join()
        logger.info("cxltier linker stats: %s", self.stats)
        for _, pool, _ in self._kvpools:
            pool.close()
        self.tier.close()
        self.tier = None

    # Worker threads.

    def _ready_events(self, offload):
        """What a thread waits for before it touches device pages: the
        forward's writes (offload), the slots' allocation (load). Nothing
        on the CPU, where the scheduler's own thread wrote them."""
        if not self.on_device:
            return []
        if offload:
            return self.record_offload_ready()
        event = torch.cuda.Event()
        event.record()
        return [event]

    @staticmethod
    def _run(q, work):
        while True:
            task = q.get()
            try:
                if task is None:
                    return
                work(*task)
            finally:
                q.task_done()

    def _load_batch(self, index, batch, events):
        loads = {}  # part index -> KVLoad
        try:
            for e in events:
                e.synchronize()
            for i, (p, pool, mask) in enumerate(self._kvpools):
                if p.source in batch:
                    keys, pages = batch[p.source]
                    loads[i] = (pool.load(part_keys(keys, [mask]), pages), iter(range(len(p.layers))))
            for layer, parts in enumerate(self._schedule):
                for i in parts:
                    if i in loads:
                        ld, local = loads[i]
                        ld.layer(next(local))
                self.layer_done_counter.complete(index, layer)
        except BaseException as e:  # a failed load never raises into the forward: finish reports it
            self.stats["load_failures"] += 1
            logger.error("cxltier linker: load of %d pages failed: %s", len(batch["kv"][0]), e)
            self.layer_done_counter.fail(index, e)
        finally:
            for ld, _ in loads.values():
                try:
                    ld.close()
                except CxlTierError:
                    pass  # reported by the layer that failed

    def _record(self, keys, tokens, prefix_keys):
        """Token records of pages just stored (a failure is logged: the
        pages are stored, only not announced)."""
        from .hicache import _raw_keys

        try:
            entry_keys = part_keys(list(keys), self._masks["kv"][:1]).keys()
            parent = _raw_keys(list(prefix_keys[-1:]))[0] if prefix_keys else None
            self._recorder.record(entry_keys, _raw_keys(list(keys)), parent, tokens, prefix_keys is not None)
        except Exception:
            logger.exception("cxltier linker: recording the tokens of %d offloaded pages failed", len(keys))

    def _offload_one(self, plan, events):
        ok = False
        try:
            for e in events:
                e.synchronize()
            ok = True
            for p, pool, mask in self._kvpools:
                if p.source not in plan:
                    continue
                keys, pages = plan[p.source]
                statuses = pool.store(part_keys(keys, [mask]), pages)
                ok = ok and "no_space" not in statuses
                self.stats["entries_written"] += statuses.count("stored")
                self.stats["entries_present"] += statuses.count("present")
            self.stats["offloads"] += 1
            self.stats["offload_pages"] += len(plan["kv"][0])
            if ok and "tokens" in plan:
                self._record(plan["kv"][0], *plan["tokens"])
        except BaseException as e:
            ok = False
            logger.error("cxltier linker: offload of %d pages failed: %s", len(plan["kv"][0]), e)
        if not ok:
            self.stats["offload_failures"] += 1
        self._results.put(ok)


_inserting = threading.local()  # the key of the radix cache insert this thread runs


def install_token_records():
    """Lets a cxltier linker with "kv_events" record the tokens of the pages
    it offloads (cxltier.cluster.kvevents). SGLang's write-through offload
    (UnifiedCacheLinkerWrapper._offload_node) names only a node, and its
    tree core (the Rust one included) gives a node's page keys but not its
    tokens, so the wrap of UnifiedRadixCache.insert keeps the inserted key,
    and the wrap of _offload_node takes the node's slice of it (after its
    ancestors' pages), recorded only when SGLang's page keys of that slice
    are the node's own. The wrap of UnifiedCacheLinkerWrapper.match hands
    the looked-up tail's tokens to the lookup, which records its hits: they
    may be pages the node's uplink just brought from the cluster. The
    cxltier plugin calls it; True when installed."""
    if UnifiedCacheLinker is None:
        return False
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinkerWrapper
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    offload, insert = UnifiedCacheLinkerWrapper._offload_node, UnifiedRadixCache.insert
    match = UnifiedCacheLinkerWrapper.match
    if getattr(offload, "_cxltier_token_records", False):
        return False

    @functools.wraps(insert)
    def insert_keeping_key(self, params, *args, **kwargs):
        _inserting.key = getattr(params, "key", None)
        try:
            return insert(self, params, *args, **kwargs)
        finally:
            _inserting.key = None

    @functools.wraps(offload)
    def offload_with_tokens(self, node_id, transfers):
        linker = getattr(self, "cache_linker", None)
        if getattr(linker, "_recorder", None) is not None:
            try:  # an offload must never fail for its record
                linker._node_tokens.value = _node_tokens(self.cache, node_id, transfers, linker.page_size)
            except Exception:
                logger.exception("cxltier linker: the tokens of node %s were not found; its pages go unannounced", node_id)
        try:
            return offload(self, node_id, transfers)
        finally:
            if hasattr(linker, "_node_tokens"):
                linker._node_tokens.value = None

    @functools.wraps(match)
    def match_with_tokens(self, key, req, result):
        linker = getattr(self, "cache_linker", None)
        if getattr(linker, "_recorder", None) is not None:
            try:  # a match must never fail for its record
                linker._lookup_tokens.value = _tail_tokens(self, key, result, linker.page_size)
            except Exception:
                logger.exception("cxltier linker: the tokens of a lookup were not found; its hits go unannounced")
        try:
            return match(self, key, req, result)
        finally:
            if hasattr(linker, "_lookup_tokens"):
                linker._lookup_tokens.value = None

    offload_with_tokens._cxltier_token_records = True
    UnifiedCacheLinkerWrapper._offload_node = offload_with_tokens
    UnifiedCacheLinkerWrapper.match = match_with_tokens
    UnifiedRadixCache.insert = insert_keeping_key
    return True


def _tail_tokens(wrapper, key, result, page_size):
    """(tokens, prefix keys) of the pages a match looks up: the tail past
    what the device holds, as SGLang's wrapper hashes it (its _tail_hashes),
    or None when they cannot be told."""
    key, _ = key.maybe_to_bigram_view(wrapper.cache.tree_core.is_eagle)
    start = result.device_prefix_len
    prefix = []
    if start > 0:
        last = wrapper.cache.get_last_hash_value(result.last_device_node)
        if last is None:
            return None
        prefix = [last]
    tokens = [int(t) for t in list(key.token_ids)[start:]]
    return tokens[: len(tokens) // page_size * page_size], prefix


def _node_tokens(cache, node_id, transfers, page_size):
    """(tokens, prefix keys) of the node an offload stores, or None when the
    insert this thread runs does not hold them."""
    from ..prefix import page_keys

    key = getattr(_inserting, "key", None)
    kv = next((t for t in transfers if t.name == PoolName.KV and t.keys), None)
    if key is None or kv is None:
        return None
    prefix = list(cache.tree_core.get_prefix_hash_values(node_id))
    start, n = len(prefix) * page_size, len(kv.keys)
    tokens = [int(t) for t in list(key.token_ids)[start : start + n * page_size]]
    if len(tokens) != n * page_size or page_keys(tokens, page_size, prefix[-1] if prefix else None) != list(kv.keys):
        return None
    return tokens, prefix


if UnifiedCacheLinker is not None:

    class CxlTierLinker(_Base, UnifiedCacheLinker):
        """SGLang's UnifiedCacheLinker on a cxltier prefix index (see the
        module comment)."""
