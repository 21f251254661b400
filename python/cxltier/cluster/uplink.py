"""The node's uplink: the one process per node that joins its cxltier tier to
a cluster through Mooncake Store.

    python -m cxltier.cluster.uplink --tier shm:cxltier --master 10.0.0.1:50051

Every process on the node that opens a prefix index of the tier (SGLang's
HiCache backend, the unified-cache linker, PrefixIndex) finds this process
through the tier itself: it binds a socket named after the tier's UUID and
the node, beside the tier's file (/dev/shm for shm: tiers; /run/cxltier for
DAX; $CXLTIER_SOCKET_DIR where set: cxl_uplink_address). A path, not an
abstract name, so that processes in other network namespaces (pods that
share the directory) find it too. Those processes then

- ask it for the keys past a local miss: it checks the cluster, reserves
  blocks through the index's crash-safe reserve/publish insert, lets
  Mooncake write the pages straight into them (the tier mapping is
  registered with the transfer engine: no bounce buffer), checks each
  page's checksum and publishes it. The asking process then loads them as
  local hits. Keys already being fetched for another process are joined,
  not fetched again: one network fetch per page per node, however many
  ranks and instances missed it.
- tell it what they stored: it writes those pages behind to the cluster
  from a bounded queue (a full queue drops and counts; it never blocks a
  writer), reading them in place from the tier.

Mooncake's Python client is the only Mooncake client that installs from the
package index (its Go binding needs Mooncake built from source), which is
why this part of cxltier is Python. Failures become local misses: a master
or network that does not answer, an uplink that is gone, a damaged
transfer.

A page travels as its payload followed by a 16-byte trailer (magic, version,
length, CRC-32C of the key then the payload), so the receiving node checks
it before it publishes it. Cluster keys are "cxltier/<namespace>/<key hex>"
where the namespace is the index's name and, for an index with a tenant
key, a digest of that key: indexes of one name share pages across nodes only
when their keys match.
"""

import argparse
import ctypes
import errno
import faulthandler
import fcntl
import grp
import http.server
import logging
import mmap
import os
import queue
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections import deque

from ..sizes import parse_size

logger = logging.getLogger("cxltier.cluster.uplink")

# A page's trailer on the wire: its format is Go's (cluster.Trailer), which
# writes and checks it; the uplink only moves its bytes. Its size is checked
# against the library's at start.
TRAILER_BYTES = 32

_REQ_HEADER = struct.Struct("<4sBBHI")
_REQ_MAGIC = b"CXU1"
_REPLY = struct.Struct("<4sB3xI")
_REPLY_MAGIC = b"CXR1"
OP_FILL, OP_STORED = 1, 2
KEY_BYTES = 32
_MAX_MESSAGE = 16 + 64 + 2048 * KEY_BYTES


class UplinkError(RuntimeError):
    """The uplink could not start (Mooncake setup, the socket, the tier)."""


def parse_request(msg):
    """(op, index name, [32-byte keys]) of one client message; ValueError
    for anything else (cluster/wire.go is the other side)."""
    if len(msg) < _REQ_HEADER.size:
        raise ValueError(f"uplink message of {len(msg)} bytes")
    magic, op, _, name_len, n = _REQ_HEADER.unpack_from(msg)
    if magic != _REQ_MAGIC or op not in (OP_FILL, OP_STORED):
        raise ValueError("not an uplink request")
    if len(msg) != _REQ_HEADER.size + name_len + n * KEY_BYTES or not 0 < name_len <= 64 or n == 0:
        raise ValueError(f"uplink request of {len(msg)} bytes for a {name_len}-byte name and {n} keys")
    name = msg[_REQ_HEADER.size : _REQ_HEADER.size + name_len].decode()
    base = _REQ_HEADER.size + name_len
    return op, name, [msg[base + i * KEY_BYTES : base + (i + 1) * KEY_BYTES] for i in range(n)]


def reply(filled, failed=False):
    return _REPLY.pack(_REPLY_MAGIC, 1 if failed else 0, filled)


class Metrics:
    """The uplink's counters, served as Prometheus text."""

    COUNTERS = {
        "put_pages": "pages written behind to the cluster",
        "put_bytes": "payload bytes written behind to the cluster",
        "put_skipped_pages": "pages the cluster held already (not sent again)",
        "fetched_pages": "pages brought into this tier from the cluster",
        "fetched_bytes": "payload bytes brought into this tier from the cluster",
        "joined_pages": "pages a fill found already being fetched for another request, and waited for",
        "dropped_pages": "write-behind pages dropped: the queue was full, or their puts still failed after retries",
        "denied_pages": "pages of keyed indexes this uplink holds no key for (kept local)",
        "rejected_pages": "fetched pages that failed their checksum or length (left as misses)",
        "remote_errors": "cluster calls that failed or were skipped while the cluster was unreachable",
        "fill_requests": "fill requests from processes of this node",
        "fill_failures": "fill requests answered with a failure",
    }
    BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

    def __init__(self):
        self._lock = threading.Lock()
        self.values = dict.fromkeys(self.COUNTERS, 0)
        self._hist = [0] * (len(self.BUCKETS) + 1)
        self._sum = 0.0

    def add(self, name, n=1):
        with self._lock:
            self.values[name] += n

    def fetch_took(self, seconds):
        with self._lock:
            self._sum += seconds
            for i, b in enumerate(self.BUCKETS):
                if seconds <= b:
                    self._hist[i] += 1
                    break
            else:
                self._hist[-1] += 1

    def text(self, queue_depth, cluster_up, slots_free=0):
        with self._lock:
            values, hist, total = dict(self.values), list(self._hist), self._sum
        out = []
        for name, doc in self.COUNTERS.items():
            out += [f"# HELP cxltier_uplink_{name}_total {doc}", f"# TYPE cxltier_uplink_{name}_total counter",
                    f"cxltier_uplink_{name}_total {values[name]}"]
        out += ["# HELP cxltier_uplink_fetch_seconds time of one fetch batch from the cluster into the tier",
                "# TYPE cxltier_uplink_fetch_seconds histogram"]
        acc = 0
        for b, n in zip(self.BUCKETS, hist):
            acc += n
            out.append(f'cxltier_uplink_fetch_seconds_bucket{{le="{b}"}} {acc}')
        acc += hist[-1]
        out += [f'cxltier_uplink_fetch_seconds_bucket{{le="+Inf"}} {acc}', f"cxltier_uplink_fetch_seconds_sum {total:.6f}",
                f"cxltier_uplink_fetch_seconds_count {acc}",
                "# HELP cxltier_uplink_queue_pages write-behind pages waiting", "# TYPE cxltier_uplink_queue_pages gauge",
                f"cxltier_uplink_queue_pages {queue_depth}",
                "# HELP cxltier_uplink_cluster_up 1 while the cluster store answers", "# TYPE cxltier_uplink_cluster_up gauge",
                f"cxltier_uplink_cluster_up {1 if cluster_up else 0}",
                "# HELP cxltier_uplink_trailer_slots_free trailer slots not lent to a transfer (all of them when idle)",
                "# TYPE cxltier_uplink_trailer_slots_free gauge", f"cxltier_uplink_trailer_slots_free {slots_free}"]
        return "\n".join(out) + "\n"


class _Slots:
    """Registered memory for page trailers: 16-byte slots handed out and
    given back, so a transfer reads and writes trailers without a copy."""

    def __init__(self, store, n=1 << 16):
        self._map = mmap.mmap(-1, n * TRAILER_BYTES)
        self._buf = (ctypes.c_char * (n * TRAILER_BYTES)).from_buffer(self._map)
        self.base = ctypes.addressof(self._buf)
        self._registered = False
        if store is not None:
            if store.register_buffer(self.base, n * TRAILER_BYTES) != 0:
                raise UplinkError("mooncake: register_buffer of the trailer slots failed")
            self._registered = True
        self._free = deque(range(n))
        self._lock = threading.Lock()

    def take(self, n):
        with self._lock:
            if len(self._free) < n:
                return None
            return [self._free.popleft() for _ in range(n)]

    def give(self, slots):
        with self._lock:
            self._free.extend(slots)

    def addr(self, slot):
        return self.base + slot * TRAILER_BYTES

    def free(self):
        """How many slots are free (all of them, when no transfer runs)."""
        with self._lock:
            return len(self._free)

    def unregister(self, store):
        if self._registered:
            store.unregister_buffer(self.base)
            self._registered = False

    def put(self, slot, raw):
        """Copies a trailer's bytes (as Go wrote them) into slot."""
        self._map[slot * TRAILER_BYTES:(slot + 1) * TRAILER_BYTES] = bytes(raw)


