"""KV events of a node tier: which pages the node holds, in the wire format
routers read (SGLang's and vLLM's KVEventBatch over ZMQ), so that a router
such as Dynamo's KV indexer sends each request to the node that holds its
prefix.

Two sides:

- **Recording** (in the engine: cxltier.tokens, written by SGLang's HiCache
  backend and linker and by vLLM's connector): one record per stored page
  beside the page index, with the page's key, its parent's and its token
  ids (see cxltier.tokens for the format).
- **Publishing** (EventStream, run by the node's uplink with --events):
  every interval it lists the records, asks the page index which pages are
  there, and publishes the difference from what it published last:
  BlockStored (block hash, parent hash, token ids, page size, medium
  EXTERNAL) parents first, and BlockRemoved for pages evicted, deleted or
  replaced by a restore. Records of pages that went stay until the token
  index evicts them (a page stored again is then announced again).

Sequence numbers start at the publisher's start time in microseconds, so a
restarted publisher continues above its predecessor; a subscriber that
finds a gap asks the replay socket, which answers from its buffer or, when
the batches asked for are older than the buffer (a restart, a late
subscriber), with the current contents: AllBlocksCleared then every page
held, as one batch numbered as the newest sent.

A block hash is the first 8 bytes of SGLang's page key (big-endian,
signed): the page key already chains the tokens of every page before it.
Tenants: by default a stream publishes only indexes without a tenant key;
a keyed index is published only when named, with its key, and one stream
carries the pages of one key only.
"""

import logging
import os
import threading
import time
from collections import deque

from .. import _native
from ..tokens import TOKENS_SUFFIX, RecordError, decode_record

logger = logging.getLogger("cxltier.cluster.kvevents")

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def block_hash(page_key):
    """The block hash published for a page: its key's first 8 bytes as a
    signed big-endian int64 (msgpack and Dynamo carry int64)."""
    return int.from_bytes(page_key[:8], "big", signed=True)


_UNREAD = object()  # a record not read yet, or gone while read


class _Page:
    __slots__ = ("hash", "parent", "tokens")

    def __init__(self, h, parent, tokens):
        self.hash, self.parent, self.tokens = h, parent, tokens


class _Watched:
    """One page index and its token index, as the stream reads them."""

    def __init__(self, tier, name, key):
        self.name = name
        self.pages = tier.prefix(name, key=key)
        self.tokens = tier.prefix(name + TOKENS_SUFFIX, key=key)
        self._buf = bytearray(self.tokens.stats()["block_bytes"])  # a record is at most a block: read into one buffer
        self.records = {}  # entry key -> _Page, or None for a damaged or unusable record

    def scan(self, stats):
        """{block hash: _Page} of the pages present now. The token record of
        a page that is gone stays (the token index evicts what it must, LRU):
        deleting it here would race a store of the same page, which finds
        its record present and writes none, and the page would never be
        announced again."""
        keys = self.tokens.keys()
        present = self.pages.has(keys) if keys else []
        out = {}
        for k, here in zip(keys, present):
            if not here:
                continue
            page = self.records.get(k, _UNREAD)
            if page is _UNREAD:
                page = self._read(k, stats)
                if page is _UNREAD:
                    continue  # the record went while we looked
                self.records[k] = page
            if page is not None:
                out[page.hash] = page
        for k in set(self.records) - set(keys):
            del self.records[k]
        return out

    def _read(self, k, stats):
        buf = self._buf
        try:
            served, lens = self.tokens.get([k], [buf])
        except _native.CxlTierError as e:
            logger.warning("cxltier kv events: token record of %r: %s", self.name, e)
            stats["damaged"] += 1
            return None
        if served != 1:
            return _UNREAD
        try:
            page, parent, tokens, parent_known = decode_record(bytes(buf[: lens[0]]))
        except RecordError as e:
            logger.warning("cxltier kv events: index %r: %s", self.name, e)
            stats["damaged"] += 1
            return None
        if not parent_known:
            stats["unparented"] += 1
            return None
        return _Page(block_hash(page), None if parent is None else block_hash(parent), tokens)

    def close(self):
        for ix in (self.tokens, self.pages):
            try:
                ix.close()
            except _native.CxlTierError:  # destroyed under us: the handle goes all the same
                pass


