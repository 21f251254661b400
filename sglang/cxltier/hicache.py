"""SGLang HiCache L3 storage on a cxltier prefix index.

Load it in SGLang with the dynamic backend (no fork, no plugin needed):

    --enable-hierarchical-cache --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name": "cxltier",
        "module_path": "cxltier.hicache", "class_name": "CxlTierStorage",
        "devices": "shm:cxltier", "index": "llama-3-8b"}'

extra_config keys: devices (default $CXLTIER_DEVICES or shm:cxltier),
index (default: the model name), key (the index's tenant key, default
$CXLTIER_PREFIX_KEY; prefer the environment, the config is logged), and,
to create the index when it is missing, blocks and block_bytes (≥ the
bytes of one page's K or V).

Pages are stored under SGLang's page hashes: each page's parts (K and V for
MHA, one for MLA) are separate entries keyed by SHA-256 of
"<page hash>[_<tp_rank>_<tp_size>]_<part>", so every worker, process and host
that maps the tier shares them; MLA pages are the same on every TP rank and
carry no rank. Data moves zero-copy between the host pool's pages and the
tier (batch_get_v1 / batch_set_v1).
"""

import logging
import os

from .prefix import string_key
from .tier import Tier

logger = logging.getLogger(__name__)

_PARTS = {1: ("k",), 2: ("k", "v")}


def _config(storage_config):
    extra = dict(getattr(storage_config, "extra_config", None) or {})
    model = getattr(storage_config, "model_name", None) or "default"
    return {
        "devices": extra.get("devices") or os.environ.get("CXLTIER_DEVICES") or "shm:cxltier",
        "index": extra.get("index") or model.replace("/", "-"),
        "blocks": int(extra.get("blocks", 0)),
        "key": extra.get("key") or os.environ.get("CXLTIER_PREFIX_KEY") or None,
        "block_bytes": int(extra.get("block_bytes", 0)),
    }


class HiCacheAdapter:
    """The HiCache storage contract on a prefix index, independent of SGLang
    (CxlTierStorage mixes it into SGLang's HiCacheStorage)."""

    def _setup(self, storage_config, mem_pool_host=None):
        cfg = _config(storage_config)
        self.tier = Tier(cfg["devices"], name=f"sglang-{os.getpid()}")
        self.index = self.tier.prefix(cfg["index"], cfg["blocks"], cfg["block_bytes"], cfg["key"])
        is_mla = bool(getattr(storage_config, "is_mla_model", False))
        tp_rank = getattr(storage_config, "tp_rank", 0)
        tp_size = getattr(storage_config, "tp_size", 1)
        self.key_suffix = "" if is_mla else f"_{tp_rank}_{tp_size}"
        if mem_pool_host is not None:
            self.mem_pool_host = mem_pool_host
        logger.info("cxltier: HiCache storage on %s, index %r", cfg["devices"], cfg["index"])

    def _keys(self, keys, parts):
        return [string_key(f"{k}{self.key_suffix}_{p}") for k in keys for p in parts]

    def _page_meta(self, keys, host_indices):
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        if not keys or len(ptrs) % len(keys):
            raise ValueError(f"cxltier: {len(ptrs)} page buffers for {len(keys)} keys")
        parts = _PARTS.get(len(ptrs) // len(keys)) or tuple(f"p{i}" for i in range(len(ptrs) // len(keys)))
        return self._keys(keys, parts), list(zip(ptrs, sizes)), len(parts)

    # Zero-copy page interface.

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        if not keys:
            return []
        tier_keys, bufs, per = self._page_meta(keys, host_indices)
        st = self.index.set(tier_keys, bufs)
        return [all(s != "no_space" for s in st[i * per : (i + 1) * per]) for i in range(len(keys))]

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        if not keys:
            return []
        tier_keys, bufs, per = self._page_meta(keys, host_indices)
        served, _ = self.index.get(tier_keys, bufs)
        return [i < served // per for i in range(len(keys))]

    def batch_exists(self, keys, extra_info=None):
        """How many leading pages are stored, every part of them."""
        if not keys:
            return 0
        per = len(_PARTS[2]) if self.key_suffix else 1
        return self.index.exists(self._keys(keys, _PARTS[per])) // per

    # Whole-object interface (targets are tensors or bytes-like buffers):
    # one entry per key, "<key>[_<rank>_<size>]", apart from the pages.

    def _object_key(self, key):
        return string_key(f"{key}{self.key_suffix}")

    def exists(self, key):
        return self.index.exists([self._object_key(key)]) == 1

    def _buf(self, target):
        if hasattr(target, "data_ptr"):
            return (target.data_ptr(), target.numel() * target.element_size())
        return target

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return self.batch_set([key], [value], [target_location] if target_location is not None else None)

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        bufs = [self._buf(t) for t in (target_locations or values)]
        st = self.index.set([self._object_key(k) for k in keys], bufs)
        return all(s != "no_space" for s in st)

    def get(self, key, target_location=None, target_sizes=None):
        got = self.batch_get([key], [target_location])
        return got[0]

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        served, _ = self.index.get([self._object_key(k) for k in keys], [self._buf(t) for t in target_locations])
        return [t if i < served else None for i, t in enumerate(target_locations)]

    def get_stats(self):
        return self.index.stats()

    def close(self):
        self.tier.close()


try:  # SGLang is only there on serving machines.
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _HiCacheStorage
except ImportError:  # pragma: no cover - exercised where SGLang is installed
    _HiCacheStorage = None

if _HiCacheStorage is not None:

    class CxlTierStorage(HiCacheAdapter, _HiCacheStorage):
        """SGLang HiCacheStorage backend on a cxltier prefix index."""

        def __init__(self, storage_config, *args, **kwargs):
            # SGLang versions pass (config, kwargs-dict) or (config, mem_pool_host, **kwargs).
            host = next((a for a in args if hasattr(a, "get_page_buffer_meta")), kwargs.get("mem_pool_host"))
            self._setup(storage_config, host)

        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host
