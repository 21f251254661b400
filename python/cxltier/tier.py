"""Attaching to a tier."""

import ctypes
import json
import os
import weakref

from . import _native
from ._views import Views

# Tiers attached in this process. A child made by fork() (without exec)
# inherits them, but not their leases: the lease, the locks it may hold and
# the library's threads are its parent's. The child forgets them at once,
# so its calls fail with ClosedError instead of writing under the parent's
# identity (or hanging in a library whose threads did not survive the fork).
_attached = weakref.WeakSet()


_in_forked_child = False


def _forget_in_child():
    global _in_forked_child
    _in_forked_child = True  # nothing inherited calls into the library again, finalizers included
    for t in list(_attached):
        t._h, t._forked = None, True
        t._views = Views()  # the parent's deferred detach is not the child's to run


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def _link_from_env():
    """The link table CXLTIER_LINK names: None (unset, "", 0, off: do not
    join), "" (1, on: the node's own) or a table's name."""
    v = os.environ.get("CXLTIER_LINK", "").strip()
    if v.lower() in ("", "0", "off", "no", "false"):
        return None
    if v.lower() in ("1", "on", "yes", "true"):
        return ""
    return v


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
        self._forked = False
        self.devices = devices
        self._views = Views()  # of the mapping: buffers and tensors of regions and objects
        _attached.add(self)
        self.link = None
        link = _link_from_env()
        try:
            if link is not None:
                self.join_link(link)  # which applies CXLTIER_BULK_PRIORITY
            elif os.environ.get("CXLTIER_BULK_PRIORITY", ""):
                # Lowered without the arbiter: on the CPU engine, what
                # bench/link measured to cost an Engram prefetch the least.
                self.bulk_priority(os.environ["CXLTIER_BULK_PRIORITY"])
        except BaseException:
            self.close()
            raise

    @property
    def handle(self):
        if self._h is None:
            if self._forked:
                raise _native.ClosedError(-6, f"tier {self.devices}: attached by the parent of this forked process; "
                                              "attach again in the child (a lease is one process's)")
            raise _native.ClosedError(-6, "tier: detached")
        return self._h

    def populate(self):
        """Enters every page of the tier into this process's page tables,
        without changing a byte, and returns the bytes covered: a process
        that moves many pages (a transfer backend) pays its page faults here,
        once, instead of on each page's first transfer (on 4 KiB pages a
        fault costs about what copying the page does)."""
        n = ctypes.c_int64()
        _native.call("cxl_tier_populate", self.handle, ctypes.byref(n))
        return n.value

    def lease(self):
        """(slot, generation) of this process's lease on the tier: what names
        it to a peer waiting on it (see lease_gone)."""
        slot, gen = ctypes.c_int64(), ctypes.c_uint32()
        _native.call("cxl_tier_lease", self.handle, ctypes.byref(slot), ctypes.byref(gen))
        return slot.value, gen.value

    def lease_gone(self, slot, gen):
        """Whether the client of lease (slot, gen) is gone: it closed, was
        reaped, its slot is another's, or (one host) its process ended. The
        lease comes from another process's word in the tier: use the answer
        to stop waiting on that client, never to act on its process."""
        out = ctypes.c_int8()
        _native.call("cxl_tier_lease_gone", self.handle, int(slot), int(gen) & 0xFFFFFFFF, ctypes.byref(out))
        return out.value == 1

    def join_link(self, name="", piece=0):
        """Joins this process to its node's link arbiter (the table `name`;
        "": the node's own, node<N>) and returns the table's name. From then
        on the bulk copies of its engines (KV pages stored and loaded, a
        prefill's pages) move in pieces of `piece` bytes (0: 256 KiB on the
        CPU engine, 1 MiB on a GPU's) that give way while another transfer's deadline is due (an Engram
        prefetch, in this process or another), and its Engram prefetchers
        opened from now on claim the link for their deadlines. Join before
        opening pools and prefetchers; joining again under the same name
        does nothing. CXLTIER_LINK=1 (or a table's name) makes every Tier
        join at attach."""
        buf = ctypes.create_string_buffer(256)
        _native.call("cxl_tier_link", self.handle, name.encode() if name else None, int(piece), buf, len(buf))
        self.link = buf.value.decode()
        want = os.environ.get("CXLTIER_BULK_PRIORITY", "")
        if want:
            self.bulk_priority(want)
        return self.link

    def bulk_priority(self, priority=None):
        """Sets the priority of the threads that copy this tier's KV pool
        stores on the CPU engine, for the pools open and those opened later:
        "normal" (the caller's), "low" (nice 19, what join_link sets) or
        "idle" (SCHED_IDLE); None leaves it. Nobody waits on a store soon,
        so on a host whose cores are all busy a lowered store gives a core
        at once to a thread with a deadline (an Engram prefetch, a top-k
        step, a request's load, in this process or another of its CPU
        cgroup). Loads keep the caller's priority; a GPU's engine ignores
        it. Returns {"wanted", "engines", "error"}: the priority asked for,
        each CPU engine's, and why one could not be lowered (a system that
        refuses it raises here). CXLTIER_BULK_PRIORITY sets it at attach
        (after joining the link where CXLTIER_LINK is set too)."""
        buf = ctypes.create_string_buffer(1024)
        _native.call("cxl_tier_bulk_priority", self.handle, priority.encode() if priority else None, buf, len(buf))
        return json.loads(buf.value)

    def link_turn(self, nbytes):
        """A bulk piece's turn on the link this tier joined: returns at once
        unless a deadline transfer on the link is due, else once none is.
        For copies the library does not make itself (the uplink's cluster
        fills, which Mooncake writes into the tier): call it before each
        piece. Without a link it returns at once."""
        if self.link is not None:
            _native.call("cxl_link_turn", self.handle, int(nbytes))

    def link_stats(self, name=None):
        """The sums of link table `name` (default: the one this tier joined)
        over the processes on it that run: claims, misses and time claimed
        of deadline transfers; bulk bytes, waits and time waited. What each
        process says of itself: for reading, not for acting on."""
        name = name or self.link
        if not name:
            raise ValueError("cxltier: link_stats: this tier joined no link; name one")
        buf = ctypes.create_string_buffer(1024)
        _native.call("cxl_link_stats", self.handle, name.encode(), buf, len(buf))
        return json.loads(buf.value)

    def prefix(self, name="default", blocks=0, block_bytes=0, key=None):
        """Opens prefix index `name`; with blocks > 0 it is created (blocks of
        block_bytes) when missing. key: the tenant key of an index created
        with one (and given to a new index, its key)."""
        from .prefix import PrefixIndex

        return PrefixIndex(self, name, blocks, block_bytes, key)

    def rooms(self, name, slots=0, slot_bytes=0, key=None):
        """Opens the rooms table `name` of prefill-to-decode transfers; with
        slots > 0 it is created (rooms of slot_bytes) when missing. key: the
        tenant key that signs the rooms' records (both sides give it)."""
        from .rooms import Rooms

        return Rooms(self, name, slots, slot_bytes, key)

    def track_view(self, view):
        """Counts view (a buffer or tensor over this tier's mapping) until it
        is collected, with a hold on the tier in the library across its life
        (cxl_tier_hold): the mapping stays under it whatever closes, and a
        detach defers to the last view. Returns view."""
        h = ctypes.c_uint64()
        _native.call("cxl_tier_hold", self.handle, ctypes.byref(h))
        hold = h.value

        def release():
            if not _in_forked_child:
                _native.call("cxl_tier_release", hold)

        return self._views.track(view, release)

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