class NodeIndex:
    """A prefix index as the uplink uses it: pages pinned in place, blocks
    reserved and published after a transfer fills them. cluster_key: the
    cluster's key (bytes), which signs the pages it sends and must sign the
    pages it takes."""

    def __init__(self, tier, name, key=None, cluster_key=None):
        from .. import _native

        self._native = _native
        self.index = tier.prefix(name, key=key)
        buf = ctypes.create_string_buffer(256)
        _native.call("cxl_prefix_namespace", self.index.handle, buf, len(buf))
        self.name, self.namespace = name, buf.value.decode()
        if cluster_key:
            raw = (ctypes.c_uint8 * len(cluster_key)).from_buffer_copy(cluster_key)
            _native.call("cxl_prefix_cluster_key", self.index.handle, raw, len(cluster_key))
        room = ctypes.c_int64()
        _native.call("cxl_prefix_room", self.index.handle, ctypes.byref(room))
        self.room = room.value  # a block's span: a page whose trailer fits moves in one transfer

    def fits(self, length):
        """Whether a page of length bytes leaves room for its trailer in
        its block, so that page and trailer move as one piece."""
        return length + TRAILER_BYTES <= self.room

    def cluster_keys(self, keys):
        return [f"cxltier/{self.namespace}/{k.hex()}" for k in keys]

    def present(self, keys):
        """How many leading keys the local index holds."""
        return self.index.exists(keys)

    def pin(self, keys):
        """Pins the present keys, with a hold on the tier until unpin:
        (handle, [(i, address, length, inplace)], trailers). Go writes each
        present key's trailer into trailers (TRAILER_BYTES at i), and also
        right after the payload in its block where it fits (inplace: page
        and trailer then leave as one piece)."""
        n = len(keys)
        arr = (ctypes.c_uint8 * (n * KEY_BYTES)).from_buffer_copy(b"".join(keys))
        addrs, lens = (ctypes.c_void_p * n)(), (ctypes.c_int64 * n)()
        trailers = (ctypes.c_uint8 * (n * TRAILER_BYTES))()
        inplace, present, h = (ctypes.c_int8 * n)(), (ctypes.c_int8 * n)(), ctypes.c_uint64()
        self._native.call("cxl_prefix_pin", self.index.handle, arr, n, addrs, lens, trailers, inplace, present,
                          ctypes.byref(h))
        return h.value, [(i, addrs[i], lens[i], inplace[i] == 1) for i in range(n) if present[i]], trailers

    def unpin(self, h):
        self._native.call("cxl_prefix_unpin", h)

    def begin_fill(self, keys, sizes):
        """A fill of blocks reserved for keys (prefix.Fill, owned by Go):
        a context manager that aborts whatever was not committed."""
        return _Fill(self._native, self.index, keys, sizes)


