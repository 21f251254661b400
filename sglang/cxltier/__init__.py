"""cxltier: a shared memory tier (CXL memory, or host DRAM) for LLM serving.

The core (this package without SGLang) talks to the Go library libcxltier
through ctypes: attach to a tier, store and load prefix KV pages, hash
Engram ids. `cxltier.hicache` holds the SGLang HiCache storage backend and
`cxltier.plugin` the SGLang plugin entry point; both import SGLang only
when used.
"""

from ._native import (
    CxlTierError,
    ChecksumError,
    ClosedError,
    DeniedError,
    ExistsError,
    InvalidError,
    NoSpaceError,
    NotFoundError,
    abi_version,
    library_path,
)
from .engram import EngramPrefetcher, engram_hash
from .prefix import KEY_BYTES, PrefixIndex, page_keys, string_key
from .region import Region
from .tier import Tier

__all__ = [
    "CxlTierError",
    "ChecksumError",
    "EngramPrefetcher",
    "ClosedError",
    "DeniedError",
    "ExistsError",
    "InvalidError",
    "NoSpaceError",
    "NotFoundError",
    "KEY_BYTES",
    "PrefixIndex",
    "Region",
    "Tier",
    "abi_version",
    "engram_hash",
    "library_path",
    "page_keys",
    "string_key",
]
