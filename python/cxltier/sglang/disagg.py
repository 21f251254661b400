"""SGLang's prefill-decode disaggregation through the tier (TraCT): the
transfer is the cache insert.

    --disaggregation-mode prefill|decode --disaggregation-transfer-backend cxltier

with the cxltier plugin installed (SGLANG_PLUGINS=cxltier) and, on both
sides, CXLTIER_DEVICES naming the tier they share (shm:cxltier by default)
and CXLTIER_PD_INDEX the prefix index (the model path by default;
CXLTIER_PD_BLOCKS on a prefill creates it when missing, with blocks of one
of its pages; a decode opens it at its first request if not there at its
start).

The prefill worker writes each page of a request's KV (every layer, as
the unified-cache linker lays a page out) into the tier under SGLang's own
page key (the hash chain of the page's tokens, masked by the model, the
pool's geometry, the KV dtype and, for MHA, the TP rank): a page already
there, from an earlier request with the same prefix, is not written again.
The last page, when partial, goes under a key of the request's bootstrap
room and the decode's nonce, and the request's aux data (first token,
logprobs, hidden states) into its room.
The decode worker reads the pages straight into the pages it allocated,
past the prefix it already holds, and the aux data into its metadata
buffer. The two passes overlap: the prefill stores a request's pages a
part at a time (CXLTIER_PD_PUBLISH_MIB of KV, 32 by default), each part
found by its keys once stored, and from its hello on the decode lands
every page it finds while the prefill stores the next part (a page an
earlier request stored, at once). Each part is checked as it lands.

Nothing crosses a network: the two find each other through a room of the
tier's rooms table ("<index>@pd", prefix/rooms in Go), named by the
bootstrap room and the decode's TP rank. At the same TP size rank r of the
prefill serves rank r of the decode. The sizes may differ where one divides
the other (cxltier.sglang.pdranks has the map): a prefill rank serves
decode_tp/prefill_tp decode ranks (the same pages, stored once, and records
in each one's room; an MHA decode rank lands its share of their heads); of
a smaller decode, for MLA, whose latent every rank holds alike, one prefill
rank in prefill_tp/decode_tp serves a decode rank and the others stand by,
and for MHA each of them serves its heads as a part of the decode rank's,
through a room of its own (the decode learns their number from the first
one's accept and claims the others then). A prefill rank learns the
decode's TP size from the hello it finds: the rooms of its own size and of
the last size it served it looks at every poll, those of other sizes
(TP_RATIOS times larger or smaller) every PROBE_EVERY (a hello names its
size, and only the room of the size it names counts); the decode never
needs the prefill's before its first accept. The decode claims the
room, each side writes records of its own in it and ends it when it
concludes, and the second side to end it frees it; nothing evicts a live
room
(CXLTIER_PD_ROOMS rooms in flight, 1024 by default). The records:

- hello (decode): the prefix it holds, its layout and TP size, a nonce of
  its own for this request and its lease; the prefill's bootstrap ends
  when it is there (SGLang's bootstrap timeout bounds it).
- accept (prefill): the hello was answered; the prefill's lease, TP size,
  key suffix and page chunk (the decode reads the pages of that rank).
- done (prefill): the pages are written (or why not: the tier is full),
  with the hello's nonce.
- ack (decode): the pages landed and checked; the prefill's send is over.
- abort (either side): the request went; the other side stops waiting.

A room is SGLang's random id, reused only by accident; a reused room must
never serve the earlier request's KV. So the decode claims a room anew
(the earlier request's handles then fail) before its hello, accepts only
a done record carrying its own nonce, and the partial last page is keyed by the
nonce too (and deleted once landed); the prefill checks, before its done,
that the hello it answered is still the room's.

Every wait is bounded by SGLang's own timeouts, and ends sooner when the
other side's process is gone: each side names its lease on the tier in its
records, and the waiting side asks the tier about it (a quarter of a
second apart): a process that closed its client or was reaped, or on one
host one that no longer runs, fails the request at once. A page whose
checksum fails on the decode side fails the request (never damaged KV). The decode
side needs no bootstrap server; SGLang's prefill starts the no-op one here.

Served: MHA and MLA KV pools of one pipeline stage, at any two TP sizes
one of which divides the other, as SGLang's mooncake backend serves them.
An MHA page holds a rank's KV heads: where the sizes differ, a decode rank
lands its heads of each prefill rank's page (a share of them, or all of
them as a part of its own; pdranks.head_placement) through a staging copy
checked before any row of it reaches the pool. Hybrid state (SWA, Mamba,
DSA's indexer) is refused at start, naming it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import threading
import time

from .. import _native

from . import pagekeys
from .pdranks import (MAX_TP, DisaggError, decode_ranks_served, decode_tp_candidates, first_decode_rank, head_placement,
                      parts_of, room_part, room_rank)
from ..kvpool import KVPool
from ..rooms import DECODE, PREFILL
from ..prefix import page_keys, part_keys, string_key
from ..tier import Tier

logger = logging.getLogger(__name__)

try:  # SGLang is only there on serving machines.
    from sglang.srt.disaggregation.base.conn import (
        BaseKVManager,
        BaseKVReceiver,
        BaseKVSender,
        KVPoll,
        KVTransferMetric,
    )
except ImportError:  # pragma: no cover - exercised where SGLang is installed
    BaseKVManager = BaseKVSender = BaseKVReceiver = object
    KVPoll = KVTransferMetric = None

BACKEND = "cxltier"
ROOMS_SUFFIX = "@pd"
# Bytes of a side's records besides the aux data (hello, accept, done, ...).
RECORDS_BYTES = 2048
# How often a side looks for the other's record, at most.
POLL_EVERY = 0.002
# How often a waiting side asks whether the other side's process is gone.
PEER_EVERY = 0.25
# How often a prefill rank, bootstrapping, looks for a decode of another TP
# size than its own (its own it looks for at every poll).
PROBE_EVERY = 0.02
def _timeout(name, default):
    try:
        from sglang.srt.environ import envs

        return float(getattr(envs, name).get())
    except Exception:
        return float(os.environ.get(name, default))


class _PrefillInfo:
    """What SGLang's decode queue asks of a prefill's parallel layout: the
    tier has no per-prefill server to ask, and one DP rank serves a room."""

    dp_size = 1
    follow_bootstrap_room = True


class CxlTierKVManager(BaseKVManager):
    """One worker's side of disaggregation: its KV pool bound to the tier
    (KVPool per part), the rooms index, and a thread that moves pages so
    that the scheduler never waits on a copy."""

    supports_host_destination = False
    enable_deferred_decode_kv_release = False

    def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False, **_):
        self.kv_args = args
        self.mode = str(getattr(disaggregation_mode, "value", disaggregation_mode))
        self.is_mla = bool(is_mla_backend)
        self.page_size = int(args.page_size)
        self.attn_cp_rank, self.attn_cp_size = 0, 1
        self.enable_all_cp_ranks_for_transfer = False
        self.prefill_info_table = {}
        self.transfer_infos = {}
        _refuse_unserved(args)
        self.tp_rank = int(getattr(args, "engine_rank", 0))
        self.tp_size = int(getattr(server_args, "tp_size", 1) or 1)
        pp_rank, pp_size = int(getattr(args, "pp_rank", 0) or 0), int(getattr(server_args, "pp_size", 1) or 1)
        model = str(getattr(server_args, "model_path", None) or "default").replace("/", "-")
        self.model, self.pp_rank, self.pp_size = model, pp_rank, pp_size
        self.key_suffix = pagekeys.key_suffix(model, self.tp_rank, self.tp_size, pp_rank, pp_size, replicated=self.is_mla)
        self.kv_pool = None  # SGLang's KV pool, once a queue hands it over (bind_pool)
        self._staging = None  # (chunk, KVPool, buffers): a prefill rank's pages of another geometry land here first
        self._views = None  # SGLang's K and V buffers as pages of rows of bytes (_pool_buffers)
        engine = "cpu" if str(getattr(server_args, "device", "cuda")) == "cpu" else "cuda"
        self.tier = Tier(os.environ.get("CXLTIER_DEVICES") or "shm:cxltier", name=f"sglang-pd-{self.mode}-{os.getpid()}")
        try:
            self.lease = list(self.tier.lease())  # in this side's records: the other side watches it
            self._populate()
            self._open(args, model, engine)
        except BaseException:
            self.tier.close()
            raise
        self._work = queue.Queue()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"cxltier-pd-{self.mode}-tp{self.tp_rank}")
        self._thread.start()
        logger.info("cxltier disaggregation (%s) on %s, index %r: %d layers, %d-byte pages, %s", self.mode,
                    self.tier.devices, self.index_name, self.layers, self.page_bytes, self.layout)

    def _populate(self):
        """Takes the tier's page faults at start (CXLTIER_PD_POPULATE=0:
        on each page's first transfer instead). On a shm: tier of 4 KiB
        pages they were most of a first transfer's time."""
        if os.environ.get("CXLTIER_PD_POPULATE", "1") == "0":
            return
        started = time.monotonic()
        n = self.tier.populate()
        logger.info("cxltier disaggregation: populated %d MiB of tier in %.2f s", n >> 20, time.monotonic() - started)

    def _open(self, args, model, engine):
        ptrs, lens, items = list(args.kv_data_ptrs), list(args.kv_data_lens), list(args.kv_item_lens)
        n = len(ptrs)
        per_layer = 1 if self.is_mla else 2
        if n == 0 or n % per_layer or len(set(items)) != 1:
            raise DisaggError(f"cxltier disaggregation: {n} KV buffers of page sizes {sorted(set(items))}: "
                              "want one geometry, K and V of every layer for MHA or the latent for MLA")
        self.layers = n // per_layer
        if per_layer == 2:  # K of every layer, then V of every layer: pair them layer by layer
            order = [i for layer in range(self.layers) for i in (layer, self.layers + layer)]
            ptrs, lens = [ptrs[i] for i in order], [lens[i] for i in order]
        chunk = items[0]
        self.page_bytes = chunk * n
        self.buffer_ptrs = [int(p) for p in ptrs]  # K and V of each layer, in turn
        # Pages stored per part: the decode lands a part while the next is
        # stored (CXLTIER_PD_PUBLISH_MIB of KV a part, 32 by default).
        text = os.environ.get("CXLTIER_PD_PUBLISH_MIB") or "32"
        try:
            part = float(text)
        except ValueError:
            part = 0
        if not 0 < part < 1 << 20:
            raise DisaggError(f"cxltier disaggregation: CXLTIER_PD_PUBLISH_MIB={text!r}: want MiB of KV, above 0")
        self.publish_pages = max(1, int(part * (1 << 20)) // self.page_bytes)
        self.per_layer, self.chunk = per_layer, chunk
        # SGLang's --kv-cache-dtype; "auto" is named by the pool's dtype once
        # a queue hands the pool over (bind_pool), as the linker names it.
        self.server_dtype = str(getattr(args, "kv_cache_dtype_str", None) or "auto")
        self.dtype_bound = pagekeys.kv_dtype(self.server_dtype, "auto") != "auto"
        self.index_name = os.environ.get("CXLTIER_PD_INDEX") or model
        blocks = int(os.environ.get("CXLTIER_PD_BLOCKS", "0") or 0)
        self.said_pins_full = False
        self.decode_tp_seen = None  # the TP size of the last decode a prefill rank found: looked for first
        self._open_rooms([int(x) for x in args.aux_item_lens])
        self._name_pages(pagekeys.kv_dtype(self.server_dtype, "auto"))
        self.index = self.pool = None
        self._index_lock = threading.Lock()
        self._index_args = (os.environ.get("CXLTIER_PREFIX_KEY") or None, list(zip(ptrs, lens)), engine)
        if self.mode == "prefill":
            self._open_index(blocks)
            return
        try:
            self._open_index(0)
        except _native.NotFoundError:
            logger.info("cxltier disaggregation: index %r is not in the tier yet: opened when the first prefill "
                        "answers (a prefill makes it, with blocks of its pages)", self.index_name)

    def _open_index(self, blocks):
        """Opens the index of pages and binds this pool to it; with blocks,
        a prefill makes it when missing, with blocks of its pages. A decode
        never makes it: the prefill's pages (of a smaller TP size, larger
        than the decode's) decide its blocks."""
        key, buffers, engine = self._index_args
        index = self.tier.prefix(self.index_name, blocks, self.page_bytes + 64 if blocks else 0, key)
        if self.mode == "prefill" and index.stats()["block_bytes"] < self.page_bytes:
            raise DisaggError(f"cxltier disaggregation: index {self.index_name!r} has "
                              f"{index.stats()['block_bytes']}-byte blocks; a page is {self.page_bytes} bytes")
        self.pool = KVPool(index, buffers, self.per_layer, self.chunk, self.chunk, engine=engine, device=engine != "cpu")
        if self.mode == "prefill":
            self.pool.first_token(stores=True)  # a decode's first token waits on these pages: the class of a load
        self.index = index

    def ready_index(self):
        """A decode's index, opened at its first request when it was not in
        the tier at start (a prefill answered by then, so it is there)."""
        with self._index_lock:
            if self.index is not None:
                return
            try:
                self._open_index(0)
            except _native.NotFoundError:
                raise DisaggError(f"cxltier disaggregation: index {self.index_name!r} is not in the tier {self.tier.devices}, "
                                  "though a prefill answered: do both sides name the same CXLTIER_PD_INDEX?") from None

    def _open_rooms(self, aux):
        """The rooms table (CXLTIER_PD_ROOMS rooms in flight, 1024 by
        default), made when missing with rooms that hold a side's records
        and the aux data; a table whose rooms are too small is refused."""
        text = os.environ.get("CXLTIER_PD_ROOMS") or "1024"
        if not text.isdigit() or not 0 < int(text) <= 1 << 20:
            raise DisaggError(f"cxltier disaggregation: CXLTIER_PD_ROOMS={text!r}: want a count of rooms, 1 to 1048576")
        need = sum(aux) + len(aux) * 16 + RECORDS_BYTES
        slot = 1024
        while slot < 2 * need + 128:
            slot *= 2
        self.side = PREFILL if self.mode == "prefill" else DECODE
        self.other = DECODE if self.side == PREFILL else PREFILL
        self.rooms_name = self.index_name + ROOMS_SUFFIX
        try:
            # Signed with the index's tenant key, when it has one: a writer
            # of the tier without it can then forge no record (an accept,
            # the aux data's first token) that this side acts on.
            self.rooms = self.tier.rooms(self.rooms_name, int(text), slot, os.environ.get("CXLTIER_PREFIX_KEY") or None)
        except _native.InvalidError as e:
            raise DisaggError(f"cxltier disaggregation: rooms table {self.rooms_name!r}: {e}") from None
        area = self.rooms.stats()["area_bytes"]
        if area < need:
            raise DisaggError(f"cxltier disaggregation: rooms table {self.rooms_name!r} holds {area} bytes of a side's "
                              f"records, this model's aux data needs {need}: remove it (cxltier object rm rooms/{self.rooms_name}) "
                              "with the workers stopped, to make it anew")

    def _name_pages(self, dtype):
        """The layout both sides compare and the key mask of this pool's
        pages: the unified-cache linker's, so that pages this backend
        writes are the linker's cache entries, and the other way round."""
        self.dtype_name = dtype
        self.layout = pagekeys.layout(self.layers, self.per_layer, self.chunk, dtype)
        self.mask = pagekeys.pool_mask(self.key_suffix, "kv", 0, self.page_size, self.layout)

    def source_mask(self, key_suffix, chunk):
        """The key mask of the pages of a prefill rank that names its pages
        key_suffix and its chunk (a decode of another TP size than the
        prefill's reads the prefill rank's pages, not its own)."""
        return pagekeys.pool_mask(key_suffix, "kv", 0, self.page_size, self.layout_of(chunk))

    def layout_of(self, chunk):
        """This model's layout with another rank's chunk (its share of the heads)."""
        return pagekeys.layout(self.layers, self.per_layer, chunk, self.dtype_name)

    def bind_pool(self, pool):
        """SGLang's KV pool, from the queue that made a sender or receiver:
        with --kv-cache-dtype auto its dtype names the pages. Before any
        request is sent (the wraps call it as they make the first)."""
        self.kv_pool = pool if pool is not None else self.kv_pool
        dtype = getattr(pool, "dtype", None)
        if self.dtype_bound or dtype is None:
            return
        self._name_pages(pagekeys.kv_dtype(self.server_dtype, dtype))
        self.dtype_bound = True
        logger.info("cxltier disaggregation: pages named as the linker names them: %s", self.layout)

    # What SGLang's queues ask of a manager.

    def register_to_bootstrap(self):
        pass  # no bootstrap server: the rooms are in the tier

    def try_ensure_parallel_info(self, bootstrap_addr):
        self.prefill_info_table.setdefault(bootstrap_addr, _PrefillInfo())
        return True

    def get_transfer_metric(self):  # pragma: no cover - a sender's, not the manager's
        return KVTransferMetric()

    # Keys.

    def page_keys(self, tokens, mask=None):
        """The entry keys of the whole pages of tokens (SGLang's hash chain,
        masked for this pool, or by mask: another rank's), as a KeyBlock."""
        return part_keys(page_keys(tokens, self.page_size), [mask or self.mask])

    def tail_keys(self, room, rank, nonce, mask=None):
        """The key of a request's partial last page for the decode rank
        rank: its room's and rank's, and that decode's nonce for the
        request, so that a later request on the same room never finds it
        (masked as page_keys)."""
        return part_keys([string_key(f"cxltier-pd/{room}/r{rank}/tail-{nonce}/0").hex()], [mask or self.mask])


    # Records.

    def put_record(self, side, kind, record):
        """Writes this side's record kind (JSON, or an (address, length)
        pair of raw bytes) into side's room."""
        data = record if isinstance(record, tuple) else json.dumps(record).encode()
        try:
            self.rooms.put(side.room_of(), self.side, kind, data)
        except _native.NotFoundError:
            raise DisaggError(f"cxltier disaggregation: room {side.room}: the room was freed (the other side ended "
                              "the request) or claimed anew (another request on the same room)") from None

    def get_record(self, side, kind, into=None):
        """The other side's record kind of side's room (JSON; with into, an
        (address, length) pair, its length copied there), None when it is
        not there yet."""
        handle = side.room_of(find=True)
        if handle is None:
            return None
        try:
            raw = self.rooms.get(handle, self.other, kind, into=into)
        except _native.NotFoundError:
            raise DisaggError(f"cxltier disaggregation: room {side.room}: the room was freed (the other side ended "
                              "the request) or claimed anew (another request on the same room)") from None
        return raw if into is not None or raw is None else json.loads(raw)

    def drop_tail(self, room, rank, nonce, mask=None):
        if self.index is not None:  # none: a decode that never learned of a prefill's pages
            self.index.delete([self.tail_keys(room, rank, nonce, mask).hex(0)])

    # Pages of another rank's heads (MHA between TP sizes).

    def land_share(self, block, pages, chunk, placement):
        """Lands pages of block (a prefill rank's, of chunk-byte chunks)
        into pages of this pool by placement, (source offset, destination
        offset, length) of every token's row (pdranks.head_placement: a
        share of the prefill rank's heads, or the prefill rank's heads as a
        part of this rank's): each batch into a staging copy first,
        checked against its checksums, and only then its rows copied into
        the pool. NotFoundError when an entry is gone."""
        import torch

        pool, staged = self._staging_for(chunk)
        cap = staged[0].numel() // chunk
        mine = self._pool_buffers()
        src_off, dst_off, length = placement
        for at in range(0, len(pages), cap):
            part = pages[at : at + cap]
            pool.get(_slice(block, at, len(part)), list(range(len(part))))  # checked: nothing below runs on a bad page
            index = torch.tensor(part, dtype=torch.long, device=mine[0].device)
            for src, dst in zip(staged, mine):
                rows = src[: len(part) * chunk].view(len(part), self.page_size, chunk // self.page_size)
                dst[index, :, dst_off : dst_off + length] = rows[:, :, src_off : src_off + length].to(dst.device)

    def _staging_for(self, chunk):
        """A staging pool for pages of chunk-byte chunks: host buffers of
        CXLTIER_PD_PUBLISH_MIB of KV (pinned when this pool is on a GPU),
        made once per geometry."""
        import torch

        if self._staging is not None and self._staging[0] == chunk:
            return self._staging[1:]
        if self._staging is not None:
            self._staging[1].close()
        n = len(self.kv_args.kv_data_ptrs)
        cap = max(1, self.publish_pages * self.page_bytes // (chunk * n))
        pin = self.pool_device() != "cpu"
        staged = [torch.empty(cap * chunk, dtype=torch.uint8, pin_memory=pin) for _ in range(n)]
        pool = KVPool(self.index, [(t.data_ptr(), t.numel()) for t in staged], self.per_layer, chunk, chunk)
        self._staging = (chunk, pool, staged)
        return pool, staged

    def pool_device(self):
        buffers = getattr(self.kv_pool, "k_buffer", None)
        return str(buffers[0].device.type) if buffers else "cpu"

    def _pool_buffers(self):
        """SGLang's K and V buffers of every layer, in this side's order (K
        and V of each layer), each as pages of token rows of bytes: checked
        against the addresses the KV args gave."""
        import torch

        if self._views is not None:
            return self._views
        pool = self.kv_pool
        if pool is None or not hasattr(pool, "k_buffer"):
            raise DisaggError("cxltier disaggregation: a decode of another TP size than the prefill's lands "
                              "its heads of each page, which needs SGLang's MHA KV pool (none was handed over)")
        out = [t for layer in range(self.layers) for t in (pool.k_buffer[layer], pool.v_buffer[layer])]
        if [t.data_ptr() for t in out] != self.buffer_ptrs:
            raise DisaggError("cxltier disaggregation: SGLang's KV pool is not the one whose buffers the KV args name")
        row = self.chunk // self.page_size
        views = []
        for t in out:
            flat = t.view(torch.uint8).reshape(-1)
            n = flat.numel() // self.chunk
            views.append(flat[: n * self.chunk].view(n, self.page_size, row))
        self._views = views
        return views

    # The mover thread.

    def submit(self, fn):
        self._work.put(fn)

    def _run(self):
        while True:
            fn = self._work.get()
            if fn is None:
                return
            try:
                fn()
            except Exception:  # each task records its own failure; this is a last resort
                logger.exception("cxltier disaggregation: a transfer task failed")

    def close(self):
        self._work.put(None)
        self._thread.join(timeout=10)
        self.tier.close()


def _refuse_unserved(args):
    states = [str(getattr(s, "value", s)) for s in (getattr(args, "state_types", None) or [])]
    if states:
        raise DisaggError(f"cxltier disaggregation: the KV pool carries state {states} (SWA, Mamba, DSA indexer, ...), "
                          "which this backend does not move; use the mooncake backend for this model")
    if getattr(args, "num_draft_entries", 0):
        raise DisaggError("cxltier disaggregation: speculative decoding's draft KV is not moved by this backend yet")


class _Side:
    """What a sender and a receiver share: the room, the conclusion, the
    clock of the wait in progress."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room):
        self.kv_mgr = mgr
        self.nonce = None  # the request's, made by the decode (see the module comment)
        self.bootstrap_addr = bootstrap_addr
        self.room = int(bootstrap_room) if bootstrap_room is not None else 0
        self.tokens = None  # the request's prompt, set by the plugin's wrap of the queue that made this side
        self.conclude_state = None
        self.reason = None
        self._lock = threading.Lock()
        self._next_look = 0.0
        self._next_peer_look = 0.0
        self.bytes = 0
        self.started = None
        self.finished = None
        self.handle = None  # the request's room in the rooms table (a rooms.Room)
        self._ended = False  # whether this side ended its room
        self._kept = []  # pins on the pages this side published, until it ends (a prefill's: see _keep)

    def room_of(self, find=False):
        """This request's room (the decode's claim; with find, None before)."""
        if self.handle is None and not find:
            raise DisaggError(f"cxltier disaggregation: room {self.room}: not claimed by a decode yet")
        return self.handle

    def _rooms(self):
        """(room handle, decode rank, nonce, the mask of its last page's key:
        the prefill rank's, None for this side's own) of each room this
        side ends."""
        return []

    def _conclude(self, state, reason=None):
        with self._lock:
            if self.conclude_state is not None:
                return
            self.conclude_state, self.reason = state, reason
            self.finished = time.monotonic()
            if reason:
                logger.warning("cxltier disaggregation: room %d: %s", self.room, reason)
        self._end_room()

    def _end_room(self):
        """This side is done with its room: the second side to end it
        frees it (prefix/rooms' rule), and the request's partial last page
        goes with it: each side drops it as it ends (the decode has landed
        it by then, or never will). A prefill that has not ended yet still
        pins it (_keep): the decode's drop is then refused, and the
        prefill's own drop, after its pins are released, takes it. At the
        conclusion, not at clear(): SGLang clears a prefill's sender only
        after a success."""
        with self._lock:
            kept, self._kept = self._kept, []
            rooms = [] if self._ended else self._rooms()
            self._ended = self._ended or bool(rooms)
        for k in kept:
            k.release()
        for handle, rank, nonce, mask in rooms:
            if nonce is not None:
                try:
                    self.kv_mgr.drop_tail(self.room, rank, nonce, mask)
                except _native.BusyError:
                    pass  # the prefill still keeps it: it drops it when it ends
                except Exception:
                    logger.exception("cxltier disaggregation: room %d: dropping the last page failed", self.room)
            try:
                self.kv_mgr.rooms.end(handle, self.kv_mgr.side)
            except Exception:
                pass  # freed already (a reclaim) or claimed anew: nothing to end

    def _keep(self, block):
        """Pins the pages of block this side just published until it ends.
        A decode lands them after they are published, and meanwhile this
        prefill's next parts (or any writer's) evict: in a full index whose
        older pages were each read once, eviction's second chance passes
        those over and takes the newest unread pages first, so the decode
        found its own request's pages gone. A pin table that is full keeps
        nothing, and says so once. Returns the indexes of the keys of block
        with no entry to pin: evicted since they were stored or found (a
        full tier, another writer's store); none when nothing could be
        kept."""
        try:
            kept = self.kv_mgr.index.keep_block(block)
        except _native.NoSpaceError as e:
            if not self.kv_mgr.said_pins_full:
                self.kv_mgr.said_pins_full = True
                logger.warning("cxltier disaggregation: room %d: published pages are not kept from eviction until the "
                               "decode reads them (%s): too many pages in flight for this process's pin table", self.room, e)
            return []
        gone = [i for i, there in enumerate(kept.present) if not there]
        with self._lock:
            if self.conclude_state is None:
                self._kept.append(kept)
                return gone
        kept.release()  # the side ended meanwhile
        return gone

    def _look(self):
        """Whether it is time to read the tier again (the scheduler polls
        in a tight loop)."""
        now = time.monotonic()
        if now < self._next_look:
            return False
        self._next_look = now + POLL_EVERY
        return True

    def _other_aborted(self, other, room=None):
        """Whether the other side (named other, for the reason) wrote an
        abort of this request in room (this side's own room by default;
        one naming another nonce is an earlier request's): this side then
        concludes Failed. Raises the tier's error."""
        room = room or self
        abort = self.kv_mgr.get_record(room, "abort")
        if abort is None:
            return False
        if room.nonce is not None and abort.get("nonce") not in (None, room.nonce):
            return False  # a prefill before the hello knows no nonce, and takes any abort
        self._conclude(KVPoll.Failed, f"cxltier disaggregation: room {self.room}: the {other} side aborted")
        return True

    def _peer_gone(self, records, other):
        """Whether a process of the other side, named by the lease in one
        of its records, is gone (looked at most every PEER_EVERY): this
        side then concludes Failed at once instead of at SGLang's waiting
        timeout. A lease is the other side's word in the tier: it only ends
        this side's wait."""
        gone = self._gone_lease(records)
        if gone is None:
            return False
        self._conclude_gone(gone, other)
        return True

    def _gone_lease(self, records):
        """The first of records whose lease has ended, or None (also when
        looked at less than PEER_EVERY ago)."""
        now = time.monotonic()
        if now < self._next_peer_look:
            return None
        self._next_peer_look = now + PEER_EVERY
        for record in records:
            lease = (record or {}).get("lease")
            if not isinstance(lease, list) or len(lease) != 2:
                continue
            try:
                if self.kv_mgr.tier.lease_gone(int(lease[0]), int(lease[1])):
                    return record
            except (_native.CxlTierError, TypeError, ValueError):
                continue  # a lease this tier cannot read names no one to wait on less
        return None

    def _conclude_gone(self, record, other):
        self._conclude(KVPoll.Failed, f"cxltier disaggregation: room {self.room}: the {other} side's process "
                                      f"is gone (its lease, slot {record['lease'][0]}, ended)")
        return self.conclude_state

    def failure_exception(self):
        raise DisaggError(self.reason or "cxltier disaggregation: the transfer failed")

    def get_transfer_metric(self):
        took = (self.finished - self.started) if self.started and self.finished else None
        return KVTransferMetric(transfer_latency_s=took, transfer_total_bytes=self.bytes)


class _Peer:
    """A decode rank a prefill rank serves in one request: its room (the
    decode's claim), the part of its KV this rank serves (pdranks) and its
    hello."""

    def __init__(self, room, rank, part, handle, hello):
        self.room, self.rank, self.part, self.handle, self.hello = room, rank, part, handle, hello
        self.nonce = hello.get("nonce")
        self.acked = False

    def room_of(self, find=False):
        return self.handle


class CxlTierKVSender(_Side, BaseKVSender):
    """The prefill side of one request: waits for the hello of each decode
    rank it serves, writes the pages as SGLang sends them, then the aux data
    and the done record into each one's room, and ends when all ack.

    A rank serves the decode rank of its own number at the same TP size;
    of a decode of larger TP, decode_tp/prefill_tp ranks (an MHA one lands
    its share of the heads); of a smaller one, for MLA one rank in
    prefill_tp/decode_tp serves the decode rank and the others stand by
    (every MLA rank holds the same latent), and for MHA each of them serves
    its heads as a part of the decode rank's (pdranks)."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room, req_has_disagg_prefill_dp_rank=False):
        _Side.__init__(self, mgr, bootstrap_addr, bootstrap_room)
        self.hello = None  # the first decode rank's, once every rank served said hello
        self.peers = []  # the decode ranks this rank serves (_Peer), as their hellos are found
        self.decode_tp = None
        self.standby = False  # an MLA rank whose decode rank another prefill rank serves
        self.num_pages = 0
        self.aux_index = None
        self.sent_pages = 0
        self.first_page = 0
        self.done_written = False
        self.written = 0
        self.present = 0
        self._since = time.monotonic()
        self._next_probe = 0.0

    def _rooms(self):
        return [(p.handle, p.rank, p.nonce, None) for p in self.peers]

    def pop_decode_prefix_len(self):
        return int((self.hello or {}).get("decode_prefix_len", 0))

    def init(self, num_kv_indices, aux_index=None):
        self.num_pages, self.aux_index = int(num_kv_indices), aux_index
        self.first_page = self.pop_decode_prefix_len() // self.kv_mgr.page_size
        self._since = time.monotonic()

    def should_send_kv_chunk(self, num_pages, last_chunk):
        return num_pages > 0 or last_chunk

    def send(self, kv_indices, state_indices=None, num_kv_tokens=None, **_):
        if self.conclude_state is not None:
            return
        pages = [int(p) for p in kv_indices]
        start = self.first_page + self.sent_pages
        self.sent_pages += len(pages)
        last = self.sent_pages >= self.num_pages
        if self.standby:  # another rank sends this request's pages
            if last:
                self._conclude(KVPoll.Success)
            return
        if self.started is None:
            self.started = time.monotonic()
        self.kv_mgr.submit(lambda: self._store(start, pages, last))

    def _store(self, start, pages, last):
        mgr = self.kv_mgr
        try:
            if self.conclude_state is not None:
                return
            if self.tokens is None:
                raise DisaggError("cxltier disaggregation: the request's tokens were not given to its sender "
                                  "(is the cxltier plugin installed? SGLANG_PLUGINS=cxltier)")
            whole = len(self.tokens) // mgr.page_size
            full = [(i, p) for i, p in zip(range(start, start + len(pages)), pages) if i < whole]
            if full:
                keys = mgr.page_keys(self.tokens[: (full[-1][0] + 1) * mgr.page_size])
                # A part at a time: each part's pages are published (found by
                # their keys) as soon as it is stored, and the decode lands
                # them while the next part is stored.
                for at in range(0, len(full), mgr.publish_pages):
                    if self.conclude_state is not None:
                        return
                    part = full[at : at + mgr.publish_pages]
                    self._store_part(_slice(keys, part[0][0], len(part)), [p for _, p in part])
            tail = [(i, p) for i, p in zip(range(start, start + len(pages)), pages) if i >= whole]
            for peer in self.peers if tail else []:
                # The last page, partial: the request's own, under its room,
                # the decode rank's and its nonce.
                keys = mgr.tail_keys(self.room, peer.rank, peer.nonce)
                mgr.index.delete([keys.hex(0)])
                status = mgr.pool.store(keys, [tail[0][1]])[0]
                if status != "stored" or self._keep(keys):
                    raise DisaggError(f"cxltier disaggregation: room {self.room}: the last page was not stored "
                                      f"({status if status != 'stored' else 'evicted as soon as stored'}; "
                                      f"index {mgr.index_name!r})")
                self.bytes += mgr.page_bytes
            if last:
                self._finish()
        except Exception as e:
            self._fail(e)

    def _store_part(self, block, pages):
        """Stores and keeps the pages of block. A page stored or found
        there but with no entry to pin (evicted meanwhile: the tier full,
        and another rank's or engine's store taking the oldest entries; at
        TP 4 a decode then found a page of its request gone), or one another
        writer is still writing (the same MLA page from another rank, an
        uplink's fill), is stored once more: one this store writes is kept,
        or the request fails. One another writer is still writing is waited
        for until that writer publishes it (kept then) or gives it up (stored
        here then), within SGLang's waiting timeout: the decode is told the
        pages are in only once they are. (This side said so as soon as it
        saw the other writer's, and a TP 2 MLA decode rank found page 0 of
        its request missing while the other prefill rank still wrote it.)"""
        mgr = self.kv_mgr
        statuses = self._store_pages(block, pages)
        self.present += statuses.count("present")
        gone, since = self._keep(block), time.monotonic()
        while gone:
            block, pages = _pick(block, gone), [pages[i] for i in gone]
            statuses = self._store_pages(block, pages)
            gone = self._keep(block)
            lost = [i for i in gone if statuses[i] == "stored"]
            if lost:
                raise DisaggError(f"cxltier disaggregation: room {self.room}: {len(lost)} pages evicted as soon as they "
                                  f"were stored (index {mgr.index_name!r}): the tier is too small for the pages in flight")
            if not gone or self.conclude_state is not None:
                return
            if time.monotonic() - since > _timeout("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300):
                raise DisaggError(f"cxltier disaggregation: room {self.room}: {len(gone)} pages another writer was "
                                  f"writing were neither published nor given up within SGLang's waiting timeout "
                                  f"(index {mgr.index_name!r})")
            time.sleep(POLL_EVERY)

    def _store_pages(self, block, pages):
        """Stores pages under block's keys; their statuses. A full tier
        fails the request."""
        mgr = self.kv_mgr
        statuses = mgr.pool.store(block, pages)
        if "no_space" in statuses:
            raise DisaggError(f"cxltier disaggregation: room {self.room}: the tier is full "
                              f"(index {mgr.index_name!r}): {statuses.count('no_space')} of {len(pages)} pages not stored")
        self.written += statuses.count("stored")
        self.bytes += statuses.count("stored") * mgr.page_bytes
        return statuses

    def _finish(self):
        mgr = self.kv_mgr
        args = mgr.kv_args
        for peer in self.peers:
            hello = mgr.get_record(peer, "hello")
            if (hello or {}).get("nonce") != peer.nonce:
                raise DisaggError(f"cxltier disaggregation: room {self.room}: the hello of decode rank {peer.rank} "
                                  "changed while this request was sent (another request on the same room?)")
        n = len(args.aux_data_ptrs)
        for peer in self.peers:
            if self.aux_index is not None:
                for i in range(n):
                    at = args.aux_data_ptrs[i] + self.aux_index * args.aux_item_lens[i]
                    mgr.put_record(peer, f"aux/{i}", (at, int(args.aux_item_lens[i])))
            mgr.put_record(peer, "done", {"status": "ok", "pages": self.num_pages, "first_page": self.first_page,
                                          "tokens": len(self.tokens), "aux": n if self.aux_index is not None else 0,
                                          "layout": mgr.layout, "nonce": peer.nonce})
        self.done_written = True
        self._since = time.monotonic()

    def _fail(self, e):
        reason = str(e)
        for peer in self.peers:
            try:
                self.kv_mgr.put_record(peer, "done", {"status": "failed", "reason": reason, "nonce": peer.nonce})
            except Exception:
                pass
        self._conclude(KVPoll.Failed, reason)

    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        if not self._look():
            return KVPoll.Bootstrapping if self.hello is None else KVPoll.Transferring if self.started else KVPoll.WaitingForInput
        try:
            if self.hello is None:
                return self._bootstrap()
            if self.standby:
                return KVPoll.WaitingForInput
            for peer in self.peers:
                if self._other_aborted("decode", peer):
                    return self.conclude_state
            if not self.done_written:
                if self._peer_gone([p.hello for p in self.peers], "decode"):
                    return self.conclude_state
                return KVPoll.Transferring if self.started else KVPoll.WaitingForInput
            # A decode rank acks and may then end its process, and its lease
            # with it (a TP 4 prefill once saw a rank gone that had acked a
            # moment before): leases are looked at before acks are read, and
            # only a rank gone without its ack fails the request.
            gone = self._gone_lease([p.hello for p in self.peers if not p.acked])
            for peer in self.peers:
                if not peer.acked:
                    peer.acked = self.kv_mgr.get_record(peer, "ack") is not None
            if all(p.acked for p in self.peers):
                self._conclude(KVPoll.Success)
                return KVPoll.Success
            if gone is not None and any(p.hello is gone and not p.acked for p in self.peers):
                return self._conclude_gone(gone, "decode")
            return self._waited("the decode side's ack", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT", KVPoll.Transferring)
        except (_native.CxlTierError, DisaggError) as e:
            self._fail(e)
            return self.conclude_state

    def _bootstrap(self):
        """Finds the hello of each decode rank this rank serves, checks it
        against this side's layout and answers it; WaitingForInput once
        every one did."""
        mgr = self.kv_mgr
        if self.decode_tp is None:
            found = self._find_decode()
            if found is None:
                return self._waited("bootstrap", "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", KVPoll.Bootstrapping)
            d, rank, handle, hello = found
            self.decode_tp = mgr.decode_tp_seen = d
            p = mgr.tp_size
            part = room_part(mgr.tp_rank, p, d, mgr.is_mla)
            first = _Peer(self.room, rank, part, handle, hello)
            if not decode_ranks_served(mgr.tp_rank, p, d, mgr.is_mla):
                self.standby, self.hello = True, hello  # another rank of this prefill serves that decode rank
                return KVPoll.WaitingForInput
            self._answer(first)
            if self.conclude_state is not None:
                return self.conclude_state
        d = self.decode_tp
        part = room_part(mgr.tp_rank, mgr.tp_size, d, mgr.is_mla)
        for rank in decode_ranks_served(mgr.tp_rank, mgr.tp_size, d, mgr.is_mla)[len(self.peers) :]:
            handle = mgr.rooms.find(self.room, room_rank(rank, part))
            hello = None if handle is None else self._hello(handle)
            if hello is None or hello.get("tp_size") != d:
                return self._waited("bootstrap", "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", KVPoll.Bootstrapping)
            self._answer(_Peer(self.room, rank, part, handle, hello))
            if self.conclude_state is not None:
                return self.conclude_state
        self.hello = self.peers[0].hello
        return KVPoll.WaitingForInput

    def _find_decode(self):
        """(decode TP size, rank, room handle, hello) of the first decode
        rank this rank serves, once it said hello (see decode_tp_candidates:
        a hello names its TP size; only the room of the size it names
        counts)."""
        mgr = self.kv_mgr
        now = time.monotonic()
        wide = now >= self._next_probe
        if wide:
            self._next_probe = now + PROBE_EVERY
        for d in decode_tp_candidates(mgr.tp_size, mgr.decode_tp_seen, wide):
            rank = first_decode_rank(mgr.tp_rank, mgr.tp_size, d)
            handle = mgr.rooms.find(self.room, room_rank(rank, room_part(mgr.tp_rank, mgr.tp_size, d, mgr.is_mla)))
            hello = None if handle is None else self._hello(handle)
            if hello is not None and hello.get("tp_size") == d:
                return d, rank, handle, hello
        return None

    def _hello(self, handle):
        try:
            raw = self.kv_mgr.rooms.get(handle, DECODE, "hello")
        except _native.NotFoundError:
            return None  # the room went meanwhile: looked for again
        return None if raw is None else json.loads(raw)

    def _answer(self, peer):
        """Checks a decode rank's hello against this side and accepts it;
        a mismatch fails the request, saying why in that rank's room."""
        mgr = self.kv_mgr
        self.peers.append(peer)
        hello = peer.hello
        if not self._fits(hello, peer):
            self._fail(DisaggError(f"cxltier disaggregation: room {self.room}: the decode's KV layout "
                                   f"{hello.get('layout')} ({hello.get('key_suffix')}) is not this prefill's "
                                   f"{mgr.layout} ({mgr.key_suffix}) nor a share of its heads: same model and KV "
                                   "dtype needed"))
            return
        if hello.get("decode_prefix_len") != self.peers[0].hello.get("decode_prefix_len"):
            self._fail(DisaggError(f"cxltier disaggregation: room {self.room}: decode ranks {self.peers[0].rank} and "
                                   f"{peer.rank} hold prefixes of different lengths"))
            return
        mgr.put_record(peer, "accept", {"nonce": peer.nonce, "lease": mgr.lease, "tp_size": mgr.tp_size,
                                        "key_suffix": mgr.key_suffix, "chunk": mgr.chunk})

    def _fits(self, hello, peer):
        """Whether the decode rank that said hello holds this rank's pages
        (the same layout and key suffix) or, of an MHA decode of another TP
        size, a share of their heads or their heads as a part of its own
        (pdranks.head_placement)."""
        mgr = self.kv_mgr
        if hello.get("layout") == mgr.layout and hello.get("key_suffix") == mgr.key_suffix:
            return True
        d, chunk = hello.get("tp_size"), hello.get("chunk")
        if mgr.is_mla or not isinstance(d, int) or not isinstance(chunk, int) or d == mgr.tp_size or not 1 <= d <= MAX_TP:
            return False
        if hello.get("layout") != mgr.layout_of(chunk):
            return False
        if hello.get("key_suffix") != pagekeys.key_suffix(mgr.model, peer.rank, d, mgr.pp_rank, mgr.pp_size):
            return False
        try:
            head_placement(mgr.chunk, chunk, mgr.page_size, mgr.tp_size, d, peer.rank, peer.part)
        except DisaggError:
            return False
        return True

    def _waited(self, what, timeout_env, state):
        if time.monotonic() - self._since > _timeout(timeout_env, 300):
            self._fail(DisaggError(f"cxltier disaggregation: room {self.room}: no {what} within {timeout_env}"))
            return self.conclude_state
        return state

    def poll_pp_consensus(self):
        return self.poll()

    def mark_prefill_complete(self):
        pass

    def abort(self):
        for peer in self.peers:
            try:
                self.kv_mgr.put_record(peer, "abort", {"by": "prefill", "nonce": peer.nonce})
            except Exception:
                pass
        self._conclude(KVPoll.Failed, self.reason or f"cxltier disaggregation: room {self.room}: aborted")

    def clear(self):
        self._end_room()  # SGLang is done with the request: so is this side


class _Source:
    """A prefill rank a decode rank lands from in one request: the room it
    claimed for it (part 0 at the same or a larger prefill TP size; parts 1
    .. k-1 of a smaller MHA decode's k), that rank's accept, and what it
    says of its pages: their key mask, chunk and placement (pdranks), the
    request's whole pages keyed as that rank stores them, how many landed."""

    def __init__(self, room, part, handle):
        self.room, self.part, self.handle = room, part, handle
        self.accept = None
        self.mask = self.chunk = self.placement = None  # learned from the accept
        self.whole = None  # (KeyBlock, pages) of the whole pages past the prefix, made once
        self.landed = 0  # leading whole pages of it landed (the mover thread's count)

    def room_of(self, find=False):
        return self.handle

    @property
    def learned(self):
        return self.mask is not None


class CxlTierKVReceiver(_Side, BaseKVReceiver):
    """The decode side of one request: says hello with the prefix it holds,
    waits for the prefill's done record, reads the pages into the pages it
    allocated and the aux data into its metadata buffer, and acks. A rank of
    an MHA decode of a smaller TP size than the prefill's lands from each of
    the k prefill ranks whose heads it holds, a room each (_Source): it
    learns k from the first one's accept and claims the others then."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None):
        _Side.__init__(self, mgr, bootstrap_addr, bootstrap_room)
        self.bootstrap_done = False
        self.has_sent_metadata = False
        self.require_staging = False
        self.abort_notified = False
        self.bootstrap_infos = []
        self.loading = False
        self.nonce = secrets.token_hex(8)  # this request's, in every record the prefill writes for it
        self.sources = []  # the prefill ranks it lands from (_Source), the first claimed with the hello
        self.parts = 1  # how many: k once the first accept says so
        self._since = time.monotonic()

    def _rooms(self):
        return [(s.handle, self.kv_mgr.tp_rank, self.nonce, s.mask) for s in self.sources]

    def _learn_source(self, src, accept):
        """What a prefill rank's accept says of its pages: their key mask
        and chunk, and, of an MHA prefill of another TP size, where their
        heads go in this rank's (pdranks.head_placement); the first accept
        of a smaller MHA decode says how many prefill ranks it lands from,
        and the rooms of the others are claimed then. The accept is another
        process's word: only sizes this rank's own geometry admits are
        taken."""
        mgr = self.kv_mgr
        mgr.ready_index()
        p = accept.get("tp_size", mgr.tp_size)
        chunk = accept.get("chunk", mgr.chunk)
        suffix = accept.get("key_suffix", mgr.key_suffix)
        if not (isinstance(p, int) and 1 <= p <= MAX_TP and isinstance(chunk, int) and 0 < chunk and isinstance(suffix, str)):
            raise DisaggError(f"cxltier disaggregation: room {self.room}: the prefill's accept names no usable TP size, "
                              f"page chunk and key suffix ({p!r}, {chunk!r}, {suffix!r})")
        d = mgr.tp_size
        if src.part == 0 and not mgr.is_mla and p > d:
            self._claim_parts(p)
        if chunk == mgr.chunk and suffix == mgr.key_suffix:
            src.mask, src.chunk, src.accept = mgr.mask, chunk, accept
            return
        if mgr.is_mla:
            raise DisaggError(f"cxltier disaggregation: room {self.room}: the prefill's pages ({suffix}, "
                              f"{chunk}-byte chunks) are not this decode's ({mgr.key_suffix}, {mgr.chunk})")
        if max(p, d) % min(p, d) or p != (self.parts * d if p > d else p):
            raise DisaggError(f"cxltier disaggregation: room {self.room}: a prefill of TP {p} and this decode of TP {d}: "
                              "one size must divide the other, and every prefill rank this decode rank lands from must say so")
        rank = mgr.tp_rank * self.parts + src.part if p > d else mgr.tp_rank // (d // p)
        if suffix != pagekeys.key_suffix(mgr.model, rank, p, mgr.pp_rank, mgr.pp_size):
            raise DisaggError(f"cxltier disaggregation: room {self.room}: the prefill's pages ({suffix}, TP {p}) are not "
                              f"those of the rank of this model that serves decode rank {mgr.tp_rank} of TP {d}")
        src.placement = head_placement(chunk, mgr.chunk, mgr.page_size, p, d, mgr.tp_rank, src.part)
        src.mask, src.chunk, src.accept = mgr.source_mask(suffix, chunk), chunk, accept

    def _claim_parts(self, prefill_tp):
        """Claims the rooms of parts 1 .. k-1 (k prefill ranks hold this
        rank's heads) and says hello in each, as in the first."""
        if len(self.sources) > 1:
            return
        mgr = self.kv_mgr
        self.parts = parts_of(prefill_tp, mgr.tp_size, mgr.is_mla)
        for part in range(1, self.parts):
            src = _Source(self.room, part, self._claim(room_rank(mgr.tp_rank, part)))
            self.sources.append(src)
            self._hello(src)

    def _claim(self, rank):
        """This request's room of rank, claimed anew when an earlier request
        on this room left it: nothing it left is this one's."""
        try:
            return self.kv_mgr.rooms.claim(self.room, rank)
        except _native.NoSpaceError as e:
            raise DisaggError(f"cxltier disaggregation: room {self.room}: {e} (CXLTIER_PD_ROOMS sizes the table "
                              "when it is made)") from None
        except _native.ExistsError as e:  # a second decode for a request in flight
            raise DisaggError(f"cxltier disaggregation: room {self.room}: {e}") from None

    def _hello(self, src):
        mgr = self.kv_mgr
        mgr.put_record(src, "hello", {"decode_prefix_len": self.decode_prefix_len, "layout": mgr.layout,
                                      "key_suffix": mgr.key_suffix, "tp_size": mgr.tp_size, "chunk": mgr.chunk,
                                      "nonce": self.nonce, "lease": mgr.lease})

    @property
    def supports_host_destination(self):
        return False

    def init(self, prefill_dp_rank=0):
        self.bootstrap_done = True
        self._since = time.monotonic()

    def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None, destination=None):
        mgr = self.kv_mgr
        self.pages = [int(p) for p in kv_indices]
        self.aux_index = aux_index
        self.decode_prefix_len = int(decode_prefix_len or 0)
        self.streamed = 0  # whole pages landed before the prefill's done record was read
        try:
            self.sources.append(_Source(self.room, 0, self._claim(room_rank(mgr.tp_rank))))
            self.handle = self.sources[0].handle
            self._hello(self.sources[0])
        except Exception as e:
            self._conclude(KVPoll.Failed, str(e))
            return
        self.has_sent_metadata = True
        self._since = time.monotonic()

    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        if not self.bootstrap_done:
            return KVPoll.Bootstrapping
        if not self.has_sent_metadata:
            return KVPoll.WaitingForInput
        waiting = KVPoll.Transferring if self.started else KVPoll.WaitingForInput
        if self.loading or not self._look():
            return waiting
        mgr = self.kv_mgr
        try:
            dones = []
            for src in list(self.sources):
                if self._other_aborted("prefill", src):
                    return self.conclude_state
                done = mgr.get_record(src, "done")
                done = done if done is not None and done.get("nonce") == self.nonce else None  # else an earlier request's
                if done is not None and done.get("status") != "ok":
                    self._conclude(KVPoll.Failed, done.get("reason") or "cxltier disaggregation: the prefill side failed")
                    return self.conclude_state
                dones.append(done)
                self._look_for_accept(src, done is not None)
                if self.conclude_state is not None:
                    return self.conclude_state
        except (_native.CxlTierError, DisaggError) as e:
            self._conclude(KVPoll.Failed, str(e))
            return self.conclude_state
        if len(dones) == len(self.sources) == self.parts and None not in dones:  # parts claimed this poll are read next
            self.loading = True
            mgr.submit(lambda: self._load(dones))
            return KVPoll.Transferring
        if self._peer_gone([s.accept for s in self.sources], "prefill"):
            return self.conclude_state
        if time.monotonic() - self._since > _timeout("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300):
            self._conclude(KVPoll.Failed, f"cxltier disaggregation: room {self.room}: the prefill side wrote "
                                          "nothing within SGLANG_DISAGGREGATION_WAITING_TIMEOUT (did it die?)")
            return self.conclude_state
        if any(s.learned and (s.whole is None or s.landed < len(s.whole[1])) for s in self.sources):
            self.loading = True  # lands what the prefill has published so far, while it stores the rest
            mgr.submit(self._stream)
        return waiting

    def _look_for_accept(self, src, done):
        """Reads src's accept while it is not learned (every poll) and
        learns from it; with its done there, an accept must be there too.
        A refusal fails the request (written as this side's abort, so
        that the prefill stops too)."""
        if src.learned:
            return
        try:
            accept = self.kv_mgr.get_record(src, "accept")
        except (_native.CxlTierError, DisaggError):
            if done:
                raise
            accept = None
        if accept is None or accept.get("nonce") != self.nonce:
            if done:
                raise DisaggError(f"cxltier disaggregation: room {self.room}: the prefill's done came without its accept")
            return
        try:
            self._learn_source(src, accept)
        except DisaggError as e:
            self._fail_load(e)

    def _whole_pages(self, src):
        """(KeyBlock, pages): the request's whole pages past the prefix the
        decode holds, keyed as src's prefill rank stores them."""
        if src.whole is None:
            mgr = self.kv_mgr
            if self.tokens is None:
                raise DisaggError("cxltier disaggregation: the request's tokens were not given to its receiver "
                                  "(is the cxltier plugin installed? SGLANG_PLUGINS=cxltier)")
            first = self.decode_prefix_len // mgr.page_size
            whole = len(self.tokens) // mgr.page_size
            full = [p for i, p in zip(range(first, first + len(self.pages)), self.pages) if i < whole]
            block = None
            if full:
                keys = mgr.page_keys(self.tokens[: (first + len(full)) * mgr.page_size], src.mask)
                block = _slice(keys, first, len(full))
            src.whole = (block, full)
        return src.whole

    def _stream(self):
        """Lands the whole pages the prefill ranks have published so far,
        past those landed; returns when the next one of each is not there
        yet (the mover thread serves every request: it never waits here)."""
        mgr = self.kv_mgr
        try:
            if self.conclude_state is not None:
                return
            _test_gate()
            for src in [s for s in self.sources if s.learned]:
                block, full = self._whole_pages(src)
                while self.conclude_state is None and src.landed < len(full):
                    rest = _slice(block, src.landed, len(full) - src.landed)
                    n = mgr.index.exists_block(rest)
                    if n == 0:
                        break
                    if self.started is None:
                        self.started = time.monotonic()
                    try:
                        self._land(src, _slice(rest, 0, n), full[src.landed : src.landed + n])
                    except _native.NotFoundError:
                        break  # evicted between the look and the landing: the prefill's done decides
                    src.landed += n
                    self.streamed += n
        except Exception as e:
            self._fail_load(e)
        finally:
            self.loading = False

    def _load(self, dones):
        """The rest, once every prefill rank's done record is read: the
        whole pages not landed yet, the partial last page, the aux data;
        then the ack in every room."""
        mgr = self.kv_mgr
        try:
            _test_gate()
            for src, done in zip(self.sources, dones):
                first = int(done["first_page"])
                if first != self.decode_prefix_len // mgr.page_size:
                    raise DisaggError(f"cxltier disaggregation: room {self.room}: the prefill sent from page {first}, "
                                      f"this decode holds {self.decode_prefix_len} tokens")
                block, full = self._whole_pages(src)
                if src.landed < len(full):
                    if self.started is None:
                        self.started = time.monotonic()
                    try:
                        self._land(src, _slice(block, src.landed, len(full) - src.landed), full[src.landed :])
                    except _native.NotFoundError as e:
                        raise DisaggError(f"cxltier disaggregation: room {self.room}: a page is not in the tier ({e}); "
                                          "evicted before the decode read it?") from None
                    src.landed = len(full)
                tail = self.pages[len(full) :]
                if tail:  # dropped as the room ends
                    self._land(src, mgr.tail_keys(self.room, mgr.tp_rank, self.nonce, src.mask), [tail[0]])
            self._read_aux(int(dones[0].get("aux", 0)))
            for src in self.sources:
                mgr.put_record(src, "ack", {"pages": len(self.pages)})
            self._conclude(KVPoll.Success)
        except Exception as e:
            self._fail_load(e)
        finally:
            self.loading = False

    def _fail_load(self, e):
        self._abort_all({"by": "decode", "reason": str(e), "nonce": self.nonce})  # the abort first: concluding frees the room
        self._conclude(KVPoll.Failed, str(e))

    def _abort_all(self, record):
        """Writes this side's abort in every room it claimed; whether it
        was written in all."""
        ok = bool(self.sources)
        for src in self.sources:
            try:
                self.kv_mgr.put_record(src, "abort", record)
            except Exception:
                ok = False
        return ok

    def _land(self, src, block, pages):
        """Reads the pages of block, src's prefill rank's, into pages, each
        whole, checked against their checksums (ChecksumError), through a
        staging copy where its heads are not this rank's as they are.
        NotFoundError when one is not in the tier."""
        mgr = self.kv_mgr
        if src.placement is None:
            mgr.pool.get(block, pages)  # whole pages, one launch: nothing computes between layers here
            self.bytes += len(pages) * mgr.page_bytes
            return
        mgr.land_share(block, pages, src.chunk, src.placement)
        self.bytes += len(pages) * src.placement[2] * mgr.page_size * len(mgr.buffer_ptrs)  # the rows it landed

    def _read_aux(self, n):
        mgr = self.kv_mgr
        args = mgr.kv_args
        if self.aux_index is None or not n:
            return
        if n != len(args.aux_data_ptrs):
            raise DisaggError(f"cxltier disaggregation: room {self.room}: {n} aux buffers from the prefill, "
                              f"{len(args.aux_data_ptrs)} here")
        for i in range(n):
            at = args.aux_data_ptrs[i] + self.aux_index * args.aux_item_lens[i]
            if mgr.get_record(self.sources[0], f"aux/{i}", into=(at, int(args.aux_item_lens[i]))) is None:
                raise DisaggError(f"cxltier disaggregation: room {self.room}: aux buffer {i} of {n} not in its room")

    def abort(self):
        self.abort_notified = self._abort_all({"by": "decode", "nonce": self.nonce})
        self._conclude(KVPoll.Failed, self.reason or f"cxltier disaggregation: room {self.room}: aborted")

    def ensure_abort_notified(self, *, force_arm=False):
        if not self.abort_notified:
            self.abort()

    def is_abort_release_safe(self):
        return not self.loading

    def clear(self):
        self._end_room()  # SGLang is done with the request: so is this side


class CxlTierKVBootstrapServer:
    """SGLang's prefill starts a bootstrap server for its backend; this
    backend needs none (the rooms are in the tier), so it listens nowhere."""

    def __init__(self, host=None, port=None, **_):
        self.host, self.port = host, port

    def close(self):
        pass


def _test_gate():
    """Holds a decode's landing until a file the tests create exists
    (CXLTIER_PD_TEST_GATE_BEFORE_LOAD; unset in production)."""
    gate = os.environ.get("CXLTIER_PD_TEST_GATE_BEFORE_LOAD")
    deadline = time.monotonic() + 600  # a bound, far past any test's wait
    while gate and not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.01)


def _pick(block, indexes):
    """The keys at indexes of a KeyBlock, as a KeyBlock."""
    from ..prefix import KEY_BYTES

    raw = bytes(block.array)
    return _keyblock(b"".join(raw[i * KEY_BYTES : (i + 1) * KEY_BYTES] for i in indexes))


def _slice(block, start, n):
    """Keys start .. start+n of a KeyBlock, as a KeyBlock (one slice: this
    runs per part of every request)."""
    from ..prefix import KEY_BYTES

    return _keyblock(bytes(block.array)[start * KEY_BYTES : (start + n) * KEY_BYTES])


def _keyblock(raw):
    from ..prefix import KEY_BYTES, KeyBlock
    import ctypes

    return KeyBlock((ctypes.c_uint8 * len(raw)).from_buffer_copy(raw), len(raw) // KEY_BYTES)


# The plugin's part: SGLang learns the backend's name, its classes, and
# hands each sender and receiver its request's prompt.

_TARGETS = {
    "get_kv_class": "sglang.srt.disaggregation.utils.get_kv_class",
    "sender": "sglang.srt.disaggregation.prefill.PrefillBootstrapQueue.create_sender",
    "receiver": "sglang.srt.disaggregation.decode.DecodePreallocQueue._create_receiver_and_enqueue",
}


def _kv_class(original, transfer_backend, class_type):
    if str(getattr(transfer_backend, "value", transfer_backend)) != BACKEND:
        return original(transfer_backend, class_type)
    name = str(getattr(class_type, "value", class_type))
    return {"kvargs": original(transfer_backend, class_type) if name == "kvargs" else None,
            "manager": CxlTierKVManager, "sender": CxlTierKVSender, "receiver": CxlTierKVReceiver,
            "bootstrap_server": CxlTierKVBootstrapServer}.get(name)


def _kvargs_class(original, transfer_backend, class_type):
    """KVArgs is every backend's one container: asked for ours, SGLang's own."""
    if str(getattr(class_type, "value", class_type)) == "kvargs":
        from sglang.srt.disaggregation.base import KVArgs

        return KVArgs
    return _kv_class(original, transfer_backend, class_type)


def _give_sender_its_prompt(original, queue_, req, *args, **kwargs):
    made = original(queue_, req, *args, **kwargs)
    sender = getattr(req, "disagg_kv_sender", None)
    if isinstance(sender, CxlTierKVSender):
        sender.tokens = list(req.origin_input_ids)
        sender.kv_mgr.bind_pool(getattr(queue_, "token_to_kv_pool", None))
    return made


def _give_receiver_its_prompt(original, queue_, req, *args, **kwargs):
    decode_req = original(queue_, req, *args, **kwargs)
    receiver = getattr(decode_req, "kv_receiver", None)
    if isinstance(receiver, CxlTierKVReceiver):
        receiver.tokens = list(req.origin_input_ids)
        receiver.kv_mgr.bind_pool(getattr(queue_, "token_to_kv_pool", None))
    return decode_req


def _add_backend_member(TransferBackend):
    """Adds CXLTIER = "cxltier" to SGLang's TransferBackend, in place: every
    module that holds the class (the scheduler, the queues, the services)
    then takes the name. An Enum has no public way to grow; this is the
    one CPython's own Enum uses for its members (a member is an instance
    with _name_ and _value_, listed in the class's maps)."""
    if BACKEND in TransferBackend._value2member_map_:
        return False
    member = object.__new__(TransferBackend)
    member._name_, member._value_ = BACKEND.upper(), BACKEND
    type.__setattr__(TransferBackend, BACKEND.upper(), member)
    TransferBackend._member_map_[BACKEND.upper()] = member
    TransferBackend._value2member_map_[BACKEND] = member
    TransferBackend._member_names_.append(BACKEND.upper())
    return True


def install():
    """Registers the backend with SGLang: its name among the choices of
    --disaggregation-transfer-backend, a member of TransferBackend, its
    classes in get_kv_class, and the wraps that give each sender and
    receiver its request's prompt (the keys of its pages). Through SGLang's
    hook registry; True when it installed."""
    from sglang.srt.arg_groups.choices import DISAGG_TRANSFER_BACKEND_CHOICES, add_disagg_transfer_backend_choices
    from sglang.srt.disaggregation.utils import TransferBackend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if BACKEND in DISAGG_TRANSFER_BACKEND_CHOICES and BACKEND in TransferBackend._value2member_map_:
        return False
    if BACKEND not in DISAGG_TRANSFER_BACKEND_CHOICES:
        add_disagg_transfer_backend_choices([BACKEND])
    _add_backend_member(TransferBackend)
    HookRegistry.register(_TARGETS["get_kv_class"], _kvargs_class, HookType.AROUND)
    HookRegistry.register(_TARGETS["sender"], _give_sender_its_prompt, HookType.AROUND)
    HookRegistry.register(_TARGETS["receiver"], _give_receiver_its_prompt, HookType.AROUND)
    HookRegistry.apply_hooks()  # load_plugins applies them too; once each
    return True