class _Fill:
    """Blocks a transfer writes into, as one transaction that Go owns: it
    holds the tier mapped from begin to commit or close, checks the lease
    before it says where to write (blocks) and again at commit, checks each
    page against its trailer, publishes the good ones and aborts the rest.
    Leaving the `with` block aborts whatever was not committed, whatever
    raised."""

    def __init__(self, native, index, keys, sizes):
        self._native = native
        n = len(keys)
        arr = (ctypes.c_uint8 * (n * KEY_BYTES)).from_buffer_copy(b"".join(keys))
        st, h = (ctypes.c_int8 * n)(), ctypes.c_uint64()
        native.call("cxl_prefix_fill_begin", index.handle, arr, n, (ctypes.c_int64 * n)(*sizes), st, ctypes.byref(h))
        self._h, self.n = h.value, n
        self.reserved = [i for i in range(n) if st[i] == 0]

    def blocks(self):
        """Where each reserved key's page goes (None for the others), after
        a check of the lease (ClosedError once this client was reaped)."""
        addrs = (ctypes.c_void_p * self.n)()
        self._native.call("cxl_prefix_fill_blocks", self._h, addrs, self.n)
        return [addrs[i] for i in range(self.n)]

    def commit(self, filled, trailers):
        """Publishes each filled key whose page matches its trailer
        (trailers[i]: the address of a trailer that came apart from its
        page, or None for one right after the page in its block); aborts the
        others. Returns which were published."""
        io = (ctypes.c_int8 * self.n)(*[1 if f else 0 for f in filled])
        ptrs = (ctypes.c_void_p * self.n)(*trailers)
        h, self._h = self._h, None
        self._native.call("cxl_prefix_fill_commit", h, ptrs, self.n, io)
        return [io[i] == 1 for i in range(self.n)]

    def close(self):
        if self._h is not None:
            h, self._h = self._h, None
            self._native.call("cxl_prefix_fill_close", h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _Flight:
    """One fetch of keys from the cluster that requests for the same keys
    join (single flight): they wait as long as the fetch may take, however
    long that is (its deadline grows once its bytes are known), and share
    its outcome. A fetch whose Mooncake call hangs past its deadline lets
    them go as failed."""

    def __init__(self, deadline):
        self._done = threading.Event()
        self._deadline = deadline
        self.failed = False

    def extend(self, deadline):
        self._deadline = max(self._deadline, deadline)

    def land(self, failed):
        self.failed = failed
        self._done.set()

    def join(self):
        """Waits for the fetch; whether it failed (True also if it is past
        its deadline)."""
        while not self._done.wait(max(0.0, min(0.1, self._deadline - time.monotonic()))):
            if time.monotonic() >= self._deadline:
                return True
        return self.failed


class _Moved:
    """One part of a fetch between its transfer and its publish."""

    def __init__(self, fill, sizes):
        self.fill, self.sizes = fill, sizes
        self.filled = self.trailers = None  # None: nothing was reserved, nothing moved
        self.published = []
        self.slots = []
        self.cluster_failed = False
        self.reserve_s = self.transfer_s = self.publish_s = 0.0


def _parts(sizes, part_bytes):
    """[lo, hi) ranges of pages, in order, each of at least part_bytes
    (the last may be less) and one page at the least; one range when
    part_bytes is 0 or the pages are fewer bytes than two parts."""
    if part_bytes <= 0 or sum(sizes) < 2 * part_bytes:
        return [(0, len(sizes))]
    parts, lo, acc = [], 0, 0
    for i, size in enumerate(sizes):
        acc += size
        if acc >= part_bytes:
            parts.append((lo, i + 1))
            lo, acc = i + 1, 0
    if lo < len(sizes):
        if acc < part_bytes // 2 and parts:  # a short tail joins the part before it
            parts[-1] = (parts[-1][0], len(sizes))
        else:
            parts.append((lo, len(sizes)))
    return parts


LINK_FILL_PART = 32 << 20
"""The part a fetch moves in when its tier joined the node's link
(CXLTIER_LINK) and --fill-part was not given. A transfer engine's call
cannot be paced from outside, so a fill gives way to the link's deadlines
between its calls: a link turn before each part's transfer (and one before
each page its commit checks, whatever the part). Each call costs a round
trip to the cluster and a part's own reserve and publish: over loopback
TCP on 2 cores (bench/cluster/parts.py, 128 MiB fetched), parts of 32 MiB
kept 0.86 of a fetch in one part's throughput, of 16 MiB 0.82, of 8 MiB
0.74; a fetch under two parts (64 MiB) is one part and pays nothing."""


def _fill_part(fill_part, linked):
    """The part a fetch moves in: fill_part as given (0: one part), or, when
    None, LINK_FILL_PART on a tier that joined a link and one part on one
    that did not."""
    if fill_part is None:
        return LINK_FILL_PART if linked else 0
    if fill_part < 0:
        raise UplinkError(f"fill part of {fill_part} bytes: want 0 (one part) or more")
    return fill_part


def _replica_size(descs):
    """The object size a replica list names, or None."""
    for r in descs or []:
        try:
            if r.is_memory_replica():
                return int(r.get_memory_descriptor().buffer_descriptor.size)
            if r.is_disk_replica():
                return int(r.get_disk_descriptor().size)
        except Exception:  # a descriptor of another kind: try the next replica
            continue
    return None


class Uplink:
    """The uplink of one node tier. store is a set-up Mooncake client, or
    None for a node that serves fills and write-behind without a cluster
    (everything then stays local)."""

    def __init__(self, devices, store, replicas=1, admit="all", queue_pages=65536, batch=256, keys=None,
                 fill_timeout=1.0, name="cxltier-uplink", prefault=True, cluster_key=None, fill_part=None):
        from .. import _native
        from ..tier import Tier

        self._native = _native
        _fill_part(fill_part, False)  # a bad part is refused before the tier is attached
        self.tier = Tier(devices, name=name)
        _native.call("cxl_uplink_off", self.tier.handle)  # the uplink never asks itself
        self.store = store
        self.replicas = replicas
        self.admit = _admission(admit)
        self.batch = batch
        self.keys = dict(keys or {})
        self.cluster_key = cluster_key
        self.fill_timeout = fill_timeout
        self.part_bytes = _fill_part(fill_part, self.tier.link is not None)
        self._transfers = 0  # transfers begun (a count for the tests' injected failures)
        self.metrics = Metrics()
        self.queue = queue.Queue(maxsize=queue_pages)
        self._indexes = {}
        self._index_lock = threading.Lock()
        self._inflight = {}  # cluster key -> Event of the fetch that brings it
        self._inflight_lock = threading.Lock()
        self._fill_slots = threading.BoundedSemaphore(8)
        self._cluster_down = False  # set by a failure or a stall; only a probe's answer clears it
        self._calls = {}  # Mooncake calls out now -> when they started
        self._calls_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = []
        self._conns = {}  # the threads serving connections, while they run: their connections
        self._conns_lock = threading.Lock()
        self.events = None  # the KV event stream (cxltier.cluster.kvevents), when --events asks for one
        self._signalled = False  # set by the signal handlers, and nothing else
        self._mapped, self._mapped_hold, self._registered, self.slots = [], None, [], None
        self._sock, self._lock_fd = None, None
        try:
            self._start(prefault)
        except BaseException:
            self._undo()
            raise

    def _start(self, prefault):
        """What the uplink takes at start: its socket's path, its trailer
        slots, the tier's mappings (under a hold) registered with the
        transfer engine, and its socket."""
        _native, store = self._native, self.store
        buf = ctypes.create_string_buffer(4096)
        _native.call("cxl_uplink_address", self.tier.handle, buf, len(buf))
        self.address = buf.value.decode()
        self._lease = self.tier.lease()
        if _native.lib().cxl_page_trailer_bytes() != TRAILER_BYTES:
            raise UplinkError(f"the library's page trailer is {_native.lib().cxl_page_trailer_bytes()} bytes, "
                              f"this uplink's {TRAILER_BYTES}: library and package are of different versions")
        self.slots = _Slots(store)
        self._mapped, self._mapped_hold = self._mappings()
        if prefault:
            for addr, length in self._mapped:
                _populate(addr, length)
        if store is not None:
            for i, (addr, length) in enumerate(self._mapped):
                if store.register_buffer(addr, length) != 0:
                    raise UplinkError(f"mooncake: register_buffer of tier device {i} ({length} bytes) failed; "
                                      "on RDMA, back the tier with huge pages or devdax (docs/operations.md)")
                self._registered.append(addr)
        self._sock, self._lock_fd = _bind_socket(self.address)

    def _undo(self):
        """Gives back what the uplink took, in reverse: the transfer engine's
        registrations, the mappings' hold, then the tier (whose detach would
        otherwise wait for that hold)."""
        if self.store is not None:
            for addr in self._registered:
                self.store.unregister_buffer(addr)
            if self.slots is not None:
                self.slots.unregister(self.store)
        self._registered = []
        if self._mapped_hold is not None:
            self._native.call("cxl_tier_release", self._mapped_hold)
            self._mapped_hold = None
        self.tier.close()

    def _mappings(self):
        """(address, length) of each device mapping of the tier in this
        process: what the transfer engine registers, so that puts read and
        gets write tier memory in place; and the hold on the tier that keeps
        them mapped until close gives it back (after unregistering them)."""
        n, hold = ctypes.c_int64(), ctypes.c_uint64()
        ptrs, lens = (ctypes.c_void_p * 64)(), (ctypes.c_int64 * 64)()
        self._native.call("cxl_tier_mappings", self.tier.handle, ptrs, lens, 64, ctypes.byref(n), ctypes.byref(hold))
        return [(ptrs[i], lens[i]) for i in range(n.value)], hold.value

    # The cluster's health. A Mooncake call to a master that stopped
    # answering (a partition, a stalled host) does not return for minutes,
    # and one to a master that is gone fails at once: either way, after a
    # failure, or while any call has been out longer than it may take (STALL
    # seconds, and a second more for every STALL_RATE bytes it moves), the
    # cluster counts as down and fills answer at once as failed (local
    # misses) until a probe succeeds again. Down stays down until then: a
    # timed return would let the next misses wait on a dead master again,
    # and /metrics would say up between probes.

    STALL = 1.0
    STALL_RATE = 100 << 20

    def cluster_up(self):
        return self.store is not None and not self._cluster_down

    def _cluster_failed(self, what, err=None):
        self.metrics.add("remote_errors")
        was_up, self._cluster_down = self.cluster_up(), True
        if was_up:
            logger.warning("cxltier uplink: cluster %s failed%s; the cluster counts as down (misses stay local) "
                           "until the master answers a probe", what, f": {err}" if err else "")
        else:  # a probe, or a call begun before the cluster went down: said once above
            logger.debug("cxltier uplink: cluster %s failed%s", what, f": {err}" if err else "")

    def _call(self, what, fn, *args, nbytes=0):
        """A Mooncake call moving nbytes, watched for stalls; an exception
        is counted, marks the cluster down and comes back as None."""
        token = object()
        with self._calls_lock:
            self._calls[token] = (time.monotonic() + self.STALL + nbytes / self.STALL_RATE, what, time.monotonic())
        try:
            return fn(*args)
        except Exception as e:
            self._cluster_failed(what, e)
            return None
        finally:
            with self._calls_lock:
                del self._calls[token]

    def _stalled(self):
        """How long the most overdue Mooncake call is past its time (<= 0:
        none is), what it is and how long it has been out."""
        with self._calls_lock:
            due, what, started = min(self._calls.values(), default=(None, None, None))
        now = time.monotonic()
        return (-1.0, None, 0.0) if due is None else (now - due, what, now - started)

    def _watch_cluster(self):
        """Marks the cluster down while a call is stalled, and drops (and
        counts) the pages waiting to be written behind meanwhile: the
        write-behind thread may be stuck in the stalled call for minutes,
        and pages queued behind it would go out long after they were
        stored, or never."""
        while not self._stop.wait(0.1):
            late, what, out = self._stalled()
            if late > 0:
                if self.cluster_up():
                    logger.warning("cxltier uplink: Mooncake call %r has been out %.1f s, %.1f s past the %.1f s it "
                                   "may take: the cluster counts as down (misses stay local, pages queued to be "
                                   "written behind are dropped) until the master answers a probe",
                                   what, out, late, out - late)
                self._cluster_down = True
            if not self.cluster_up():
                self._drop_queued()

    def _drop_queued(self):
        n = 0
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
            n += 1
        if n:
            self.metrics.add("dropped_pages", n)

    def _probe_cluster(self):
        """Asks the master about one key every half second while the
        cluster is down; an answer brings it back up."""
        while not self._stop.wait(0.5):
            if self.store is None or self.cluster_up():
                continue
            got = self._call("probe", self.store.batch_is_exist, ["cxltier/probe"])
            if got is not None and all(r >= 0 for r in got) and self._stalled()[0] <= 0:
                self._cluster_down = False
                logger.info("cxltier uplink: cluster answers again")

    def index(self, name):
        """The index called name, opened once (None for a keyed index this
        uplink has no key for)."""
        with self._index_lock:
            ix = self._indexes.get(name)
            if ix is None:
                try:
                    ix = NodeIndex(self.tier, name, self.keys.get(name), self.cluster_key)
                except self._native.DeniedError:
                    return None
                self._indexes[name] = ix
            return ix

    # Serving the node's processes.

    def serve_forever(self):
        self._spawn(self._accept)
        self._spawn(self._write_behind)
        self._spawn(self._watch_cluster)
        self._spawn(self._probe_cluster)
        # A timed wait: SIGTERM may land on any thread (the Go runtime's
        # threads do not block it), and then only the main thread's return
        # to the interpreter runs the handler; an untimed wait never returns.
        # The handler only sets a flag (signal_stop): acting on it here,
        # outside the handler, nothing is re-entered when a second signal
        # interrupts the first's handling.
        next_check = 0.0
        while not self._stop.wait(0.2):
            if self._signalled:
                self.stop()
            elif time.monotonic() >= next_check:
                next_check = time.monotonic() + 1.0
                self._check_tier()
                if self.events is not None and self.events.failure and not self.stopped_because:
                    # The stream stopped for good: the uplink stops too, and a
                    # supervisor starts a fresh one, stream and all.
                    self.stopped_because = f"the KV event stream stopped ({self.events.failure})"
                    logger.error("cxltier uplink: %s; stopping", self.stopped_because)
                    self.stop()

    def unhealthy(self):
        """Why the uplink does not serve as it should, "" while it does: its
        KV event stream stopped (a router would keep the node's last view),
        or its tier was replaced under it."""
        if self.stopped_because:
            return self.stopped_because
        if self.events is not None and not self.events.alive():
            return f"the KV event stream stopped ({self.events.failure or 'not running'})"
        return ""

    def signal_stop(self, *_):
        """The SIGTERM/SIGINT handler: sets a flag that serve_forever acts on."""
        self._signalled = True

    _lease = None  # (slot, generation) of the uplink's lease, taken at start
    stopped_because = None  # why the uplink stopped on its own (its tier replaced, its event stream gone): exit 3

    def _check_tier(self):
        """Stops the uplink when its tier was destroyed or formatted again
        under it (it would serve a tier no process uses, and the node's new
        tier would get no cluster fills), or its lease was reaped."""
        buf = ctypes.create_string_buffer(1024)
        try:
            self._native.call("cxl_tier_replaced", self.tier.handle, buf, len(buf))
        except self._native.CxlTierError as e:
            logger.warning("cxltier uplink: checking the tier: %s", e)
            return
        if buf.value:
            self.stopped_because = buf.value.decode()
            logger.error("cxltier uplink: %s; stopping (start the uplink again to serve the new tier)", self.stopped_because)
            self.stop()
            return
        try:
            lost = self._lease is not None and self.tier.lease_gone(*self._lease)
        except self._native.CxlTierError as e:
            logger.warning("cxltier uplink: checking its lease: %s", e)
            return
        if lost:
            # Reaped (stalled past its lease, or judged so): the tier may
            # have handed its blocks on, so it writes nothing more; with no
            # fill traffic it used to run on, dropping every write-behind
            # page while /healthz said ok.
            self.stopped_because = (f"this uplink's lease on the tier (slot {self._lease[0]}) was reaped: it stalled "
                                    "past the lease timeout, or the daemon judged it so")
            logger.error("cxltier uplink: %s; stopping (a supervisor starts it again)", self.stopped_because)
            self.stop()

    def _spawn(self, fn, *args):
        t = threading.Thread(target=fn, args=args, daemon=True, name=f"uplink-{fn.__name__}")
        t.start()
        self._threads.append(t)

    def stop(self):
        self._stop.set()
        with self._conns_lock:
            conns = list(self._conns.values())
        for c in conns:  # wakes the threads waiting for their clients' next message
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._sock is None:
            return
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        except OSError:
            pass
        try:
            self._sock.close()
        except OSError:
            pass

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            if not _trusted_peer(conn):
                conn.close()
                continue
            t = threading.Thread(target=self._serve_conn, args=(conn,), daemon=True, name="uplink-conn")
            with self._conns_lock:
                self._conns[t] = conn
            t.start()

    def _serve_conn(self, conn):
        try:
            self._serve(conn)
        finally:
            with self._conns_lock:
                self._conns.pop(threading.current_thread(), None)

    def _serve(self, conn):
        with conn:
            while not self._stop.is_set():
                try:
                    msg = conn.recv(_MAX_MESSAGE)
                except OSError:
                    return
                if not msg:
                    return
                try:
                    op, name, keys = parse_request(msg)
                except ValueError as e:
                    logger.warning("cxltier uplink: %s", e)
                    return
                if op == OP_STORED:
                    self._enqueue(name, keys)
                    continue
                try:
                    filled, failed = self.fill(name, keys)
                except self._native.ClosedError as e:
                    # The lease is gone (this process was reaped while
                    # stalled): its reservations are another's now. Stop;
                    # the supervisor starts a fresh uplink.
                    logger.error("cxltier uplink: %s; stopping", e)
                    self.stop()
                    return
                except Exception:
                    logger.exception("cxltier uplink: fill of %d keys of %r failed", len(keys), name)
                    filled, failed = 0, True
                try:
                    conn.send(reply(filled, failed))
                except OSError:
                    return

    def _enqueue(self, name, keys):
        if self.store is not None and not self.cluster_up():
            self.metrics.add("dropped_pages", len(keys))  # the cluster is down: never queued behind a stalled call
            return
        for k in keys:
            try:
                self.queue.put_nowait((name, k))
            except queue.Full:
                self.metrics.add("dropped_pages")

    # Write-behind. A page whose put failed (a peer's segment that died and
    # the master has not yet dropped) is tried again after RETRY_AFTER
    # seconds, at most RETRIES times; the retries wait beside the queue,
    # not in it, so they never push new pages out.

    RETRY_AFTER = (1.0, 4.0, 16.0)

    def _write_behind(self):
        retry = deque()  # (due, name, key, tries)
        while not self._stop.is_set():
            batch = []
            now = time.monotonic()
            while retry and retry[0][0] <= now and len(batch) < self.batch:
                _, name, k, tries = retry.popleft()
                batch.append((name, k, tries))
            try:
                if not batch:
                    name, k = self.queue.get(timeout=0.2)
                    batch.append((name, k, 0))
            except queue.Empty:
                continue
            while len(batch) < self.batch:
                try:
                    name, k = self.queue.get_nowait()
                except queue.Empty:
                    break
                batch.append((name, k, 0))
            by_index = {}
            for name, k, tries in batch:
                by_index.setdefault(name, []).append((k, tries))
            for name, items in by_index.items():
                try:
                    failed = set(self.put(name, [k for k, _ in items]))
                except Exception:
                    logger.exception("cxltier uplink: write-behind of %d pages of %r failed", len(items), name)
                    failed = {k for k, _ in items}
                for k, tries in items:
                    if k not in failed:
                        continue
                    if tries < len(self.RETRY_AFTER):
                        retry.append((time.monotonic() + self.RETRY_AFTER[tries], name, k, tries + 1))
                    else:
                        self.metrics.add("dropped_pages")

    def put(self, name, keys):
        """Writes keys' pages of index name to the cluster, read in place;
        returns the keys whose put failed and may be tried again."""
        keys = [k for k in keys if self.admit(name, k)]
        ix = self.index(name)
        if ix is None:
            self.metrics.add("denied_pages", len(keys))
            return []
        if not keys or self.store is None:
            return []
        if not self.cluster_up():
            self.metrics.add("remote_errors")
            return keys
        ckeys = ix.cluster_keys(keys)
        have = self._call("batch_is_exist", self.store.batch_is_exist, ckeys)
        if have is None:
            return keys
        if any(h < 0 for h in have):
            self._cluster_failed("batch_is_exist", f"codes {sorted(set(h for h in have if h < 0))}")
            return keys
        todo = [i for i, h in enumerate(have) if h != 1]
        self.metrics.add("put_skipped_pages", len(keys) - len(todo))
        if not todo:
            return []
        h, hits, trailers = ix.pin([keys[i] for i in todo])  # pages evicted since are gone: nothing to put
        apart = [hit for hit in hits if not hit[3]]
        slots = self.slots.take(len(apart)) if apart else []
        try:
            if not hits:
                return []
            if slots is None:
                return [keys[todo[j]] for j, *_ in hits]
            # A page whose block had room has its trailer right after it
            # (Go wrote it there under the pin, flushed) and goes as one
            # piece; the others go as two, the trailer from registered
            # memory.
            one, two, free = [], [], iter(slots)
            for j, addr, length, inplace in hits:
                if inplace:
                    one.append((j, addr, length + TRAILER_BYTES, length))
                else:
                    slot = next(free)
                    self.slots.put(slot, trailers[j * TRAILER_BYTES:(j + 1) * TRAILER_BYTES])
                    two.append((j, [addr, self.slots.addr(slot)], [length, TRAILER_BYTES], length))
            cfg = _replicate_config(self.replicas)
            failed, sent = [], 0
            for group, what in ((one, "batch_put_from"), (two, "batch_put_from_multi_buffers")):
                if not group:
                    continue
                res = self._call(what, getattr(self.store, what), [ckeys[todo[j]] for j, *_ in group],
                                 [p for _, p, _, _ in group], [s for _, _, s, _ in group], cfg,
                                 nbytes=sum(length for *_, length in group))
                res = res if res is not None else [-1] * len(group)
                for (j, _, _, length), r in zip(group, res):
                    if r == 0:
                        sent += length
                    else:
                        failed.append(keys[todo[j]])
            if failed:
                self.metrics.add("remote_errors")
            self.metrics.add("put_pages", len(hits) - len(failed))
            self.metrics.add("put_bytes", sent)
            return failed
        finally:
            if slots:
                self.slots.give(slots)
            ix.unpin(h)

    # Miss-fill.

    def fill(self, name, keys):
        """Brings keys of index name into the tier from the cluster, in
        order; returns (leading keys present now, failed)."""
        self.metrics.add("fill_requests")
        ix = self.index(name)
        if ix is None:
            self.metrics.add("denied_pages", len(keys))
            self.metrics.add("fill_failures")
            return 0, True
        have = ix.present(keys)
        if have == len(keys) or self.store is None:  # no cluster: a plain miss
            return have, False
        if not self.cluster_up():
            self.metrics.add("fill_failures")
            return have, True
        if not self._fill_slots.acquire(timeout=self.fill_timeout):
            self.metrics.add("fill_failures")
            return have, True
        try:
            failed = self._fill_missing(ix, keys[have:])
        except self._native.ClosedError:
            raise  # the lease is gone: the serve loop stops
        except Exception:
            # Parts published before the failure are in the tier: the
            # answer counts them, so the reader need not ask again.
            logger.exception("cxltier uplink: fill of %d keys of %r failed", len(keys), name)
            failed = True
        finally:
            self._fill_slots.release()
        if failed:
            self.metrics.add("fill_failures")
        return ix.present(keys), failed

    def _fill_missing(self, ix, keys):
        ckeys = ix.cluster_keys(keys)
        mine, theirs = [], []
        flight = _Flight(time.monotonic() + self.fill_timeout + self.STALL)
        with self._inflight_lock:
            for i, ck in enumerate(ckeys):
                other = self._inflight.get(ck)
                if other is None:
                    self._inflight[ck] = flight
                    mine.append(i)
                else:
                    theirs.append(other)
        failed = False
        try:
            if mine:
                failed = self._fetch(ix, [keys[i] for i in mine], [ckeys[i] for i in mine], flight)
        except BaseException:
            failed = True
            raise
        finally:
            with self._inflight_lock:
                for i in mine:
                    self._inflight.pop(ckeys[i])
            flight.land(failed)
        if theirs:
            self.metrics.add("joined_pages", len(theirs))
            for other in dict.fromkeys(theirs):  # each flight once
                failed |= other.join()
        return failed

    def _fetch(self, ix, keys, ckeys, flight=None):
        """One fetch batch: the leading run of keys the cluster holds and
        their sizes (replica descriptors, one master call), blocks reserved,
        pages written into them by the transfer engine, checked, published.
        Returns whether the cluster failed."""
        started = time.monotonic()
        descs = self._call("batch_get_replica_desc", self.store.batch_get_replica_desc, ckeys)
        if descs is None:
            return True
        sizes = []
        for ck in ckeys:
            size = _replica_size(descs.get(ck))
            if size is None or size <= TRAILER_BYTES:
                break
            if size - TRAILER_BYTES > ix.room:
                # No page of this index is that large: a damaged or planted
                # object under its key. A miss from here on, not a failed fill.
                self.metrics.add("rejected_pages")
                logger.warning("cxltier uplink: %s holds %d bytes in the cluster, more than a page of index %r "
                               "can be (%d): not fetched (a miss)", ck, size - TRAILER_BYTES, ix.name, ix.room)
                break
            sizes.append(size - TRAILER_BYTES)
        if not sizes:
            # A master that is gone answers the descriptor query with
            # nothing, as it does for absent keys: ask it the one way that
            # tells the two apart.
            have = self._call("batch_is_exist", self.store.batch_is_exist, ckeys[:1])
            if have is None or have[0] < 0:
                if have is not None:
                    self._cluster_failed("batch_is_exist", f"code {have[0]}")
                return True
            return False
        keys, ckeys = keys[: len(sizes)], ckeys[: len(sizes)]
        if flight is not None:  # those who joined wait as long as this fetch may take
            flight.extend(time.monotonic() + self.STALL + sum(sizes) / self.STALL_RATE + self.fill_timeout)
        asked = time.monotonic()
        parts = _parts(sizes, self.part_bytes)
        done = self._move_parts(ix, keys, ckeys, sizes, parts)
        cluster_failed = any(d.cluster_failed for d in done) or len(done) < len(parts)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("fetch of %d pages in %d part(s): master %.2f ms, reserve %.2f ms, transfer %.2f ms, "
                         "check and publish %.2f ms (%.2f ms of it after the last transfer), all %.2f ms",
                         len(keys), len(parts), (asked - started) * 1e3, sum(d.reserve_s for d in done) * 1e3,
                         sum(d.transfer_s for d in done) * 1e3, sum(d.publish_s for d in done) * 1e3,
                         done[-1].publish_s * 1e3 if done else 0.0, (time.monotonic() - started) * 1e3)
        refused = sum(1 for d in done for f, p in zip(d.filled or [], d.published) if f and not p)
        if refused:
            self._say_refused(ix, refused)
        for d in done:
            self.metrics.add("rejected_pages", sum(1 for f, p in zip(d.filled or [], d.published) if f and not p))
            self.metrics.add("fetched_pages", sum(d.published))
            self.metrics.add("fetched_bytes", sum(sz for sz, p in zip(d.sizes, d.published) if p))
        self.metrics.fetch_took(time.monotonic() - started)
        return cluster_failed

    REFUSED_EVERY = 60.0  # seconds between warnings of pages refused at their check

    def _say_refused(self, ix, n):
        """Warns, at most once a minute, that pages failed their check:
        with every page of a node refused, it is the first thing to read."""
        self._refused_since_said = getattr(self, "_refused_since_said", 0) + n
        now = time.monotonic()
        if now < getattr(self, "_refused_said_at", -self.REFUSED_EVERY) + self.REFUSED_EVERY:
            return
        key = ("this uplink has one" if self.cluster_key else
               "this uplink has none, and takes pages by their CRC alone")
        logger.warning("cxltier uplink: %d page(s) of index %r from the cluster failed their check and were refused "
                       "(%d since the last warning): damaged in the cluster or in transit, or signed with another "
                       "cluster key: every uplink needs the same --cluster-key (%s)",
                       n, ix.name, self._refused_since_said, key)
        self._refused_said_at, self._refused_since_said = now, 0

    def _move_parts(self, ix, keys, ckeys, sizes, parts):
        """Moves and publishes a fetch's parts in order. While one part is
        checked and published (on every core, in a helper thread), the
        transfer engine writes the next; the last part is published on
        this thread, so a fetch in one part starts no thread. A part the
        cluster failed ends the fetch: the parts before it are published.
        Returns the parts moved, each published."""
        from concurrent.futures import ThreadPoolExecutor

        done, pending, publisher = [], None, None
        try:
            for n, (lo, hi) in enumerate(parts):
                moved = self._move(ix, keys[lo:hi], ckeys[lo:hi], sizes[lo:hi])
                if pending is not None:
                    done.append(pending.result())
                    pending = None
                if moved is None:
                    break
                if n == len(parts) - 1 or moved.cluster_failed:
                    done.append(self._publish(moved))
                    break
                if publisher is None:
                    publisher = ThreadPoolExecutor(1, thread_name_prefix="cxltier-uplink-publish")
                pending = publisher.submit(self._publish, moved)
        finally:
            if pending is not None:
                done.append(pending.result())
            if publisher is not None:
                publisher.shutdown()
        return done

    def _move(self, ix, keys, ckeys, sizes):
        """Reserves blocks for keys and has the transfer engine write their
        pages into them: a _Moved to publish (which closes its fill), or
        None when the trailer slots ran out."""
        t0 = time.monotonic()
        fill = ix.begin_fill(keys, sizes)
        try:
            moved = _Moved(fill, sizes)
            moved.reserve_s = time.monotonic() - t0
            take = fill.reserved
            if not take:
                return moved
            apart = [i for i in take if not ix.fits(sizes[i])]
            moved.slots = self.slots.take(len(apart)) if apart else []
            if moved.slots is None:
                fill.close()
                return None
            t1 = time.monotonic()
            try:
                moved.filled, moved.trailers, moved.cluster_failed = self._transfer(
                    fill, take, apart, moved.slots, ckeys, sizes)
            except BaseException:
                self.slots.give(moved.slots)
                raise
            moved.transfer_s = time.monotonic() - t1
            return moved
        except BaseException:
            fill.close()
            raise

    def _publish(self, moved):
        """Checks and publishes a moved part's pages (Go checks each page
        against its trailer), then gives its fill and slots back."""
        t0 = time.monotonic()
        try:
            if moved.filled is not None:
                _test_pause("CXLTIER_UPLINK_TEST_PAUSE_BEFORE_PUBLISH")
                moved.published = moved.fill.commit(moved.filled, moved.trailers)
        finally:
            moved.fill.close()
            if moved.slots:
                self.slots.give(moved.slots)
        moved.publish_s = time.monotonic() - t0
        return moved

    def _transfer(self, fill, take, apart, slots, ckeys, sizes):
        """Has the transfer engine write the reserved keys' pages (and
        trailers) into the fill's blocks: a page whose block has room lands
        with its trailer in one piece, the others in two, the trailer into
        registered memory. Returns (filled, trailer addresses, whether the
        cluster failed)."""
        addrs = fill.blocks()  # the lease is checked here: a reaped client's blocks may be another's
        # A fill is bulk traffic on the node's link: with the tier on the
        # link (CXLTIER_LINK), it gives way while a deadline is due.
        self.tier.link_turn(sum(sizes[i] for i in take))
        self._transfers += 1
        _test_raise("CXLTIER_UPLINK_TEST_RAISE_IN_TRANSFER", self._transfers)
        n = len(addrs)
        filled, trailers, cluster_failed = [False] * n, [None] * n, False
        one = [i for i in take if i not in set(apart)]
        two = list(zip(apart, slots))
        got = {}
        if one:
            res = self._call("batch_get_into", self.store.batch_get_into, [ckeys[i] for i in one],
                             [addrs[i] for i in one], [sizes[i] + TRAILER_BYTES for i in one],
                             nbytes=sum(sizes[i] for i in one))
            cluster_failed |= res is None
            got.update(zip(one, res if res is not None else [-1] * len(one)))
        if two:
            res = self._call("batch_get_into_multi_buffers", self.store.batch_get_into_multi_buffers,
                             [ckeys[i] for i, _ in two], [[addrs[i], self.slots.addr(s)] for i, s in two],
                             [[sizes[i], TRAILER_BYTES] for i, _ in two], nbytes=sum(sizes[i] for i, _ in two))
            cluster_failed |= res is None
            got.update(zip((i for i, _ in two), res if res is not None else [-1] * len(two)))
            for i, s in two:
                trailers[i] = self.slots.addr(s)
        for i in take:
            r = got[i]
            if r == sizes[i] + TRAILER_BYTES:
                filled[i] = True  # Go checks the page against its trailer at commit
            elif r < 0:
                if not cluster_failed:
                    self.metrics.add("remote_errors")
            else:
                self.metrics.add("rejected_pages")
        return filled, trailers, cluster_failed

    def close(self, wait=10.0):
        """Stops the uplink, waits (up to wait seconds) for its threads, so
        that no transfer still reads or writes tier memory, unregisters the
        tier from the transfer engine, gives the mapping's hold back and
        detaches. A thread that does not stop in time keeps the tier mapped
        (it goes with the process)."""
        self.stop()
        if self.events is not None:
            self.events.stop()
        deadline = time.monotonic() + wait
        with self._conns_lock:
            threads = list(self._threads) + list(self._conns)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in threads if t.is_alive()]
        _unbind_socket(self.address, self._lock_fd)
        self._lock_fd = None
        if stuck:
            logger.error("cxltier uplink: %s did not stop within %.0f s; the tier stays mapped under them", stuck, wait)
            return False
        self._undo()
        return True


