"""SGLang HiCache L3 storage on a cxltier prefix index.

Load it in SGLang with the dynamic backend (no fork, no plugin needed):

    --enable-hierarchical-cache --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name": "cxltier",
        "module_path": "cxltier.sglang.hicache", "class_name": "CxlTierStorage",
        "interface_v1": 1, "devices": "shm:cxltier", "index": "llama-3-8b"}'

extra_config keys: devices (default $CXLTIER_DEVICES or shm:cxltier),
index (default: the model name), key (the index's tenant key, default
$CXLTIER_PREFIX_KEY; prefer the environment, the config is logged), and,
to create the index when it is missing, blocks and block_bytes (≥ the
bytes of one page's K or V), and verify (default 1: every page read is
checked against its checksum; 0 reads at plain-copy speed and trusts the
tier), and kv_dtype (default: the server's --kv-cache-dtype, or the host
pool's dtype when that is "auto"), and kv_events (default 0; 1 records the
tokens of each page stored, for the node's KV event stream: cxltier.cluster.kvevents,
with the plugin loaded and "hicache_storage_pass_prefix_keys": true).
"interface_v1": 1 makes SGLang move pages
zero-copy (batch_get_v1 / batch_set_v1); without it SGLang copies each page
through a flat tensor (batch_get / batch_set). Both store the same bytes
under the same keys, so a page written one way is read the other.

Each page is stored as one entry per part (K and V for MHA, one for MLA),
keyed by SGLang's page hash XOR a mask naming the model, the rank (MHA
pages hold the rank's heads; MLA pages are the same on every rank and carry
none), the byte order of the host pool's layout, the KV dtype (an fp8_e5m2
server never loads an fp8_e4m3 server's pages) and the part
(cxltier.prefix.part_keys; prefix.PartKey in Go), so every worker, process
and host that maps the tier shares them. A part's payload is its pieces in
the host pool in layer order: a layer-first pool hands one piece per layer,
and they move without a staging copy. Hybrid models (DSA indexer, SWA,
Mamba) also store their extra pools' pages, through the v2 calls.
"""

import functools
import logging
import os

from . import pagekeys
from .._native import CxlTierError
from ..tokens import TokenRecorder
from ..prefix import KEY_BYTES, part_keys, part_mask
from ..tier import Tier

logger = logging.getLogger(__name__)

# How each host-pool layout orders the bytes of one part of a page
# (L layer, T token, H head, D dim), from SGLang's get_page_buffer_meta and
# get_data_page. Layouts of one order share entries; a layout missing here
# is refused at setup rather than stored under keys another layout reads.
_BYTE_ORDER = {
    "mha": {"layer_first": "LTHD", "page_first_direct": "LTHD", "page_first": "TLHD", "page_head": "HTLD"},
    "mla": {"layer_first": "LTD", "page_first_direct": "LTD", "page_first": "TLD"},
}


class LayoutError(ValueError):
    """The host pool's layout or sharding is one this backend does not store."""


def _config(storage_config):
    extra = dict(getattr(storage_config, "extra_config", None) or {})
    model = getattr(storage_config, "model_name", None) or "default"
    return {
        "devices": extra.get("devices") or os.environ.get("CXLTIER_DEVICES") or "shm:cxltier",
        "index": extra.get("index") or model.replace("/", "-"),
        "blocks": int(extra.get("blocks", 0)),
        "key": extra.get("key") or os.environ.get("CXLTIER_PREFIX_KEY") or None,
        "block_bytes": int(extra.get("block_bytes", 0)),
        "verify": bool(int(extra.get("verify", 1))),
        "kv_events": bool(int(extra.get("kv_events", 0))),
    }


def _suffixes(storage_config):
    """(rank-replicated suffix, per-rank suffix) of this rank's keys, as
    SGLang's own file backend splits them."""
    get = lambda name, default: getattr(storage_config, name, default)  # noqa: E731
    model = (get("model_name", None) or "default").replace("/", "-")
    shard = ""
    if get("pp_size", 1) > 1:
        shard += f"_pp{get('pp_rank', 0)}_{get('pp_size', 1)}"
    if get("attn_cp_size", 1) > 1:
        shard += f"_cp{get('attn_cp_rank', 0)}_{get('attn_cp_size', 1)}"
    if get("dcp_size", 1) > 1:
        shard += f"_dcp{get('dcp_rank', 0)}_{get('dcp_size', 1)}"
    return f"{model}{shard}", f"{model}_{get('tp_rank', 0)}_{get('tp_size', 1)}{shard}"


