"""Engram N-gram hashing, bit-exact with DeepSeek's reference."""

import ctypes
import json
import os

from . import _native


def geometry_spec(spec):
    """The geometry argument as the library takes it: a preset name as it
    is; a dict, or the path of a geometry JSON file (as the CLI's --config
    and CXLTIER_ENGRAM take), as JSON, with a relative "lookup" file taken
    beside the geometry file."""
    if isinstance(spec, dict):
        return json.dumps(spec)
    if isinstance(spec, os.PathLike) or (isinstance(spec, str) and (spec.endswith(".json") or os.path.sep in spec)):
        path = os.fspath(spec)
        try:
            with open(path) as f:
                geo = json.load(f)
        except OSError as e:
            raise _native.InvalidError(-1, f"geometry file {path}: {e}") from e
        except ValueError as e:
            raise _native.InvalidError(-1, f"geometry file {path}: not JSON: {e}") from e
        if geo.get("lookup") and not os.path.isabs(geo["lookup"]):
            geo["lookup"] = os.path.join(os.path.dirname(os.path.abspath(path)), geo["lookup"])
        return json.dumps(geo)
    return spec


def engram_hash(spec, layer, ids):
    """Global table rows of each position of one sequence of compressed ids,
    for Engram layer `layer`: a list per position, as `cxltier engram hash`
    prints them. spec is a preset name ("v4.1-flash"), a geometry file's
    path, or a geometry (a dict or its JSON)."""
    spec = geometry_spec(spec)
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


def _flatten(seqs):
    seqs = [list(s) for s in seqs]
    flat = [x for s in seqs for x in s]
    ids = (ctypes.c_int64 * max(len(flat), 1))(*flat)
    lens = (ctypes.c_int64 * max(len(seqs), 1))(*[len(s) for s in seqs])
    return ids, lens, len(seqs), len(flat)


class Prefetch:
    """A prefetch in flight. Once wait() returns, `slots` holds the cache
    slot of each row, in the order engram_hash lists them (sequence,
    position, then head); before, it is None (with planner="engine" and the
    cache, the engine decides the slots as it runs)."""

    def __init__(self, out, n, pending):
        self.slots = None
        self._out, self._n = out, n
        self._pending = pending

    def wait(self):
        """Blocks until the rows are in the cache; returns the seconds from
        the call to readiness (counted against the deadline)."""
        if self._pending is None:
            return self._ready
        ns = ctypes.c_int64()
        h, self._pending = self._pending, None
        try:
            _native.call("cxl_engram_wait", h, self._out, self._n, ctypes.byref(ns))
        finally:
            self.slots = list(self._out[: self._n])
        self._ready = ns.value / 1e9
        return self._ready


class EngramPrefetcher(_native.Child):
    """Prefetches the Engram rows of a batch into a per-layer buffer of
    `slots` rows in the engine's memory ("cuda": GPU memory on `stream`;
    "cpu": host memory), for every layer of the geometry whose table is
    loaded in the tier. With cache=True rows stay across calls and are not
    fetched again (managed on the host it has measured slower than fetching
    everything, so it is off by default); without it a call's rows take
    slots 0..n-1 and must be used before the next call for the same layer
    (stream order on a GPU). planner="engine" lets the engine hash the ids
    and keep the cache's tags in its own memory, one engine call per
    prefetch (on a GPU: engram/engram.cu, not yet measured there)."""

    _kind = "engram"
    _CACHE, _ON_ENGINE = 1, 2

    # spec: a preset name, a geometry file's path, or a geometry dict/JSON.
    def __init__(self, tier, spec, engine="auto", stream=0, slots=1 << 17, deadline_us=56.0, cache=False,
                 planner="host"):
        spec = geometry_spec(spec)
        if planner not in ("host", "engine"):
            raise ValueError(f"planner {planner!r}: want 'host' or 'engine'")
        flags = (self._CACHE if cache else 0) | (self._ON_ENGINE if planner == "engine" else 0)
        h = ctypes.c_uint64()
        _native.call("cxl_engram_open", tier.handle, spec.encode(), _native.engine_kind(engine).encode(), stream, slots, flags,
                     int(deadline_us * 1000), ctypes.byref(h))
        self._opened(tier, h.value)
        st = self.stats()
        self.layers = st["layers"]  # layers with a table in the tier
        self.max_ngram = st["max_ngram"]
        self.has_lookup = st["lookup"]
        self.row_bytes = st["row_bytes"]  # of every layer's rows (the geometry's "row_bytes")

    def compress(self, ids):
        """Raw tokenizer ids mapped through the geometry's lookup table (its
        "lookup" file) to the compressed ids the hash takes."""
        ids = list(ids)
        arr = (ctypes.c_int64 * max(len(ids), 1))(*ids)
        _native.call("cxl_engram_compress", self._h, arr, len(ids))
        return list(arr[: len(ids)])

    def prefetch(self, layer, seqs, histories=None):
        """Starts fetching the rows of seqs (lists of new compressed ids; with
        histories, the ids before them) for layer."""
        ids, lens, nseq, total = _flatten(seqs)
        hist_ids = hist_lens = None
        if histories is not None:
            if len(histories) != nseq:
                raise ValueError(f"{len(histories)} histories for {nseq} sequences")
            hist_ids, hist_lens, _, _ = _flatten(histories)
        cap = max(total * 64, 1)
        while True:
            out = (ctypes.c_int32 * cap)()
            n, pending = ctypes.c_int64(), ctypes.c_uint64()
            try:
                _native.call("cxl_engram_prefetch", self._h, layer, ids, lens, nseq, hist_ids, hist_lens, out, cap,
                             ctypes.byref(n), ctypes.byref(pending))
                return Prefetch(out, n.value, pending.value)
            except _native.RangeError:
                cap = n.value

    def buffer(self, layer):
        """(device address, bytes, row bytes) of layer's cache, for a GPU engine."""
        ptr, size, row = ctypes.c_uint64(), ctypes.c_int64(), ctypes.c_int64()
        _native.call("cxl_engram_buffer", self._h, layer, ctypes.byref(ptr), ctypes.byref(size), ctypes.byref(row))
        return ptr.value, size.value, row.value

    def read_row(self, layer, slot, row_bytes=None):
        """A copy of the row in cache slot `slot` of layer's buffer (a slot
        from Prefetch.slots). row_bytes is the size of the copy's buffer: at
        least the geometry's row size, which is the default (self.row_bytes:
        264 for V4.1-Flash, weight then scales); a smaller one is refused."""
        row_bytes = self.row_bytes if row_bytes is None else row_bytes
        out = ctypes.create_string_buffer(row_bytes)
        _native.call("cxl_engram_read", self._h, layer, slot, out, row_bytes)
        return out.raw

    def stats(self):
        return self._stats(self._h)