_MADV_POPULATE_WRITE = 23  # Linux 5.14


def _populate(addr, length):
    """Faults the whole mapping in once, writable, without changing a byte
    (madvise MADV_POPULATE_WRITE): a transfer into never-touched tier pages
    otherwise pays a page fault every 4 KiB, which halved the rate of
    fetches on loopback. Kernels without it skip this, with a warning."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    started = time.monotonic()
    if libc.madvise(addr, length, _MADV_POPULATE_WRITE) != 0:
        logger.warning("cxltier uplink: prefaulting the tier failed (%s); first transfers into each page are slower",
                       os.strerror(ctypes.get_errno()))
        return
    logger.info("cxltier uplink: prefaulted %d MiB of tier in %.2f s", length >> 20, time.monotonic() - started)


def _test_raise(var, call=1):
    """A failure the tests inject between a fill's reserve and its commit,
    at the var'th call (counted by the caller) and every one after it;
    unset in production."""
    at = os.environ.get(var)
    if at and call >= int(at):
        raise RuntimeError(f"{var}: a failure injected by a test")


def _test_pause(var):
    """A pause the tests use to kill the uplink at a known point (a crash
    mid-fetch); unset in production."""
    pause = os.environ.get(var)
    if pause:
        time.sleep(float(pause))


def registered(tier, wait=0.0):
    """(True, "") once this process's client of tier has proved who it is to
    its node's daemon, else (False, why), waiting up to wait seconds."""
    from .. import _native

    deadline = time.monotonic() + wait
    yes, buf = ctypes.c_int(), ctypes.create_string_buffer(1024)
    while True:
        _native.call("cxl_tier_registered", tier.handle, ctypes.byref(yes), buf, len(buf))
        if yes.value or time.monotonic() >= deadline:
            return bool(yes.value), buf.value.decode()
        time.sleep(0.05)


