"""Paged KV buffers bound to a prefix index: pages move between an
inference engine's KV pool (its K and V of every layer, in GPU memory or on
the CPU) and the tier with the gather engine, a whole page per entry on
store and a layer at a time on load. cxltier.sglang.linker drives it for SGLang."""

import ctypes

from . import _native
from .prefix import _STATUS


class KVPool(_native.Child):
    """buffers: (address, bytes) of each buffer, layer-major, per_layer of
    them per layer; page p's chunk in a buffer is chunk_bytes at
    p * page_stride. device: the buffers are GPU memory (a cuda engine),
    else host memory (the cpu engine)."""

    _kind = "kvpool"

    def __init__(self, index, buffers, per_layer, chunk_bytes, page_stride, engine="cpu", stream=0, device=False,
                 verify=True):
        n = len(buffers)
        if n == 0 or n % per_layer:
            raise ValueError(f"cxltier: {n} buffers do not split into layers of {per_layer}")
        ptrs = (ctypes.c_void_p * n)(*(a for a, _ in buffers))
        lens = (ctypes.c_int64 * n)(*(b for _, b in buffers))
        h = ctypes.c_uint64()
        _native.call("cxl_kvpool_open", index.handle, _native.engine_kind(engine).encode(), stream, n, per_layer, ptrs, lens,
                     chunk_bytes, page_stride, 1 if device else 0, 1 if verify else 0, ctypes.byref(h))
        self._opened(index._tier, h.value)
        self.layers = n // per_layer
        self.page_bytes = n * chunk_bytes

    @property
    def handle(self):
        if self._h is None or self._tier._h is None:
            raise _native.ClosedError(-6, "cxltier: kv pool closed")
        return self._h

    def store(self, block, pages):
        """Stores page pages[i] under key i of block (a KeyBlock): each
        key's status, "stored", "present" or "no_space"."""
        n = block.n
        if len(pages) != n:
            raise ValueError(f"cxltier: {n} keys but {len(pages)} pages")
        st = (ctypes.c_int8 * max(n, 1))()
        _native.call("cxl_kvpool_store", self.handle, block.array, n, (ctypes.c_int64 * max(n, 1))(*pages), st)
        return [_STATUS[st[i]] for i in range(n)]

    def first_token(self, loads=None, stores=False):
        """The class of this pool's transfers on the tier's link
        (Tier.join_link). loads=True makes its loads first-token transfers,
        which stores, write-behind and cluster fills wait for, and which
        wait for deadline claims only; False makes them bulk; None leaves
        them as they are: first-token on a GPU's engine, bulk on the CPU's
        (where, measured, a load gains nothing from the class and the
        stores lose). stores=True gives the stores the class of the loads:
        a prefill's pages, which its decode's first token waits on."""
        _native.call("cxl_kvpool_first_token", self.handle, -1 if loads is None else int(bool(loads)), int(bool(stores)))

    def get(self, block, pages):
        """Lands every entry of block in pages, each page whole, with one
        launch (a load with no model to overlap a layer at a time: a
        prefill's pages landing in a decode). All or none: NotFoundError
        before anything is copied when one is gone; ChecksumError when a
        page was damaged (every damaged page's entry is dropped; do not use
        what landed)."""
        n = block.n
        if len(pages) != n:
            raise ValueError(f"cxltier: {n} keys but {len(pages)} pages")
        _native.call("cxl_kvpool_get", self.handle, block.array, n, (ctypes.c_int64 * max(n, 1))(*pages))

    def load(self, block, pages):
        """Pins every entry of block to land in pages (NotFoundError when
        one is gone): a KVLoad, to copy a layer at a time."""
        n = block.n
        if len(pages) != n:
            raise ValueError(f"cxltier: {n} keys but {len(pages)} pages")
        h = ctypes.c_uint64()
        _native.call("cxl_kvpool_load_start", self.handle, block.array, n, (ctypes.c_int64 * max(n, 1))(*pages),
                     ctypes.byref(h))
        return KVLoad(self, h.value)


class KVLoad:
    """A started load: layer(i) for i = 0, 1, ... copies one layer of every
    page and returns once it landed; after the last layer the pages'
    checksums are compared (ChecksumError: do not use what landed).
    layer(i) queues layer i+1's copy before it waits for layer i's, so the
    copies run back to back while the caller works on layer i: the pages
    belong to the load until close(), which waits for a copy queued ahead
    and releases the pins."""

    def __init__(self, pool, h):
        self._pool, self._h = pool, h

    def layer(self, i):
        if self._h is None or self._pool._h is None:
            raise _native.ClosedError(-6, "cxltier: kv load closed")
        _native.call("cxl_kvpool_load_layer", self._h, i)

    def close(self):
        if self._h is not None and self._pool._h is not None and self._pool._tier._h is not None:
            h, self._h = self._h, None
            _native.call("cxl_kvpool_load_close", h)
        self._h = None
