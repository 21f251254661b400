"""Attaching to a tier."""

import ctypes

from . import _native
from ._views import Views


class Tier:
    """A tier this process is attached to, as one client (one lease).

    devices: the tier's backings in order, as a list or comma-separated
    string ("shm:cxltier", "file:/mnt/t", "dax:/dev/dax0.0"). The tier must
    exist (cxltierd or `cxltier format` makes it).
    """

    def __init__(self, devices, name="python"):
        if not isinstance(devices, str):
            devices = ",".join(devices)
        h = ctypes.c_uint64()
        _native.call("cxl_attach", devices.encode(), name.encode(), ctypes.byref(h))
        self._h = h.value
        self.devices = devices
        self._views = Views()  # of the mapping: buffers and tensors of regions and objects

    @property
    def handle(self):
        if self._h is None:
            raise _native.ClosedError(-6, "tier: detached")
        return self._h

    def prefix(self, name="default", blocks=0, block_bytes=0, key=None):
        """Opens prefix index `name`; with blocks > 0 it is created (blocks of
        block_bytes) when missing. key: the tenant key of an index created
        with one (and given to a new index, its key)."""
        from .prefix import PrefixIndex

        return PrefixIndex(self, name, blocks, block_bytes, key)

    def prefix_names(self):
        """The names of the tier's prefix indexes."""
        cap = 4096
        while True:
            buf = ctypes.create_string_buffer(cap)
            n = ctypes.c_int64()
            try:
                _native.call("cxl_prefix_names", self.handle, buf, cap, ctypes.byref(n))
            except _native.RangeError:
                cap = n.value + 4096
                continue
            return [s.decode() for s in buf.raw[: n.value].split(b"\0")[:-1]]

    def close(self):
        """Detaches, closing the indexes opened through this tier. New calls
        through it fail at once; while buffers or tensors over tier memory
        (Region.buffer, TierObject.buffer and their tensors) are still
        referenced, the tier stays mapped under them and is detached when
        the last one is collected (reading one after the unmap would fault
        the process)."""
        if self._h is not None:
            h, self._h = self._h, None
            self._views.after(lambda: _native.call("cxl_detach", h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
