"""Named, persistent objects in the tier: a table created once per node and
found by name by every rank, instance and restart (or, on a CXL pool, every
host). An object outlives the process that made it and is removed only on
request (`remove_object`, `cxltier object rm`, `cxltier engram destroy`).

A payload is unsealed until a load finishes; `seal(label)` records its
checksum and what was loaded, so that a later process attaches a sealed
object instead of loading it again. Open objects are held: removal refuses
while a live process holds one. Consumers open read-only, a separate
read-only mapping in which a stray store faults in that process instead of
damaging what every other process reads."""

import ctypes
import json
import threading

from . import _native
from ._views import Views

CONTIGUOUS = 1
READ_ONLY = 1


def _info(tier, name):
    cap = 1 << 16
    while True:
        buf = ctypes.create_string_buffer(cap)
        try:
            _native.call("cxl_object_info", tier.handle, None if name is None else name.encode(), buf, cap)
            return json.loads(buf.value)
        except _native.RangeError:
            cap *= 4


def object_info(tier, name):
    """The object's header as a dict: name, size, state ("sealed" or
    "unsealed"), sum, label, sealed, seals, holders, contiguous."""
    return _info(tier, name)


def list_objects(tier):
    """Every named object of the tier, as object_info dicts."""
    return _info(tier, None) or []


def claim_load(tier, name):
    """Makes this tier client the loader of an unsealed object, so no other
    process loads it at the same time; ExistsError (the object is busy)
    while another running process loads it. A sealed object is left as it
    is."""
    _native.call("cxl_object_claim", tier.handle, name.encode())


def remove_object(tier, name, force=False):
    """Removes an object and frees its memory; refuses (ExistsError) while
    live processes hold it unless force."""
    _native.call("cxl_object_remove", tier.handle, name.encode(), 1 if force else 0)


class TierObject(_native.Child):
    """An open named object: `address` and `size` are its payload in this
    process (read-only when opened so), valid until close or detach."""

    _kind = "object"

    def __init__(self, tier, name, create_bytes=0, contiguous=True, read_only=False):
        h, addr, size = ctypes.c_uint64(), ctypes.c_void_p(), ctypes.c_int64()
        if create_bytes:
            flags = CONTIGUOUS if contiguous else 0
            _native.call("cxl_object_create", tier.handle, name.encode(), create_bytes, flags,
                         ctypes.byref(h), ctypes.byref(addr), ctypes.byref(size))
        else:
            _native.call("cxl_object_open", tier.handle, name.encode(), READ_ONLY if read_only else 0,
                         ctypes.byref(h), ctypes.byref(addr), ctypes.byref(size))
        self._opened(tier, h.value)
        self._views = Views()
        self.name, self.address, self.size, self.read_only = name, addr.value, size.value, read_only and not create_bytes

    @classmethod
    def create(cls, tier, name, nbytes, contiguous=True):
        """Creates the object (ExistsError if the name is taken), zero-filled
        and unsealed, and opens it writable."""
        if nbytes <= 0:
            raise _native.InvalidError(-1, f"object {name!r}: size {nbytes} must be positive")
        return cls(tier, name, create_bytes=nbytes, contiguous=contiguous)

    @classmethod
    def open(cls, tier, name, read_only=False):
        """Opens an existing object (NotFoundError if there is none)."""
        return cls(tier, name, read_only=read_only)

    def info(self):
        return object_info(self._tier, self.name)

    def _check(self):
        if self._h is None or self._tier._h is None:
            raise _native.ClosedError(-6, f"object {self.name!r}: closed or tier detached")

    def buffer(self):
        """The payload over tier memory: a ctypes array, or for an object
        opened read-only a read-only memoryview (a write raises TypeError
        instead of faulting the process on the read-only mapping). The
        object and the tier stay mapped while it, or a tensor over it, is
        referenced. A torch tensor cannot be marked read-only: one made
        from a read-only object's buffer faults the process if written."""
        self._check()
        view = (ctypes.c_uint8 * self.size).from_address(self.address)
        self._tier.track_view(view)
        self._views.track(view)
        return memoryview(view).cast("B").toreadonly() if self.read_only else view

    def close(self):
        """Closes the object; a read-only view's mapping goes once no
        buffer or tensor over it is referenced."""
        if self._h is not None and self._tier._h is not None:
            h, self._h = self._h, None
            self._views.after(lambda: _native.call("cxl_object_close", h))
        self._h = None

    def tensor(self):
        """The payload as a flat uint8 torch tensor over tier memory."""
        import torch

        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns on buffers it cannot prove writable
            return torch.frombuffer(self.buffer(), dtype=torch.uint8)

    def seal(self, label):
        """Records the payload's checksum (computed on every core) and label."""
        self._check()
        _native.call("cxl_object_seal", self._tier.handle, self.name.encode(), label.encode())

    def unseal(self):
        """Marks the payload as being rewritten."""
        self._check()
        _native.call("cxl_object_unseal", self._tier.handle, self.name.encode())

    def verify(self):
        """Recomputes a sealed payload's checksum (ChecksumError on a mismatch)."""
        self._check()
        _native.call("cxl_object_verify", self._tier.handle, self.name.encode())

    def gather(self, plane, row_bytes, rows, ids, out):
        """Copies rows of one plane into out: out[i] = the row_bytes at
        plane + ids[i] * row_bytes, ids an int64 tensor or array in [0, rows),
        out a contiguous CPU tensor or writable buffer of len(ids) * row_bytes
        bytes. Large calls copy on every core."""
        self.gatherer([(plane, row_bytes)], rows)(ids, out)

    def gatherer(self, planes, rows, threads=0):
        """A callable g(ids, out) copying the rows ids of every plane
        (planes: (byte offset, row bytes) pairs, each of rows rows) into out,
        plane after plane, in one library call: what a table of several
        planes (SGLang's fp8 rows and their scales) reads per lookup.
        g.empty(n) makes an output and its per-plane views. threads bounds
        the threads that copy (0: every core)."""
        return _Gatherer(self, planes, rows, threads)