def _warn_without_daemon(up):
    """A node with an uplink needs its daemon: says so when none answers.
    An uplink that stops within the wait has nothing to be told."""
    from .. import _native

    try:
        ok, why = registered(up.tier, wait=2.0)
    except _native.ClosedError:
        return  # the uplink stopped and detached meanwhile
    if not ok:
        logger.warning("cxltier uplink: this node's cxltierd does not know this uplink (%s). Run cxltierd on every "
                       "node with an uplink: without it, blocks an uplink reserved when it died stay reserved until "
                       "a process that can see it is gone inserts those keys again or `cxltier repair` runs, and a "
                       "stalled uplink is never ended", why)


def _bind_socket(path):
    """Binds the node uplink's socket at path and returns it with the lock
    that makes this process the node's one uplink: a lock file beside the
    socket, held (flock) for the uplink's life and let go by the kernel
    when it dies, so a socket a dead uplink left is replaced and a live
    uplink's is refused."""
    lock = _lock_file(path + ".lock")
    try:
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)  # a dead uplink's: the lock says none runs
    except FileNotFoundError:
        pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        _bind_long(s, path)
        _share_socket(path)
        s.listen(64)
    except (OSError, UplinkError) as e:
        s.close()
        os.close(lock)
        raise UplinkError(f"uplink: cannot bind {path}: {e}") from e
    return s, lock


