"""Sparse-attention KV in the tier: sequences' full KV per layer, and each
decode step's top-k resolved into a per-request slot buffer in the
engine's memory with SGLang HiSparse's exact swap-in rules (see the Go
package topk)."""

import ctypes

from . import _native

HOST, DEVICE = 0, 1
_STEP = ("hits", "misses", "fills", "newest", "bytes")


def _int64s(values):
    values = list(values)
    return (ctypes.c_int64 * max(len(values), 1))(*values), len(values)


class TopKPool(_native.Child):
    """Sequences registered under request indices [0, max_requests) (SGLang's
    req_pool_indices), each with `layers` layers of `entry_bytes`-byte token
    entries in the tier, and per layer a buffer of slots + 1 rows per
    request in the engine's memory ("cuda": GPU memory on `stream`; "cpu":
    host memory). Request r's slot s is row r * (slots + 1) + s; slot
    `slots` holds the newest token. close() frees every sequence and the
    buffers.

    planner: "engine" keeps the slot tables in the engine's memory and plans
    each step there (on a GPU: one kernel launch per step, so selections in
    GPU memory never cross the bus; on the CPU engine, the kernels' Go
    twin); "host" plans in Go with the tables in host memory; "auto" (the
    default) is "engine" on a GPU. With engine planning a sequence may grow
    to max_context tokens (0: 1M)."""

    _kind = "topk"

    def __init__(self, tier, layers, entry_bytes, slots=4096, topk=2048, max_requests=256, engine="auto", stream=0,
                 planner="auto", max_context=0):
        h = ctypes.c_uint64()
        _native.call("cxl_topk_open", tier.handle, _native.engine_kind(engine).encode(), stream, layers, entry_bytes, slots, topk,
                     max_requests, planner.encode(), max_context, ctypes.byref(h))
        self._opened(tier, h.value)
        self.layers, self.entry_bytes, self.slots, self.topk = layers, entry_bytes, slots, topk
        self.max_requests = max_requests

    @property
    def handle(self):
        if self._h is None or self._tier._h is None:
            raise _native.ClosedError(-6, "topk: pool closed")
        return self._h

    def register(self, req, capacity=0):
        """Registers a sequence under request index req, reserving capacity tokens."""
        _native.call("cxl_topk_register", self.handle, req, capacity)

    def free(self, req):
        """Frees request req's sequence and its tier extents."""
        _native.call("cxl_topk_free", self.handle, req)

    def length(self, req, layer):
        n = ctypes.c_int64()
        _native.call("cxl_topk_len", self.handle, req, layer, ctypes.byref(n))
        return n.value

    def append(self, req, layer, entries):
        """Appends whole entries (a bytes-like object) to req's layer."""
        mv = memoryview(entries).cast("B")
        if mv.nbytes % self.entry_bytes:
            raise ValueError(f"{mv.nbytes} bytes is not a whole number of {self.entry_bytes}-byte entries")
        n = mv.nbytes // self.entry_bytes
        if n == 0:
            return
        buf = (ctypes.c_char * mv.nbytes).from_buffer_copy(mv) if mv.readonly else (ctypes.c_char * mv.nbytes).from_buffer(mv)
        _native.call("cxl_topk_append", self.handle, req, layer, ctypes.addressof(buf), n, HOST)

    def append_device(self, req, layer, ptr, n):
        """Appends n entries from GPU memory at ptr (a tensor's data_ptr(); GPU
        engines only), in order on the pool's stream."""
        _native.call("cxl_topk_append", self.handle, req, layer, ptr, n, DEVICE)

    def resolve(self, layer, reqs, seq_lens, topk):
        """Resolves one decode step of one layer from host lists: topk holds,
        per request, `self.topk` token positions (-1 padded). Returns (slots,
        step): the slot of every selection, per request, and what the step
        copied."""
        topk = [list(row) for row in topk]
        if len(topk) != len(list(reqs)):
            raise ValueError(f"{len(topk)} selection rows for {len(list(reqs))} requests")
        for b, row in enumerate(topk):
            if len(row) != self.topk:
                raise ValueError(f"request {b}: {len(row)} selections, want {self.topk} (pad with -1)")
        flat = [x for row in topk for x in row]
        sel = (ctypes.c_int32 * max(len(flat), 1))(*flat)
        out = (ctypes.c_int32 * max(len(flat), 1))()
        step = self._resolve(layer, reqs, seq_lens, ctypes.addressof(sel), ctypes.addressof(out), HOST)
        k = self.topk
        return [list(out[b * k : (b + 1) * k]) for b in range(len(topk))], step

    def resolve_device(self, layer, reqs, seq_lens, topk_ptr, out_ptr):
        """Resolves one step whose selections (int32 [batch, k]) and output
        slots (the same shape) are in GPU memory — e.g. a topk tensor's
        data_ptr() and that of torch.empty_like(topk) — ordered on the pool's
        stream. reqs and seq_lens are host sequences. Returns the step."""
        return self._resolve(layer, reqs, seq_lens, topk_ptr, out_ptr, DEVICE)

    def _resolve(self, layer, reqs, seq_lens, sel, out, where):
        r, n = _int64s(reqs)
        lens, m = _int64s(seq_lens)
        if n != m:
            raise ValueError(f"{n} requests but {m} sequence lengths")
        step = (ctypes.c_int64 * 5)()
        _native.call("cxl_topk_resolve", self.handle, layer, r, lens, n, sel, out, where, step)
        return dict(zip(_STEP, step))

    def buffer(self, layer):
        """(device address, bytes, entry bytes, rows per request) of layer's
        slot buffer, for a GPU engine."""
        ptr, size, row, per = ctypes.c_uint64(), ctypes.c_int64(), ctypes.c_int64(), ctypes.c_int64()
        _native.call("cxl_topk_buffer", self.handle, layer, ctypes.byref(ptr), ctypes.byref(size), ctypes.byref(row),
                     ctypes.byref(per))
        return ptr.value, size.value, row.value, per.value

    def read_slot(self, layer, req, slot):
        """A copy of the entry in request req's slot of layer."""
        out = ctypes.create_string_buffer(self.entry_bytes)
        _native.call("cxl_topk_read", self.handle, layer, req, slot, out, self.entry_bytes)
        return out.raw

    def stats(self):
        return self._stats(self.handle)
