"""cxltier: a shared memory tier (CXL memory, or host DRAM) for LLM serving.

The core (this package without SGLang) talks to the Go library libcxltier
through ctypes: attach to a tier, store and load prefix KV pages, hash and
prefetch Engram rows, resolve sparse-attention top-k steps. On top of it,
`cxltier.hicache` holds the SGLang HiCache storage backend,
`cxltier.hisparse` the HiSparse host pool in the tier,
`cxltier.engram_hook` the Engram prefetch of SGLang's forward pass,
`cxltier.plugin` the SGLang plugin entry point and `cxltier.vllm` vLLM's
KV connector; they import SGLang (or vLLM) only when used.
"""

from ._native import (
    BusyError,
    CxlTierError,
    DamagedError,
    ChecksumError,
    ClosedError,
    DeniedError,
    ExistsError,
    InvalidError,
    NoSpaceError,
    NotFoundError,
    RangeError,
    abi_version,
    library_path,
)
from .engram import EngramPrefetcher, engram_hash
from .prefix import KEY_BYTES, PrefixIndex, page_keys, string_key
from .region import Region
from .rooms import Rooms
from .tier import Tier
from .topk import TopKPool

__all__ = [
    "BusyError",
    "CxlTierError",
    "DamagedError",
    "ChecksumError",
    "EngramPrefetcher",
    "ClosedError",
    "DeniedError",
    "ExistsError",
    "InvalidError",
    "NoSpaceError",
    "NotFoundError",
    "RangeError",
    "KEY_BYTES",
    "PrefixIndex",
    "Region",
    "Rooms",
    "Tier",
    "TopKPool",
    "abi_version",
    "engram_hash",
    "library_path",
    "page_keys",
    "string_key",
]