class Scanner:
    """The pages a tier's indexes hold now, from their token records: names
    (None: every index without a tenant key that has token records), keys
    ({index: tenant key})."""

    def __init__(self, tier, names=None, keys=None):
        self.tier, self.names, self.keys = tier, names, dict(keys or {})
        self._watched = {}
        self._last = {}  # index name -> its last good scan

    def scan(self, stats):
        """{block hash: _Page} over the indexes. An index destroyed (or
        destroyed and made again) since the last scan is dropped and opened
        afresh next time; a ClosedError of the tier itself (the client lost
        its lease) goes to the caller."""
        names = self.names if self.names is not None else self._default_names()
        current = {}
        for name in names:
            w = self._watch(name)
            if w is None:
                self._last.pop(name, None)
                continue
            try:
                pages = w.scan(stats)
            except _native.BusyError as e:
                # Busy for now (a lock another client holds): the index is
                # as it was, as far as anyone knows. Its last good scan
                # stands; published as gone, every page would be removed
                # and stored again.
                logger.info("cxltier kv events: index %r: %s; keeping its last scan", name, e)
                current.update(self._last.get(name, {}))
                continue
            except _native.CxlTierError as e:
                self._watched.pop(name).close()
                self._last.pop(name, None)
                self.tier.prefix_names()  # raises when the client itself is gone, not just the index
                logger.info("cxltier kv events: index %r: %s; opening it afresh", name, e)
                continue
            self._last[name] = pages
            current.update(pages)
        for name in set(self._watched) - set(names):
            self._watched.pop(name).close()
            self._last.pop(name, None)
        return current

    def _default_names(self):
        all_names = set(self.tier.prefix_names())
        return sorted(n for n in all_names if not n.endswith(TOKENS_SUFFIX) and n + TOKENS_SUFFIX in all_names)

    def _watch(self, name):
        w = self._watched.get(name)
        if w is None:
            try:
                w = _Watched(self.tier, name, self.keys.get(name))
            except _native.DeniedError:
                return None  # a tenant's index: published only on a stream named for it
            except _native.NotFoundError:
                return None  # not there (yet), or it has no token records
            self._watched[name] = w
        return w

    def close(self):
        for w in self._watched.values():
            w.close()
        self._watched.clear()


class Publication:
    """What a stream has told its subscribers, and the events that bring
    them to a new scan (no sockets: EventStream sends what this makes)."""

    def __init__(self, medium="EXTERNAL"):
        self.medium = medium
        self.published = {}  # block hash -> _Page, as the subscribers know it
        self.held = {}  # present pages whose parent is not published: a prefix match could not reach them

    def changes(self, current):
        """The events from what was published to current ({block hash:
        _Page}): removals first (AllBlocksCleared when nothing is left),
        then stores, each page after its parent."""
        removed = [h for h in self.published if h not in current]
        for h in removed:
            del self.published[h]
        todo = {h: p for h, p in current.items() if h not in self.published}
        stored = _parents_first(todo, lambda parent: parent is None or parent in self.published)
        for p in stored:
            self.published[p.hash] = p
        self.held = {h: p for h, p in todo.items() if h not in self.published}
        if removed and not self.published and not stored:
            events = [{"type": "AllBlocksCleared"}]  # every index emptied or destroyed: one event, not a list
        elif removed:
            events = [{"type": "BlockRemoved", "block_hashes": removed, "medium": self.medium}]
        else:
            events = []
        return events + self.stored_events(stored), len(stored), len(removed)

    def snapshot(self):
        """The events that bring a subscriber knowing nothing, or anything,
        to what is published: AllBlocksCleared, then every page."""
        pages = _parents_first(self.published, lambda parent: parent is None or parent not in self.published)
        return [{"type": "AllBlocksCleared"}] + self.stored_events(pages)

    def stored_events(self, pages):
        """BlockStored events, a chain of pages (each the parent of the
        next) in one event, as SGLang sends them."""
        events = []
        for p in pages:
            last = events[-1] if events else None
            if last is not None and last["block_hashes"][-1] == p.parent and last["block_size"] == len(p.tokens):
                last["block_hashes"].append(p.hash)
                last["token_ids"].extend(p.tokens)
                continue
            events.append({"type": "BlockStored", "block_hashes": [p.hash], "parent_block_hash": p.parent,
                           "token_ids": list(p.tokens), "block_size": len(p.tokens), "lora_id": None,
                           "medium": self.medium})
        return events


