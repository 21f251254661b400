"""Contiguous tier memory for tensors: storage that lives in the tier (CXL
memory) instead of pinned DRAM, freed when released, when the tier is
detached, or by the daemon if the process dies."""

import ctypes

from . import _native
from ._views import Views


class Region:
    """`size` bytes (nbytes rounded up to whole chunks) of one tier device,
    contiguous in this process's address space at `address`. Striped
    (multi-device) tiers cannot provide one."""

    def __init__(self, tier, nbytes):
        off, addr, size = ctypes.c_uint64(), ctypes.c_void_p(), ctypes.c_int64()
        _native.call("cxl_region_alloc", tier.handle, nbytes, ctypes.byref(off), ctypes.byref(addr), ctypes.byref(size))
        self._tier = tier
        self.offset, self.address, self.size = off.value, addr.value, size.value
        self.nbytes = nbytes
        self._registered = False
        self._views = Views()

    def buffer(self):
        """The region as a writable ctypes array (a buffer-protocol object).
        The region's chunks and the tier's mapping stay while it, or a
        tensor over it, is referenced."""
        self._check()
        view = (ctypes.c_char * self.size).from_address(self.address)
        self._tier.track_view(view)
        return self._views.track(view)

    def tensor(self, shape, dtype):
        """A torch tensor of shape and dtype over the region's memory."""
        import torch

        n = 1
        for d in shape:
            n *= d
        need = n * torch.empty((), dtype=dtype).element_size()
        if need > self.size:
            raise ValueError(f"a {tuple(shape)} {dtype} tensor needs {need} bytes, the region has {self.size}")
        flat = torch.frombuffer(self.buffer(), dtype=torch.uint8, count=need)
        return flat.view(dtype).view(shape)

    def register_cuda(self):
        """Page-locks the region for CUDA (cudaHostRegister), so GPU kernels
        read it directly, as they read pinned host memory."""
        import torch

        if not self._registered:
            err = torch.cuda.cudart().cudaHostRegister(self.address, self.size, 0)
            if int(err) != 0:
                raise RuntimeError(f"cudaHostRegister of {self.size} bytes of tier memory failed: {err}")
            self._registered = True

    def _check(self):
        if self.address is None or self._tier._h is None:
            raise _native.ClosedError(-6, "region: released or tier detached")

    def release(self):
        """Frees the region: at once, or, while buffers or tensors over it
        are referenced, when the last is collected (its chunks must not go
        to another client under them)."""
        if self.address is None:
            return
        address, registered, tier = self.address, self._registered, self._tier
        self.address, self._registered = None, False

        def free():
            if registered:
                import torch

                torch.cuda.cudart().cudaHostUnregister(address)
            if tier._h is not None:
                _native.call("cxl_region_free", tier.handle, self.offset, self.size)

        self._views.after(free)
