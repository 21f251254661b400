"""Engram N-gram hashing, bit-exact with DeepSeek's reference."""

import ctypes
import json

from . import _native


def engram_hash(spec, layer, ids):
    """Global table rows of each position of one sequence of compressed ids,
    for Engram layer `layer`: a list per position, as `cxltier engram hash`
    prints them. spec is a preset name ("v4.1-flash") or a geometry (a dict
    or its JSON)."""
    if isinstance(spec, dict):
        spec = json.dumps(spec)
    ids = list(ids)
    arr = (ctypes.c_int64 * max(len(ids), 1))(*ids)
    n = ctypes.c_int64()
    try:
        _native.call("cxl_engram_hash", spec.encode(), layer, arr, len(ids), None, 0, ctypes.byref(n))
    except _native.RangeError:
        pass
    out = (ctypes.c_int64 * max(n.value, 1))()
    _native.call("cxl_engram_hash", spec.encode(), layer, arr, len(ids), out, n.value, ctypes.byref(n))
    per = n.value // len(ids) if ids else 0
    return [list(out[i * per : (i + 1) * per]) for i in range(len(ids))]
