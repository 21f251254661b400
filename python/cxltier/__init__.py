"""cxltier: a shared memory tier (CXL memory, or host DRAM) for LLM serving.

The core (the modules of this folder) talks to the Go library libcxltier
through ctypes and needs no engine: attach to a tier (tier, region,
objects), store and load prefix KV pages (prefix, kvpool, tokens), hand
prefill to decode (rooms), hash and prefetch Engram rows (engram), resolve
sparse-attention top-k steps (topk). On top of it, one subpackage each:

- cxltier.sglang: SGLang's HiCache backend, linker, prefill-to-decode
  backend, plugin, HiSparse pool and Engram hooks;
- cxltier.vllm: vLLM's KV connector;
- cxltier.cluster: the node's uplink to Mooncake Store and its KV events.

The engine subpackages import their engine only when imported.
"""

import sys as _sys

from . import _moved

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

_moved.install(_sys.meta_path)

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