def _kv_dtype(extra, pool):
    """The KV cache dtype pages are stored in, part of every page key, so
    that servers of one model with different KV dtypes (fp8_e4m3 and
    fp8_e5m2 pools both hold uint8) never load each other's pages:
    extra_config's "kv_dtype" when given, else the server's
    --kv-cache-dtype (SGLang's published model config) unless "auto", else
    the host pool's dtype."""
    given = extra.get("kv_dtype")
    if given:
        return str(given)
    try:
        from sglang.srt.runtime_context import get_model

        server = str(get_model().kv_cache_dtype)
    except Exception:  # no server published (tools, tests) or another SGLang
        server = "auto"
    return pagekeys.kv_dtype(server, getattr(pool, "dtype", "unknown"))


def _address(t):
    """(address, bytes) of a contiguous tensor or an (address, size) pair.
    The caller keeps the tensor alive while the address is in use."""
    if isinstance(t, tuple):
        return t
    if not hasattr(t, "data_ptr"):
        raise TypeError(f"cxltier: a page or object target is a tensor or an (address, size) pair, not {type(t).__name__}")
    if not t.is_contiguous():
        raise ValueError("cxltier: a page tensor must be contiguous")
    return t.data_ptr(), t.numel() * t.element_size()


def _by_part(ptrs, pages, parts):
    """Each page's buffers regrouped part by part: an MHA pool hands K, V,
    K, V, ... (a pair per layer in a layer-first pool)."""
    if parts == 1:
        return list(ptrs)
    n = len(ptrs) // pages
    out = []
    for i in range(pages):
        page = ptrs[i * n : (i + 1) * n]
        for p in range(parts):
            out.extend(page[p::parts])
    return out