def _bind_long(sock, path):
    """Binds sock at path however long it is: a path past sockaddr_un's 107
    bytes is reached through an O_PATH descriptor of its directory
    (/proc/self/fd/N/NAME), as the library dials it."""
    if len(os.fsencode(path)) <= 107:
        sock.bind(path)
        return
    d = os.open(os.path.dirname(path), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        sock.bind(f"/proc/self/fd/{d}/{os.path.basename(path)}")
    finally:
        os.close(d)


def _clear_squatter(path):
    """Removes what another user put at path (any user may create files in
    a shared directory such as /dev/shm while no uplink runs, and a lock
    file they hold would keep every uplink out): anything there not owned
    by root or this process's user, or a link. Says so; an error when it
    cannot be removed."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISLNK(st.st_mode) and st.st_uid in (0, os.geteuid()):
        return
    try:
        os.unlink(path)
    except OSError as e:
        raise UplinkError(f"uplink: {path} belongs to uid {st.st_uid}, neither root nor this user, and cannot be "
                          f"removed: {e} (set CXLTIER_SOCKET_DIR to a directory only the tier's owner may write)") from e
    logger.warning("cxltier uplink: removed %s, which uid %d (neither root nor this user) had put in the way",
                   path, st.st_uid)


def _lock_file(lock_path):
    """Opens and takes (flock, without waiting) the lock file, as one whose
    path still names it: a closing uplink removes its lock file, so one
    opened just before that is tried again."""
    _clear_squatter(lock_path)
    for _ in range(3):
        try:
            lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as e:
            raise UplinkError(f"uplink: cannot create {lock_path}: {e} (set CXLTIER_SOCKET_DIR to a directory "
                              "this user may write and the node's processes share)") from e
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(lock)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise UplinkError(f"uplink: another uplink serves this tier's node (it holds {lock_path})") from None
            raise UplinkError(f"uplink: lock {lock_path}: {e}") from e
        try:
            if os.stat(lock_path).st_ino == os.fstat(lock).st_ino:
                return lock
        except FileNotFoundError:
            pass
        os.close(lock)
    raise UplinkError(f"uplink: {lock_path} keeps changing under this uplink (another uplink starting and stopping?)")


def _unbind_socket(path, lock):
    """Removes the socket and its lock file (while this uplink holds the
    lock, both paths are its own), then lets the lock go."""
    if lock is None:
        return
    for p in (path, path + ".lock"):
        try:
            os.unlink(p)
        except OSError:
            pass
    os.close(lock)


def _trusted_peer(conn):
    """Whether the peer runs as this user or root, or with the group
    CXLTIER_SHARED_GROUP names as its own (a member may write the tier
    anyway): the kernel's word (SO_PEERCRED), as the Go library checks the
    uplink."""
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, gid = struct.unpack("3i", creds)
    except OSError:
        return False
    shared = _shared_gid()
    return uid in (os.geteuid(), 0) or (shared is not None and gid == shared)


def _shared_gid():
    """CXLTIER_SHARED_GROUP's gid (it names a group or a gid), or None."""
    name = os.environ.get("CXLTIER_SHARED_GROUP", "")
    if not name:
        return None
    if name.isdigit():
        return int(name)
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise UplinkError(f"CXLTIER_SHARED_GROUP={name!r}: no such group") from None


def _share_socket(path):
    """Lets the shared group's processes connect (connecting takes write
    permission on the socket), as cxltierd shares its own socket."""
    gid = _shared_gid()
    if gid is None:
        return
    try:
        os.chown(path, -1, gid)
        os.chmod(path, 0o660)
    except OSError as e:
        raise UplinkError(f"uplink: share {path} with group {gid} (CXLTIER_SHARED_GROUP): {e}") from e


def _replicate_config(replicas):
    from mooncake.store import ReplicateConfig

    cfg = ReplicateConfig()
    cfg.replica_num = replicas
    return cfg


def _admission(rule):
    """The write-behind admission rule: "all" (every stored page), "none"
    (fill only: this node reads the cluster and writes nothing to it), or
    "index:A,B" (only the pages of those indexes)."""
    if rule == "all":
        return lambda name, key: True
    if rule == "none":
        return lambda name, key: False
    if rule.startswith("index:") and rule[6:]:
        allowed = set(rule[6:].split(","))
        return lambda name, key: name in allowed
    raise ValueError(f"--admit {rule!r}: use all, none or index:NAME[,NAME...]")


def _private_file(flag, path):
    """Refuses a key file others may read, or its group unless that group is
    CXLTIER_SHARED_GROUP's: a Kubernetes Secret a non-root uplink reads is
    root's and the pod's fsGroup's, 0440."""
    st = os.stat(path)
    if st.st_mode & 0o007 or (st.st_mode & 0o070 and st.st_gid != _shared_gid()):
        raise UplinkError(f"{flag} {path}: readable by group or others (chmod 600 it, or give it "
                          f"CXLTIER_SHARED_GROUP's group)")


def _cluster_key_file(path):
    """The cluster's key: the bytes of a file readable by its owner alone."""
    if not path:
        return None
    _private_file("--cluster-key", path)
    with open(path, "rb") as f:
        key = f.read().strip()
    if len(key) < 16:
        raise UplinkError(f"--cluster-key {path}: {len(key)} bytes; use at least 16 (openssl rand -hex 32 > FILE)")
    return key


def _keys_file(path):
    """index=key lines (a tenant's key per keyed index); # starts a comment."""
    if not path:
        return {}
    _private_file("--keys", path)
    out = {}
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, key = line.partition("=")
            if not sep or not name.strip() or not key.strip():
                raise UplinkError(f"--keys {path}:{n}: want INDEX=KEY")
            out[name.strip()] = key.strip()
    return out


def connect_mooncake(master, protocol="tcp", metadata="P2PHANDSHAKE", hostname="127.0.0.1",
                     segment_size=1 << 30, local_buffer=16 << 20, rdma_devices=""):
    """A Mooncake Store client, set up; UplinkError with the reason when it
    cannot be."""
    store = _mooncake_store_class()()
    cfg = {"local_hostname": hostname, "metadata_server": metadata, "global_segment_size": segment_size,
           "local_buffer_size": local_buffer, "protocol": protocol, "master_server_addr": master}
    if rdma_devices:
        cfg["rdma_devices"] = rdma_devices
    if store.setup(cfg) != 0:
        raise UplinkError(f"mooncake: setup against master {master} ({protocol}, metadata {metadata}) failed; "
                          "is mooncake_master running there?")
    logger.info("cxltier uplink: joined the cluster at %s; Mooncake's \"Local segment descriptor not found\" "
                "line above comes with every healthy setup (its client looks this node's segment up before "
                "publishing it) and needs nothing done", master)
    return store


def _mooncake_store_class():
    """Mooncake's store client class; UplinkError with the install line
    when this Python lacks it."""
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        raise UplinkError(f"mooncake is not installed ({e}): pip install mooncake-transfer-engine "
                          "(mooncake-transfer-engine-non-cuda on machines without CUDA; it needs "
                          "libibverbs1 and librdmacm1 even for TCP)") from e
    return MooncakeDistributedStore


def serve_metrics(uplink, addr):
    host, _, port = addr.rpartition(":")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/metrics":
                body = (uplink.metrics.text(uplink.queue.qsize(), uplink.cluster_up(), uplink.slots.free())
                        + _events_text(uplink.events)).encode()
                ctype = "text/plain; version=0.0.4"
            elif self.path == "/healthz":
                why = uplink.unhealthy()
                if why:
                    self._answer(503, f"unhealthy: {why}\n".encode(), "text/plain")
                    return
                body, ctype = b"ok\n", "text/plain"
            else:
                self.send_error(404)
                return
            self._answer(200, body, ctype)

        def _answer(self, code, body, ctype):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer((host or "127.0.0.1", int(port)), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True, name="uplink-metrics").start()
    return srv


_EVENT_COUNTERS = {
    "batches": "KV event batches published (heartbeats included)",
    "stored": "pages announced as stored",
    "removed": "pages announced as removed",
    "unparented": "pages not announced: recorded without their parent (set hicache_storage_pass_prefix_keys)",
    "damaged": "token records skipped as damaged",
    "replays": "replay requests answered",
    "snapshots": "replays answered with the current contents (older than the replay buffer)",
}


def _events_text(stream):
    if stream is None:
        return ""
    out = []
    for name, doc in _EVENT_COUNTERS.items():
        out += [f"# HELP cxltier_uplink_events_{name}_total {doc}", f"# TYPE cxltier_uplink_events_{name}_total counter",
                f"cxltier_uplink_events_{name}_total {stream.stats[name]}"]
    return "\n".join(out) + "\n"


def _master_address(text):
    """(host, port) of --master; ValueError naming the form otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--master {text!r}: want HOST:PORT, mooncake_master's address (10.0.0.1:50051)")
    return host.strip("[]"), int(port)


def _probe_master(host, port, timeout=3.0):
    """A TCP connect to the master first: Mooncake's own client retries for
    about 100 s, with a log line each time, before it gives up."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as e:
        raise UplinkError(f"no mooncake_master answers at {host}:{port} ({e}): start it there, or fix --master") from None


def _master_reachable(host, port):
    try:
        _probe_master(host, port, timeout=1.0)
    except UplinkError:
        return False
    return True


def _check_tier(devices):
    """Attach and detach the tier before joining a cluster: a tier that is
    not there is reported at once, not after the cluster setup."""
    from ..tier import Tier

    Tier(devices, name="cxltier-uplink").close()


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows every option's default, except where its help already
    says it or there is none to show."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default in (None, False, "", argparse.SUPPRESS):
            return text
        return super()._get_help_string(action)


def main(argv=None):
    p = argparse.ArgumentParser(prog="cxltier-uplink", description="Join this node's cxltier tier to a cluster "
                                "through Mooncake Store (one process per node).", formatter_class=_Help)
    p.add_argument("--tier", required=True, help="the tier's devices, as cxltierd takes them (shm:cxltier)")
    p.add_argument("--master", help="mooncake_master HOST:PORT; without it the uplink serves no cluster")
    p.add_argument("--protocol", default="tcp", choices=["tcp", "rdma"], help="how Mooncake moves pages between nodes")
    p.add_argument("--metadata", default="P2PHANDSHAKE", help="Mooncake metadata: P2PHANDSHAKE or a metadata server URL")
    p.add_argument("--hostname", default=None, help="this node's address as other nodes reach it (default: the host's name)")
    p.add_argument("--rdma-devices", default="", help="RDMA NICs for --protocol rdma (mlx5_0,mlx5_1)")
    p.add_argument("--segment", default="1GiB",
                   help="memory this node lends to the cluster store: 1GiB, 512MiB (MB/GB are refused as ambiguous; 0: none)")
    p.add_argument("--replicas", type=int, default=1, help="copies of each page in the cluster (2 survives a node)")
    p.add_argument("--admit", default="all", help="which stored pages go to the cluster: all, none, index:A,B")
    p.add_argument("--queue", type=int, default=65536, help="write-behind queue, in pages (full: dropped and counted)")
    p.add_argument("--keys", help="file of INDEX=KEY lines: tenant keys of keyed indexes to serve (mode 0600)")
    p.add_argument("--cluster-key", metavar="FILE",
                   help="the cluster's key (mode 0600, the same on every node): pages sent carry a MAC, and pages "
                        "taken must carry a valid one; without it any process that reaches the master can plant pages")
    p.add_argument("--metrics", help="HOST:PORT for Prometheus text at /metrics")
    p.add_argument("--events", metavar="ENDPOINT",
                   help="publish this tier's KV events (ZMQ PUB, bound here: tcp://*:5557) for routers such as "
                        "Dynamo's KV indexer; works without --master")
    p.add_argument("--events-replay", metavar="ENDPOINT",
                   help="ZMQ ROUTER endpoint answering replay requests (tcp://*:5558): missed batches, or the "
                        "current contents after a restart")
    p.add_argument("--events-index", metavar="A,B",
                   help="indexes to publish (default: every index without a tenant key that has token records); "
                        "a keyed index needs its key in --keys, and one stream carries one tenant's indexes")
    p.add_argument("--events-interval", type=float, default=0.5, help="seconds between scans for changes")
    p.add_argument("--fill-timeout", type=float, default=1.0, help="seconds a fill waits for a fetch it joined")
    p.add_argument("--fill-part", default=None,
                   help="a fetch of at least twice this many bytes (e.g. 32MiB) moves in parts of it, each part "
                        "checked and published while the next transfers; worth it where transfers leave cores "
                        "idle (RDMA), not where TCP and the checks share a few (default: one part, or parts of "
                        "32MiB on a tier that joined the node's link with CXLTIER_LINK, each part a turn on the "
                        "link; 0: one part)")
    p.add_argument("--verbose", action="store_true", help="log every fetch with where its time went")
    p.add_argument("--no-prefault", dest="prefault", action="store_false",
                   help="do not fault the tier's pages in at start (a huge tier on 4 KiB pages takes a while)")
    args = p.parse_args(argv)
    from .._native import CxlTierError

    if args.replicas < 1:
        p.error("--replicas must be at least 1")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        _admission(args.admit)  # a malformed rule is refused before anything starts
        keys = _keys_file(args.keys)
        cluster_key = _cluster_key_file(args.cluster_key)
        segment = parse_size(args.segment)
        try:
            if args.fill_part is not None:
                args.fill_part = parse_size(args.fill_part)
        except ValueError as e:
            raise ValueError(f"--fill-part: {e}") from None
        master = _master_address(args.master) if args.master else None
        _check_tier(args.tier)
        store = None
        if master:
            _mooncake_store_class()  # the install line before any probe
            _probe_master(*master)
            store = connect_mooncake(args.master, args.protocol, args.metadata, args.hostname or socket.gethostname(),
                                     segment, rdma_devices=args.rdma_devices)
        up = Uplink(args.tier, store, replicas=args.replicas, admit=args.admit, queue_pages=args.queue, keys=keys,
                    fill_timeout=args.fill_timeout, prefault=args.prefault, cluster_key=cluster_key,
                    fill_part=args.fill_part)
        if store is not None and cluster_key is None:
            logger.warning("cxltier uplink: no --cluster-key: pages from the cluster are checked for damage but not "
                           "authenticated, so any process that reaches the master can plant pages this node serves")
    except (UplinkError, ValueError, OSError, CxlTierError) as e:
        print(f"cxltier-uplink: {e}", file=sys.stderr)
        return 2
    if args.events:
        from .kvevents import EventStream

        try:
            names = [n for n in (args.events_index or "").split(",") if n] or None
            up.events = EventStream(args.tier, args.events, replay=args.events_replay, indexes=names, keys=keys,
                                    interval=args.events_interval).start()
        except (ValueError, ImportError) as e:
            print(f"cxltier-uplink: --events: {e}", file=sys.stderr)
            up.close()
            return 2
        print(f"cxltier-uplink: KV events on {up.events.endpoint}"
              + (f", replay on {up.events.replay_endpoint}" if up.events.replay_endpoint else ""), flush=True)
    if args.metrics:
        try:
            serve_metrics(up, args.metrics)
        except (OSError, ValueError) as e:
            print(f"cxltier-uplink: --metrics {args.metrics}: {e}", file=sys.stderr)
            up.close()
            return 2
    faulthandler.register(signal.SIGUSR2, all_threads=True)  # kill -USR2: every thread's stack, on stderr
    signal.signal(signal.SIGTERM, up.signal_stop)
    signal.signal(signal.SIGINT, up.signal_stop)
    logger.info("cxltier uplink: serving %s at %s, cluster %s", args.tier, up.address, args.master or "none")
    print(f"cxltier-uplink: serving {args.tier} at {up.address} (cluster: {args.master or 'none'})", flush=True)
    threading.Thread(target=_warn_without_daemon, args=(up,), daemon=True, name="uplink-daemon-check").start()
    up.serve_forever()
    up.close()
    code = 0
    if up.stopped_because:
        print(f"cxltier-uplink: {up.stopped_because}; exiting (start it again)", file=sys.stderr)
        code = 3
    if up.store is not None and not (up.cluster_up() and _master_reachable(*master)):
        # Mooncake's client, torn down at exit, unmounts this node's segment
        # from the master, retrying for about ten seconds against one that
        # is gone. The tier is detached and the socket unbound already.
        logger.info("cxltier uplink: the cluster is down; leaving without Mooncake's teardown")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
