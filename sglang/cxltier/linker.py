"""SGLang's unified-cache external linker on a cxltier prefix index: KV
pages move straight between SGLang's device pools and the tier, with no
host staging pool, and one copy of an MLA or DSA page serves every TP rank.

    --enable-unified-cache-external-linker \\
    --unified-cache-external-linker-backend dynamic \\
    --unified-cache-external-linker-config '{"linker": "CxlTierLinker",
        "linker_module_path": "cxltier.linker",
        "linker_extra_config": {"devices": "shm:cxltier", "index": "dsv32"}}'

linker_extra_config takes the HiCache backend's keys (devices, index, key,
blocks, block_bytes, verify, kv_dtype) and engine ("cpu", "cuda"; default:
the pools' device). With blocks and no block_bytes a missing index is made
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

import logging
import os
import queue
import threading
from dataclasses import dataclass

import torch

from ._native import CxlTierError
from .hicache import _kv_dtype
from .kvpool import KVPool
from .prefix import part_keys, part_mask
from .tier import Tier

logger = logging.getLogger(__name__)

try:  # SGLang is only there on serving machines.
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName
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


def device_pools(kvcache, page_size):
    """{pool name: [PoolPart]} of a device KV pool, read from its buffers
    (SGLang's resolve_hybrid_device_pool_group serves neither plain MHA nor
    plain MLA): MHA (K and V), MLA (the latent), DSA (latent, and the
    indexer's keys, one row per page). Anything else is refused."""
    from sglang.srt.mem_cache.memory_pool import DSATokenToKVPool, MHATokenToKVPool, MLATokenToKVPool

    kind = type(kvcache)
    if getattr(kvcache, "page_size", page_size) != page_size:
        raise LinkerError(f"cxltier linker: KV pool page size {kvcache.page_size} is not the tree's {page_size}")
    if kind is MHATokenToKVPool:
        if getattr(kvcache, "k_scale_buffer", None) is not None or getattr(kvcache, "native_k_scale_buffer", None) is not None:
            raise LinkerError("cxltier linker: scaled (fp4/mxfp8) MHA KV caches are not supported")
        ks, vs = list(kvcache.k_buffer), list(kvcache.v_buffer)
        if [(k.shape[1:], k.dtype) for k in ks] == [(v.shape[1:], v.dtype) for v in vs]:
            return {"kv": [_part_of("kv", [[k, v] for k, v in zip(ks, vs)], page_size, False)]}, False
        return {"kv": [_part_of("kv.k", [[k] for k in ks], page_size, False),
                       _part_of("kv.v", [[v] for v in vs], page_size, False)]}, False
    if kind is MLATokenToKVPool:
        return {"kv": [_part_of("kv", [[t] for t in kvcache.kv_buffer], page_size, False)]}, True
    if kind is DSATokenToKVPool:
        return {"kv": [_part_of("kv", [[t] for t in kvcache.kv_buffer], page_size, False)],
                "indexer": [_part_of("indexer", [[t] for t in kvcache.index_k_with_scale_buffer], page_size, True)]}, True
    raise LinkerError(f"cxltier linker: the {kind.__name__} KV pool is not supported (MHA, MLA and DSA pools are); "
                      "use the HiCache backend (cxltier.hicache) for this model")


def _rank(params):
    """(tp rank, tp size) in the group the KV is sharded over."""
    group = getattr(params, "attn_tp_cache_group", None) or getattr(params, "tp_cache_group", None)
    if group is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(group=group), torch.distributed.get_world_size(group=group)
    return 0, 1


def _settings(extra, model):
    return {
        "devices": extra.get("devices") or os.environ.get("CXLTIER_DEVICES") or "shm:cxltier",
        "index": extra.get("index") or model,
        "key": extra.get("key") or os.environ.get("CXLTIER_PREFIX_KEY") or None,
        "blocks": int(extra.get("blocks", 0)),
        "block_bytes": int(extra.get("block_bytes", 0)),
        "verify": bool(int(extra.get("verify", 1))),
        "engine": extra.get("engine"),
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

        if set(components) != {ComponentType.FULL}:
            names = sorted(c.name for c in components)
            raise LinkerError(f"cxltier linker: tree components {names}: only FULL attention is supported "
                              "(SWA and Mamba state are not); use the HiCache backend for hybrid models")
        self.forward_stream = forward_stream
        self.page_size = params.page_size
        kvcache = params.token_to_kv_pool_allocator.get_kvcache()
        parts, self.rank_replicated = device_pools(kvcache, self.page_size)
        self.pools = {PoolName.KV if n == "kv" else PoolName.INDEXER: p for n, p in parts.items()}
        first = parts["kv"][0].buffers[0]
        self.on_device = first.is_cuda
        self.num_layers = len(parts["kv"][0].buffers) // parts["kv"][0].per_layer
        self.tp_rank, self.tp_size = _rank(params)
        model = str(getattr(server_args, "model_path", None) or "default").replace("/", "-")
        shard = f"_pp{params.pp_rank}_{params.pp_size}_cp{params.attn_cp_rank}_{params.attn_cp_size}"
        self.key_suffix = model + shard if self.rank_replicated else f"{model}_tp{self.tp_rank}_{self.tp_size}{shard}"
        extra = dict(extra_config or {})
        cfg = _settings(extra, model)
        dtype = _kv_dtype(extra, kvcache)
        engine = cfg["engine"] or ("cuda" if self.on_device else "cpu")
        page_bytes = max(p.chunk * len(p.buffers) for ps in parts.values() for p in ps)

        self.tier = Tier(cfg["devices"], name=f"sglang-linker-{os.getpid()}")
        self._kvpools = []  # (pool name, KVPool, mask)
        try:
            self.index = self.tier.prefix(cfg["index"], cfg["blocks"], cfg["block_bytes"] or page_bytes, cfg["key"])
            have = self.index.stats()["block_bytes"]
            if have < page_bytes:
                raise LinkerError(f"cxltier linker: index {cfg['index']!r} has {have}-byte blocks; a page of this "
                                  f"model is {page_bytes} bytes: create an index with --block-bytes {page_bytes} or more")
            for name, ps in parts.items():
                for j, p in enumerate(ps):
                    buffers = [(t.data_ptr(), (t.shape[0] - 1) * t.stride(0) * t.element_size() + t[0].numel() * t.element_size())
                               for t in p.buffers]
                    pool = KVPool(self.index, buffers, p.per_layer, p.chunk, p.stride, engine=engine,
                                  device=self.on_device, verify=cfg["verify"])
                    tag = f"{self.key_suffix}/linker/v1/{name}.{j}/p{self.page_size}/L{self.num_layers}x{p.per_layer}x{p.chunk}/{dtype}"
                    self._kvpools.append((name, pool, part_mask(tag)))
        except BaseException:
            self.tier.close()
            raise
        self._masks = [m for _, _, m in self._kvpools]
        self.layer_done_counter = LayerWiseLoadCounter(self.num_layers)
        self.stats = {"lookup": 0, "lookup_pages": 0, "load_batches": 0, "load_pages": 0, "offloads": 0,
                      "offload_pages": 0, "entries_written": 0, "entries_present": 0, "load_failures": 0, "offload_failures": 0}
        self._pending = {}  # rid -> (keys, pages), until the next start
        self._loads = queue.Queue()
        self._offloads = queue.Queue()
        self._results = queue.Queue()
        self._threads = [threading.Thread(target=self._run, args=(q, f), daemon=True, name=f"cxltier-linker-{n}-tp{self.tp_rank}")
                         for n, q, f in (("load", self._loads, self._load_batch), ("offload", self._offloads, self._offload_one))]
        for t in self._threads:
            t.start()
        logger.info("cxltier linker on %s, index %r: %s pool, %d layers, %d-byte pages, %s engine, rank %d/%d%s",
                    cfg["devices"], cfg["index"], type(kvcache).__name__, self.num_layers, page_bytes, engine,
                    self.tp_rank, self.tp_size, " (one copy for all ranks)" if self.rank_replicated else "")

    # The transfers SGLang passes name the KV pool; the DSA indexer rides
    # its pages (as SGLang's own pool group sources it from KV).

    @staticmethod
    def _kv(transfers):
        for t in transfers:
            if t.name == PoolName.KV:
                return t
        return None

    def lookup(self, rid, transfers):
        kv = self._kv(transfers)
        if kv is None or not kv.keys or any(t.hit_policy != PoolHitPolicy.ALL_PAGES for t in transfers):
            return []
        n = self.index.exists_pages(list(kv.keys), self._masks)
        self.stats["lookup"] += 1
        self.stats["lookup_pages"] += n
        return list(range(1, n + 1))

    def load(self, rid, transfers):
        kv = self._kv(transfers)
        if kv is None or not kv.keys or kv.device_indices is None:
            return False
        if rid in self._pending:
            raise RuntimeError(f"cxltier linker: a load for {rid} is already queued")
        pages = _pages(kv.device_indices, self.page_size)
        if len(pages) != len(kv.keys):
            raise LinkerError(f"cxltier linker: {len(kv.keys)} keys for {len(pages)} pages")
        self._pending[rid] = (list(kv.keys), pages)
        return True

    def cancel_queued_load(self, rid):
        return self._pending.pop(rid, None) is not None

    def start_layer_wise_loading(self):
        if not self._pending:
            return -1
        pending, self._pending = self._pending, {}
        keys = [k for ks, _ in pending.values() for k in ks]
        pages = [p for _, ps in pending.values() for p in ps]
        index = self.layer_done_counter.update_producer()
        self._loads.put((index, keys, pages, self._ready_events(offload=False)))
        self.stats["load_batches"] += 1
        self.stats["load_pages"] += len(pages)
        return index

    def finish_layer_wise_loading(self, counter_index):
        return self.layer_done_counter.finish(counter_index)

    def offload(self, transfers, session_id=None):
        kv = self._kv(transfers)
        if kv is None or not kv.keys or kv.device_indices is None:
            return False
        pages = _pages(kv.device_indices, self.page_size)
        if len(pages) != len(kv.keys):
            raise LinkerError(f"cxltier linker: {len(kv.keys)} keys for {len(pages)} pages")
        self._offloads.put((list(kv.keys), pages, self._ready_events(offload=True)))
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

    def _load_batch(self, index, keys, pages, events):
        loads = []
        try:
            for e in events:
                e.synchronize()
            for _, pool, mask in self._kvpools:
                loads.append(pool.load(part_keys(keys, [mask]), pages))
            for layer in range(self.num_layers):
                for ld in loads:
                    ld.layer(layer)
                self.layer_done_counter.complete(index, layer)
        except BaseException as e:  # a failed load never raises into the forward: finish reports it
            self.stats["load_failures"] += 1
            logger.error("cxltier linker: load of %d pages failed: %s", len(keys), e)
            self.layer_done_counter.fail(index, e)
        finally:
            for ld in loads:
                try:
                    ld.close()
                except CxlTierError:
                    pass  # reported by the layer that failed

    def _offload_one(self, keys, pages, events):
        ok = False
        try:
            for e in events:
                e.synchronize()
            ok = True
            for _, pool, mask in self._kvpools:
                statuses = pool.store(part_keys(keys, [mask]), pages)
                ok = ok and "no_space" not in statuses
                self.stats["entries_written"] += statuses.count("stored")
                self.stats["entries_present"] += statuses.count("present")
            self.stats["offloads"] += 1
            self.stats["offload_pages"] += len(keys)
        except BaseException as e:
            ok = False
            logger.error("cxltier linker: offload of %d pages failed: %s", len(keys), e)
        if not ok:
            self.stats["offload_failures"] += 1
        self._results.put(ok)


if UnifiedCacheLinker is not None:

    class CxlTierLinker(_Base, UnifiedCacheLinker):
        """SGLang's UnifiedCacheLinker on a cxltier prefix index (see the
        module comment)."""