def _parents_first(pages, is_root):
    """pages ({hash: _Page}) reachable from a root (is_root(parent)), each
    after its parent, depth first so that chains stay together."""
    children = {}
    for p in pages.values():
        children.setdefault(p.parent, []).append(p)
    ready = [p for p in pages.values() if is_root(p.parent)]
    out, seen = [], set()
    while ready:
        p = ready.pop()
        if p.hash in seen:  # a damaged record naming itself an ancestor: once is enough
            continue
        seen.add(p.hash)
        out.append(p)
        ready.extend(children.get(p.hash, ()))
    return out


def one_tenant(names, keys):
    """Refuses a stream over indexes of different tenant keys (a keyless
    index counts as a tenant of its own): one stream, one tenant."""
    if names and len({keys.get(n) for n in names}) > 1:
        raise ValueError("kv events: one stream carries one tenant's pages: the indexes named "
                         f"({', '.join(names)}) have different keys; run a stream per tenant")


def _packer():
    """msgpack's packb, or msgspec's encoder (SGLang's virtualenv has
    msgspec and pyzmq, so the stream runs there with nothing added)."""
    try:
        import msgpack

        return msgpack.packb
    except ImportError:
        import msgspec

        return msgspec.msgpack.Encoder().encode


def replay_from(buffer, start):
    """The buffered (seq, payload) batches from sequence start on, or None
    when start is older than the oldest batch buffered (the subscriber then
    gets the current contents instead). A request for exactly the oldest
    batch is answered from the buffer."""
    if not buffer or buffer[0][0] > start:
        return None
    return [(seq, payload) for seq, payload in buffer if seq >= start]