class _Gatherer:
    """A prepared cxl_object_gather: the planes' arrays are built once and
    every fixed argument is a plain integer, so a call costs ctypes little
    more than the library's own work (a lookup of a few rows is a few
    microseconds, as long as torch's index_select of one plane)."""

    def __init__(self, obj, planes, rows, threads=0):
        if not planes or threads < 0:
            raise _native.InvalidError(-1, f"{len(planes)} planes, {threads} threads")
        self.obj, self.rows, self.n, self.threads = obj, rows, len(planes), threads
        self.row_bytes = [p[1] for p in planes]
        self.row_total = sum(self.row_bytes)
        self._at = (ctypes.c_int64 * self.n)(*(p[0] for p in planes))
        self._rb = (ctypes.c_int64 * self.n)(*self.row_bytes)
        self._at_addr, self._rb_addr = ctypes.addressof(self._at), ctypes.addressof(self._rb)
        self._threads = ctypes.c_int(threads)
        self._local = threading.local()  # the prebuilt call, per thread (its error buffer is its own)

    def __call__(self, ids, out):
        """Gathers the rows ids into out (len(ids) * the planes' row bytes,
        plane after plane)."""
        obj = self.obj
        if obj._h is None:
            obj._check()
        ids_ptr, n = _pointer(ids, 8)
        out_ptr, cap = _pointer(out, 1)
        call = getattr(self._local, "call", None)
        if call is None or self._local.h != obj._h:
            call = self._local.call = _native.prebuilt("cxl_object_gather", obj._h, self.n, self._at_addr,
                                                        self._rb_addr, self.rows)
            self._local.h = obj._h
        try:
            call(_vp(ids_ptr), _i64(n), _vp(out_ptr), _i64(cap), self._threads)
        except _native.CxlTierError:
            if obj._tier._h is None:
                obj._check()
            raise

    def empty(self, n, pin_memory=False):
        """(out, views): a uint8 tensor for n rows of every plane and its
        [n, row bytes] view of each plane. (as_strided: a slice and a view
        cost torch twice as much, more than the gather of a few rows.)"""
        import torch

        out = torch.empty(n * self.row_total, dtype=torch.uint8, pin_memory=pin_memory)
        views, at = [], 0
        for rb in self.row_bytes:
            views.append(out.as_strided((n, rb), (rb, 1), at))
            at += n * rb
        return out, views


_vp, _i64 = ctypes.c_void_p, ctypes.c_int64


def _pointer(x, item):
    """(address, element count) of a contiguous CPU torch tensor or writable
    buffer (array.array, numpy array, ctypes array) of item-byte elements
    (for out, the byte count)."""
    if hasattr(x, "data_ptr"):
        if not x.is_cpu or not x.is_contiguous():
            raise _native.InvalidError(-1, "a contiguous CPU tensor is needed")
        size = x.element_size()
        if item == 8 and size == 8:
            if x.is_floating_point():
                raise _native.InvalidError(-1, f"ids must be integers, not {x.dtype}")
            return x.data_ptr(), x.numel()
        nbytes, addr = x.numel() * size, x.data_ptr()
    else:
        mv = memoryview(x)
        if not mv.c_contiguous or mv.readonly:
            raise _native.InvalidError(-1, "a contiguous, writable buffer is needed")
        size, nbytes = mv.itemsize, mv.nbytes
        addr = ctypes.addressof((ctypes.c_char * nbytes).from_buffer(mv)) if nbytes else 0
    if item == 8 and size != 8:
        raise _native.InvalidError(-1, f"ids must be 8-byte integers, not {size}-byte elements")
    return addr, (nbytes // 8 if item == 8 else nbytes)
