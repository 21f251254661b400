"""HiSparse (DSA sparse attention) host KV pool in the tier.

SGLang's HiSparse keeps each request's full KV in a host pool
(MLATokenToKVPoolHost) that its swap-in kernel reads misses from; the pool
only has to be GPU-readable memory with a fixed row stride. This module
gives that pool its storage in the tier instead of pinned DRAM: the same
tensor shape and dtype, laid in a tier region page-locked for CUDA, so the
KV of long contexts lives in CXL memory and is freed by the daemon if the
worker dies. SGLang's kernel, allocator and layout are untouched.

Enable it with the plugin (CXLTIER_HISPARSE_HOST_POOL=1, devices from
CXLTIER_DEVICES) or call install().
"""

import logging
import os
import sys

from .region import Region
from .tier import Tier

logger = logging.getLogger(__name__)


def planned_buffer(init, torch_module):
    """Runs a host pool's init_kv_buffer with torch_module.empty caught, and
    returns the (shape, dtype) it asked for without allocating it."""
    asked = {}
    real = torch_module.empty

    def meta_empty(*shape, dtype=None, **kwargs):
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        asked["shape"], asked["dtype"] = tuple(shape), dtype
        return real(shape, dtype=dtype, device="meta")

    torch_module.empty = meta_empty
    try:
        init()
    finally:
        torch_module.empty = real
    if "shape" not in asked:
        raise RuntimeError("cxltier: the host pool's init_kv_buffer did not call torch.empty")
    return asked["shape"], asked["dtype"]


def tier_kv_buffer(pool, init, devices=None):
    """The tensor a host pool's init_kv_buffer would make, in tier memory."""
    import torch

    shape, dtype = planned_buffer(init, torch)
    n = 1
    for d in shape:
        n *= d
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    pool._cxl_tier = Tier(devices or os.environ.get("CXLTIER_DEVICES", "shm:cxltier"), name=f"hisparse-{os.getpid()}")
    pool._cxl_region = Region(pool._cxl_tier, nbytes)
    if torch.cuda.is_available():
        pool._cxl_region.register_cuda()
    logger.info("cxltier: HiSparse host pool of %.1f GiB in the tier", nbytes / 2**30)
    return pool._cxl_region.tensor(shape, dtype)


def replace_everywhere(original, replacement):
    """Rebinds every module attribute that holds `original` to
    `replacement` (what a class REPLACE hook does)."""
    n = 0
    for mod in list(sys.modules.values()):
        d = getattr(mod, "__dict__", None)
        if not d:
            continue
        for name, value in list(d.items()):
            if value is original:
                setattr(mod, name, replacement)
                n += 1
    return n


def install():
    """Makes SGLang's MLA host pool keep its KV in the tier. Returns the
    number of places the class was replaced in (0: SGLang not present)."""
    try:
        from sglang.srt.mem_cache import memory_pool_host as mph
    except ImportError:
        return 0
    base = mph.MLATokenToKVPoolHost
    if getattr(base, "_cxltier", False):
        return 0

    class CxlTierMLATokenToKVPoolHost(base):
        _cxltier = True

        def init_kv_buffer(self):
            return tier_kv_buffer(self, super().init_kv_buffer)

    return replace_everywhere(base, CxlTierMLATokenToKVPoolHost)
