"""HiSparse (DSA sparse attention) host KV pool in the tier.

SGLang's HiSparse keeps each request's full KV in a host pool that its
swap-in kernel reads misses from; the pool only has to be GPU-readable
memory with a fixed row stride. This module gives that pool its storage in
the tier instead of pinned DRAM, so the KV of long contexts lives in CXL
memory and is freed by the daemon if the worker dies. SGLang's kernel,
pool classes, layouts and CUDA registration are untouched: the pools
HiSparse builds (hisparse_coordinator: MLATokenToKVPoolHost for DSA,
HiSparseMHATokenToKVPoolHost for MiniMax-M3, DeepSeekV4PagedHostPool for
DeepSeek-V4) allocate every buffer through their `allocator`
(HostTensorAllocator.allocate, under alloc_with_host_register, which then
cudaHostRegisters it); here that allocator places the buffer in the tier.

Only the coordinator's pools move: HiCache's own host pools stay where
SGLang puts them. Enable it with the plugin (CXLTIER_HISPARSE_HOST_POOL=1,
devices from CXLTIER_DEVICES) or call install().
"""

import logging
import math
import os

from ..region import Region
from ..tier import Tier

logger = logging.getLogger(__name__)

# The host-pool classes hisparse_coordinator builds in SGLang 0.5.23.
POOL_CLASSES = ("MLATokenToKVPoolHost", "HiSparseMHATokenToKVPoolHost", "DeepSeekV4PagedHostPool")


class TierTensorAllocator:
    """SGLang's host tensor allocator interface over tier memory: each
    allocate() is a Region of one tier device, the tensor a view of it. The
    regions live until release() (the pool's destroy), the tier's detach,
    or the daemon's reaping of a dead process."""

    def __init__(self, devices=None):
        self.devices = devices or os.environ.get("CXLTIER_DEVICES", "shm:cxltier")
        self.dims = self.dtype = None
        self._tier = None
        self.regions = []

    def allocate(self, dims, dtype, device):
        if str(device) != "cpu":
            raise ValueError(f"cxltier: a host pool buffer lives in host memory, not on {device!r}")
        nbytes = math.prod(dims) * dtype.itemsize
        if self._tier is None:
            self._tier = Tier(self.devices, name=f"hisparse-{os.getpid()}")
        region = Region(self._tier, max(nbytes, 1))
        self.regions.append(region)
        self.dims, self.dtype = tuple(dims), dtype
        logger.info("cxltier: HiSparse host buffer %s %s, %.2f GiB, in the tier", tuple(dims), dtype, nbytes / 2**30)
        return region.tensor(dims, dtype)

    def release(self):
        for r in self.regions:
            r.release()
        self.regions = []
        if self._tier is not None:
            self._tier.close()
            self._tier = None


def tier_pool_class(base):
    """base with its buffers allocated in the tier: its `allocator`
    attribute, which SGLang sets in the constructor and passes to every
    allocation, is this process's TierTensorAllocator whatever SGLang
    assigns (SGLang's choice is kept as _cxl_sglang_allocator)."""

    class TierHostPool(base):
        _cxltier = True

        @property
        def allocator(self):
            a = self.__dict__.get("_cxl_allocator")
            if a is None:
                a = self.__dict__["_cxl_allocator"] = TierTensorAllocator()
            return a

        @allocator.setter
        def allocator(self, value):
            self.__dict__["_cxl_sglang_allocator"] = value

        def destroy(self):
            super().destroy()  # SGLang unregisters its CUDA pins first
            self.allocator.release()

    TierHostPool.__name__ = TierHostPool.__qualname__ = f"CxlTier{base.__name__}"
    return TierHostPool


def install():
    """Makes the host pools HiSparse builds keep their KV in the tier.
    Returns how many pool classes were replaced (0: SGLang absent, or done
    already); raises RuntimeError naming what this SGLang lacks."""
    try:
        from sglang.srt.managers import hisparse_coordinator as coordinator
    except ImportError:
        return 0
    missing = [name for name in POOL_CLASSES if not isinstance(getattr(coordinator, name, None), type)]
    if missing:
        raise RuntimeError(f"hisparse_coordinator has no {', '.join(missing)}")
    n = 0
    for name in POOL_CLASSES:
        base = getattr(coordinator, name)
        if not getattr(base, "_cxltier", False):
            setattr(coordinator, name, tier_pool_class(base))
            n += 1
    return n