class EventStream:
    """Publishes the KV events of a tier's page indexes on a ZMQ PUB socket
    (endpoint, bound), with an optional ROUTER replay socket (replay). It
    attaches to the tier (devices) as a client of its own: a client opens
    an index once, and the uplink beside it opens the same indexes.

    indexes: names to publish (default: every index without a tenant key
    that has token records); keys: {index: tenant key} for keyed ones, all
    of one key."""

    def __init__(self, devices, endpoint, replay=None, indexes=None, keys=None, interval=0.5, heartbeat=1.0,
                 medium="EXTERNAL", topic="", buffer_batches=10000, events_per_batch=512):
        import zmq

        from ..tier import Tier

        self._pack_fn = _packer()
        self.names = list(indexes) if indexes else None
        self.keys = dict(keys or {})
        one_tenant(self.names, self.keys)
        self.interval, self.heartbeat = interval, heartbeat
        self.topic = topic.encode()
        self.events_per_batch = events_per_batch
        self.publication = Publication(medium)
        self.stats = dict.fromkeys(("batches", "stored", "removed", "unparented", "damaged", "replays", "snapshots"), 0)
        self.tier = Tier(devices, name="cxltier-kv-events")
        _native.call("cxl_uplink_off", self.tier.handle)  # it reads what is here; it never asks for fills
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._replay = None
        try:
            self._pub.bind(endpoint)
            if replay:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                self._replay.bind(replay)
        except zmq.ZMQError as e:
            self._close_sockets()
            raise ValueError(f"kv events: cannot bind {replay if self._replay is not None else endpoint}: {e}") from e
        self.endpoint = self._pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.replay_endpoint = self._replay.getsockopt(zmq.LAST_ENDPOINT).decode() if self._replay else None
        self._seq = time.time_ns() // 1000  # above any predecessor's: see the module comment
        self._buffer = deque(maxlen=buffer_batches)  # (seq, payload)
        self.scanner = Scanner(self.tier, self.names, self.keys)
        self._stop = threading.Event()
        self._thread = None
        self._last_error = None
        self.failure = None  # why the stream stopped publishing on its own, once it has

    # The loop: scans, publishes, answers replays. One thread owns the sockets.

    def start(self):
        self._thread = threading.Thread(target=self._run, daemon=True, name="cxltier-kv-events")
        self._thread.start()
        return self

    def alive(self):
        """Whether the stream publishes: started, and not stopped by a
        failure (its tier client gone, say). A router keeps the last view
        of a node whose stream died: the node's health says so."""
        return self._thread is not None and self._thread.is_alive() and self.failure is None

    def stop(self, wait=10.0):
        """Stops the loop and, once its thread has ended, closes the
        sockets, the ZMQ context and the tier. A thread that does not end in
        time keeps them (they go with the process): closing the context
        under a thread that uses its sockets is undefined."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=wait)
            if self._thread.is_alive():
                logger.error("cxltier kv events: the publishing thread did not stop within %.0f s; its sockets stay", wait)
                return False
        self.scanner.close()
        self._close_sockets()
        return True

    def _close_sockets(self):
        for s in (self._pub, self._replay):
            if s is not None:
                s.close(0)
        self._ctx.term()
        self.tier.close()

    def _run(self):
        try:
            self._loop()
        except BaseException as e:  # the stream is down: say so to whoever asks (the uplink's /healthz)
            self.failure = f"{type(e).__name__}: {e}"
            logger.exception("cxltier kv events: stopped")

    def _loop(self):
        last_sent = 0.0
        next_scan = 0.0
        # A failure the tests inject (the stream's client lost); unset in production.
        fail_at = float(os.environ.get("CXLTIER_KV_EVENTS_TEST_FAIL_AFTER", "inf")) + time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= fail_at:
                raise _native.ClosedError(-6, "CXLTIER_KV_EVENTS_TEST_FAIL_AFTER: a failure injected by a test")
            if now >= next_scan:
                next_scan = now + self.interval
                try:
                    if self.step():
                        last_sent = now
                except _native.ClosedError as e:
                    self.failure = str(e)
                    logger.error("cxltier kv events: %s; stopping", e)
                    return
                except Exception as e:
                    if str(e) != self._last_error:  # a lasting failure is logged once, not every scan
                        self._last_error = str(e)
                        logger.exception("cxltier kv events: scan failed")
            if time.monotonic() - last_sent >= self.heartbeat:
                self._send([])  # tells a new subscriber where the sequence is: it asks for the rest
                last_sent = time.monotonic()
            wait = max(0.0, min(next_scan, last_sent + self.heartbeat) - time.monotonic())
            if self._replay is not None:
                if self._replay.poll(int(wait * 1000) + 1):
                    self._answer_replay()
            else:
                self._stop.wait(wait)

    def step(self):
        """One scan and the batches it makes; True when it sent any."""
        events, stored, removed = self.publication.changes(self.scanner.scan(self.stats))
        self._last_error = None
        self.stats["stored"] += stored
        self.stats["removed"] += removed
        for i in range(0, len(events), self.events_per_batch):
            self._send(events[i : i + self.events_per_batch])
        return bool(events)

    def _pack(self, events):
        return self._pack_fn([time.time(), events, None])

    def _send(self, events):
        payload = self._pack(events)
        seq = self._seq
        self._seq += 1
        self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        self.stats["batches"] += 1

    def _answer_replay(self):
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or len(frames[2]) != 8:
            logger.warning("cxltier kv events: a replay request of %d frames ignored", len(frames))
            return
        client, _, start = frames
        start = int.from_bytes(start, "big")
        self.stats["replays"] += 1
        batches = replay_from(self._buffer, start)
        if batches is not None:
            for seq, payload in batches:
                self._replay.send_multipart((client, b"", self.topic, seq.to_bytes(8, "big"), payload))
        else:
            # Older than the buffer: the state now, as of the newest batch
            # sent (a subscriber then skips the live batches it holds).
            self.stats["snapshots"] += 1
            newest = self._seq - 1
            payload = self._pack(self.publication.snapshot())
            self._replay.send_multipart((client, b"", self.topic, newest.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))