class HiCacheAdapter:
    """The HiCache storage contract on a prefix index, independent of SGLang
    (CxlTierStorage mixes it into SGLang's HiCacheStorage)."""

    def _setup(self, storage_config, mem_pool_host=None):
        if getattr(storage_config, "should_split_heads", False):
            raise LayoutError("cxltier: HiCache storage across TP sizes (tp_lcm_size) is not supported")
        cfg = _config(storage_config)
        self._extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.is_mla = bool(getattr(storage_config, "is_mla_model", False))
        self._shared_suffix, self._rank_suffix = _suffixes(storage_config)
        self.key_suffix = self._shared_suffix if self.is_mla else self._rank_suffix
        self._parts = ("k",) if self.is_mla else ("k", "v")
        self._object_mask = part_mask(f"{self.key_suffix}/object")
        self._kv_masks = None
        self._pool_masks = {}
        self.registered_pools = {}
        self.tier = Tier(cfg["devices"], name=f"sglang-{os.getpid()}")
        self._index_name, self._index_key, self._kv_events = cfg["index"], cfg["key"], cfg["kv_events"]
        self._recorder = None
        self._warned_parent = False
        try:
            self.index = self.tier.prefix(cfg["index"], cfg["blocks"], cfg["block_bytes"], cfg["key"])
            self.index.verify_reads(cfg["verify"])
            if mem_pool_host is not None:
                self.register_mem_pool_host(mem_pool_host)
        except BaseException:
            self.tier.close()
            raise
        logger.info("cxltier: HiCache storage on %s, index %r", cfg["devices"], cfg["index"])

    def register_mem_pool_host(self, mem_pool_host):
        """The KV host pool whose pages this backend moves (SGLang calls it
        at attach). A layout the backend cannot store is refused here."""
        kind = "mla" if self.is_mla else "mha"
        layout = getattr(mem_pool_host, "layout", None)
        order = _BYTE_ORDER[kind].get(layout)
        if order is None:
            raise LayoutError(
                f"cxltier: HiCache host pool layout {layout!r} is not supported for {kind.upper()} models; "
                f"use --hicache-mem-layout {' or '.join(sorted(_BYTE_ORDER[kind]))}"
            )
        self.mem_pool_host = mem_pool_host
        self.kv_dtype = _kv_dtype(self._extra, mem_pool_host)
        self._kv_masks = [part_mask(f"{self.key_suffix}/kv/{order}/{self.kv_dtype}/{p}") for p in self._parts]

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """An extra pool of a hybrid model (indexer, SWA, Mamba state)."""
        self.registered_pools[str(host_pool_name)] = host_pool

    def on_host_pools_registered(self):
        pass

    def _pool(self):
        if self._kv_masks is None:
            raise LayoutError("cxltier: no host pool registered (register_mem_pool_host)")
        return self.mem_pool_host

    # KV pages, zero-copy (interface_v1).

    def _page_buffers(self, keys, host_indices):
        """The keys of keys' parts and the pool's buffers of each part, part
        by part: (key block, pieces per part, addresses, sizes)."""
        ptrs, sizes = self._pool().get_page_buffer_meta(host_indices)
        nparts = len(self._parts)
        if len(ptrs) != len(sizes) or len(ptrs) % (len(keys) * nparts):
            raise ValueError(f"cxltier: {len(ptrs)} page buffers for {len(keys)} pages of {nparts} parts")
        per = len(ptrs) // (len(keys) * nparts)
        return (part_keys(keys, self._kv_masks), per, _by_part(ptrs, len(keys), nparts),
                _by_part(sizes, len(keys), nparts))

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        if not keys:
            return []
        block, per, ptrs, sizes = self._page_buffers(keys, host_indices)
        return self._pages_stored(self.index.setv(block, per, ptrs, sizes), len(keys))

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        if not keys:
            return []
        block, per, ptrs, sizes = self._page_buffers(keys, host_indices)
        return self._pages_served(self._getv(block, per, ptrs, sizes), len(keys))

    def batch_exists(self, keys, extra_info=None):
        """How many leading pages are stored, every part of them."""
        if not keys:
            return 0
        self._pool()
        return self.index.exists_pages(keys, self._kv_masks)

    def _pages_stored(self, statuses, pages):
        per = len(statuses) // pages
        return [all(s != "no_space" for s in statuses[i * per : (i + 1) * per]) for i in range(pages)]

    def _pages_served(self, served, pages):
        per = len(self._parts)
        return [i < served // per for i in range(pages)]

    def _getv(self, block, per, ptrs, sizes):
        """getv, but a damaged entry (dropped by the library) ends the prefix
        served instead of failing the batch."""
        try:
            return self.index.getv(block, per, ptrs, sizes)
        except CxlTierError as e:
            logger.warning("cxltier: %s", e)
            return getattr(e, "served", 0)

    # KV pages through flat tensors (the generic path, without interface_v1):
    # a flat page is its parts back to back, so it is split at the part
    # boundaries and stored under the same keys as the v1 path.

    def _flat_buffers(self, keys, pages):
        nparts = len(self._parts)
        ptrs, sizes = [], []
        for t in pages:
            addr, n = _address(t)
            if n % nparts:
                raise ValueError(f"cxltier: a flat page of {n} bytes does not split into {nparts} parts")
            part = n // nparts
            for p in range(nparts):
                ptrs.append(addr + p * part)
                sizes.append(part)
        return part_keys(keys, self._kv_masks), ptrs, sizes

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        """Stores flat pages (SGLang's get_data_page) under page keys."""
        if not keys:
            return True
        self._pool()
        block, ptrs, sizes = self._flat_buffers(keys, values if values is not None else target_locations)
        return all(self._pages_stored(self.index.setv(block, 1, ptrs, sizes), len(keys)))

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Loads flat pages into target_locations (SGLang's dummy flat
        pages); each is returned, or None past the stored prefix."""
        if not keys:
            return []
        self._pool()
        block, ptrs, sizes = self._flat_buffers(keys, target_locations)
        ok = self._pages_served(self._getv(block, 1, ptrs, sizes), len(keys))
        return [t if hit else None for t, hit in zip(target_locations, ok)]

    # Extra pools of hybrid models (the v2 calls): pages move as the pool's
    # flat data pages, keyed per pool; state sharded over TP ranks (all of
    # an MHA model's, and Mamba's always) carries the rank.

    def _pool_masks_for(self, name):
        mask = self._pool_masks.get(name)
        if mask is None:
            pool = self.registered_pools.get(name)
            if pool is None:
                raise LayoutError(f"cxltier: no host pool registered as {name!r}")
            suffix = self._shared_suffix if self.is_mla and name != "mamba" else self._rank_suffix
            dtype = _kv_dtype(self._extra, pool)
            mask = self._pool_masks[name] = [part_mask(f"{suffix}/{name}/{getattr(pool, 'layout', '')}/{dtype}")]
        return mask

    def _transfer_pages(self, t):
        """(pool, key block, each page's first host index) of a transfer."""
        name = str(t.name)
        keys = list(t.keys or [])
        pool = self.registered_pools.get(name)
        masks = self._pool_masks_for(name)
        page_size = getattr(pool, "page_size", 1) or 1
        idx = t.host_indices
        if idx is None or len(idx) != len(keys) * page_size:
            raise ValueError(f"cxltier: pool {name}: {len(keys)} pages need {len(keys) * page_size} host indices, "
                             f"got {0 if idx is None else len(idx)}")
        firsts = [int(i) for i in idx[::page_size].tolist()] if hasattr(idx, "tolist") else list(idx)[::page_size]
        return pool, part_keys(keys, masks), firsts

    def batch_set_v2(self, transfers, extra_info=None):
        out = {}
        for t in transfers:
            try:
                pool, block, firsts = self._transfer_pages(t)
                pages = [pool.get_data_page(i, flat=True).contiguous() for i in firsts]
                ptrs, sizes = zip(*(_address(p) for p in pages)) if pages else ((), ())
                out[str(t.name)] = [s != "no_space" for s in self.index.setv(block, 1, list(ptrs), list(sizes))]
            except Exception:
                logger.exception("cxltier: storing pool %s failed", t.name)
                out[str(t.name)] = [False] * len(t.keys or [])
        return out

    def batch_get_v2(self, transfers, extra_info=None):
        out = {}
        for t in transfers:
            try:
                pool, block, firsts = self._transfer_pages(t)
                pages = [pool.get_dummy_flat_data_page() for _ in firsts]
                ptrs, sizes = zip(*(_address(p) for p in pages)) if pages else ((), ())
                served = self._getv(block, 1, list(ptrs), list(sizes))
                for i in range(served):
                    pool.set_from_flat_data_page(firsts[i], pages[i])
                out[str(t.name)] = [i < served for i in range(len(firsts))]
            except Exception:
                logger.exception("cxltier: loading pool %s failed", t.name)
                out[str(t.name)] = [False] * len(t.keys or [])
        return out

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The usable prefix of keys: KV pages present from the start, cut
        where an extra pool lacks what its hit policy needs (every page, or
        the trailing window ending at the prefix), as SGLang's own backends
        count it."""
        from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolTransferResult

        kv_pages = self.batch_exists(keys)
        hits = {"kv": kv_pages} if kv_pages else {}
        restorable = set(range(1, kv_pages + 1))
        for t in pool_transfers or []:
            if not restorable:
                break
            name = str(t.name)
            have = self._present(part_keys(keys[:kv_pages], self._pool_masks_for(name)))
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = have.index(False) if False in have else kv_pages
                ok = set(range(1, boundary + 1))
            elif t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                window = max(1, len(t.keys) if t.keys else 1)
                ok = {n for n in range(1, kv_pages + 1) if all(have[max(0, n - window) : n])}
                boundary = max(ok, default=0)
            else:
                raise LayoutError(f"cxltier: pool {name}: hit policy {t.hit_policy} is not supported")
            if boundary:
                hits[name] = boundary
            restorable &= ok
        order = sorted(restorable)
        return PoolTransferResult(order[-1] if order else 0, hits, order)

    def _present(self, block):
        """Whether each key of block has an entry."""
        return self.index.has_block(block)

    # Whole objects under any key (not pages): one entry per key. Targets are
    # tensors, buffers, or an address with target_sizes bytes (the form
    # SGLang's own backend tests use).

    def _object_keys(self, keys):
        return part_keys(list(keys), [self._object_mask])

    def _object_buffer(self, value, target_location, target_sizes):
        target = value if value is not None else target_location
        if isinstance(target, int):
            if not isinstance(target_sizes, int) or target_sizes < 0:
                raise ValueError("cxltier: an address target needs its size in target_sizes")
            return target, target_sizes
        return _address(target)

    def exists(self, key):
        return self.index.exists_block(self._object_keys([key])) == 1

    def set(self, key, value=None, target_location=None, target_sizes=None):
        addr, n = self._object_buffer(value, target_location, target_sizes)
        return self.index.setv(self._object_keys([key]), 1, [addr], [n])[0] != "no_space"

    def get(self, key, target_location=None, target_sizes=None):
        """Loads key's object into target_location: returns it (True for an
        address target), or None (False) when the key is absent."""
        addr, n = self._object_buffer(None, target_location, target_sizes)
        ok = self._getv(self._object_keys([key]), 1, [addr], [n]) == 1
        if isinstance(target_location, int):
            return ok
        return target_location if ok else None

    # Token records for KV events (cxltier.cluster.kvevents): the cxltier plugin
    # wraps SGLang's backup of pages to storage, which knows their tokens,
    # and hands them here once the pages are stored.

    def record_page_tokens(self, hashes, token_ids, prefix_keys):
        """Writes a token record beside each page of hashes just backed up
        (token_ids: the operation's tokens from the first of them;
        prefix_keys: the page keys before it, None when the server does
        not pass them). Returns how many were recorded; 0 unless the
        extra_config asks for "kv_events"."""
        if not self._kv_events or not hashes:
            return 0
        pool = self._pool()
        if self._recorder is None:
            blocks = max(64, int(self.index.stats().get("blocks", 0)) // len(self._parts))
            self._recorder = TokenRecorder(self.tier, self._index_name, self._index_key, blocks,
                                           int(getattr(pool, "page_size", 1)))
        tokens = token_ids.tolist() if hasattr(token_ids, "tolist") else [int(t) for t in token_ids]
        hashes = list(hashes)
        known = prefix_keys is not None
        if not known and not self._warned_parent:
            self._warned_parent = True
            logger.warning("cxltier: kv_events without hicache_storage_pass_prefix_keys in the extra_config: "
                           "SGLang does not say which page comes before a backup, so only whole sequences "
                           "from their first page are published")
        parent = _raw_keys(list(prefix_keys[-1:]))[0] if prefix_keys else None
        entry_keys = part_keys(hashes, self._kv_masks[:1]).keys()
        return self._recorder.record(entry_keys, _raw_keys(hashes), parent, tokens, known)

    def get_stats(self):
        return self.index.stats()

    def clear(self):
        return False  # entries are shared with other processes; evicted, never wiped by one client

    def close(self):
        self.tier.close()


def install_token_records():
    """Wraps the two places SGLang's HiCache controllers know the tokens of
    pages in storage, so that a cxltier backend with "kv_events" records
    them (cxltier.cluster.kvevents): the backup of a radix node's pages
    (_page_backup; the hybrid controller's calls it too) and the prefetch
    query (_storage_hit_query, the hybrid controller's its own), whose hits
    may be pages the node's uplink just brought from the cluster. The
    cxltier plugin calls it; True when it installed the wraps."""
    try:
        from sglang.srt.managers.cache_controller import HiCacheController
    except ImportError:  # no SGLang here: nothing to wrap
        return False
    installed = _wrap(HiCacheController, "_page_backup", _after_backup)
    installed |= _wrap(HiCacheController, "_storage_hit_query", _after_hit_query)
    try:
        from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    except ImportError:
        return installed
    if "_storage_hit_query" in vars(HybridCacheController):
        installed |= _wrap(HybridCacheController, "_storage_hit_query", _after_hit_query)
    return installed


def _wrap(cls, name, after):
    """Replaces cls.name with a call of it followed by after(controller,
    operation, before, result); a failure of after is logged, never raised
    into SGLang's storage threads."""
    original = vars(cls)[name]
    if getattr(original, "_cxltier_token_records", False):
        return False

    @functools.wraps(original)
    def wrapped(self, operation):
        before = getattr(operation, "completed_tokens", 0)
        result = original(self, operation)
        record = getattr(getattr(self, "storage_backend", None), "record_page_tokens", None)
        if record is not None:
            try:
                after(self, operation, before, result, record)
            except Exception:
                logger.exception("cxltier: recording the tokens of stored pages failed")
        return result

    wrapped._cxltier_token_records = True
    setattr(cls, name, wrapped)
    return True


def _after_backup(ctl, operation, before, result, record):
    pages = (operation.completed_tokens - before) // max(1, ctl.page_size)
    if pages > 0:
        record(operation.hash_value[:pages], operation.token_ids, operation.prefix_keys)


def _after_hit_query(ctl, operation, before, result, record):
    hashes, hit_tokens = result
    pages = min(len(hashes), hit_tokens // max(1, ctl.page_size))
    if pages > 0:  # the query's pages follow operation.last_hash (None: from the sequence's start)
        last = operation.last_hash
        record(hashes[:pages], operation.token_ids, [last] if last else [])


def _raw_keys(pages):
    """The 32-byte keys of page strings (the hex digest itself; any other
    string hashed), as part_keys makes them before a mask."""
    return part_keys(pages, [bytes(KEY_BYTES)]).keys()


try:  # SGLang is only there on serving machines.
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _HiCacheStorage
except ImportError:  # pragma: no cover - exercised where SGLang is installed
    _HiCacheStorage = None

if _HiCacheStorage is not None:

    class CxlTierStorage(HiCacheAdapter, _HiCacheStorage):
        """SGLang HiCacheStorage backend on a cxltier prefix index."""

        def __init__(self, storage_config, *args, **kwargs):
            # SGLang's factory passes (config, kwargs-dict); the host pool
            # arrives by register_mem_pool_host.
            host = next((a for a in args if hasattr(a, "get_page_buffer_meta")), kwargs.get("mem_pool_host"))
            self._setup(storage_config, host)
