"""Prefix KV pages in the tier: SGLang page keys and batched exists, set,
get and delete on a shared index."""

import ctypes
import hashlib
import threading
from itertools import accumulate

from . import _native
from .tokens import MAX_TOKENS, TokenRecorder

KEY_BYTES = 32

_STATUS = {0: "stored", 1: "present", 2: "no_space"}


def string_key(s):
    """The key of an arbitrary string (SHA-256 of its UTF-8 bytes), the same
    as the Go library's prefix.StringKey: use it on every side for keys that
    are not SGLang page digests."""
    return hashlib.sha256(s.encode()).digest()


def _key(k):
    if isinstance(k, str):
        try:
            raw = bytes.fromhex(k)
        except ValueError:
            raise ValueError(f"key {k!r} is not a hex digest (use string_key for other strings)") from None
    else:
        raw = bytes(k)
    if len(raw) != KEY_BYTES:
        raise ValueError(f"key of {len(raw)} bytes, want {KEY_BYTES}")
    return raw


def _keys(keys):
    raw, n = _raw_keys(keys)
    return (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw) if raw else None, n


def _raw_keys(keys):
    """(the keys back to back as one bytes object, their count). A prebuilt
    call (no argtypes) passes the bytes object's own buffer to the library,
    which only reads keys: nothing is copied."""
    keys = keys if isinstance(keys, (list, tuple)) else list(keys)
    if len(keys) == 1 and type(keys[0]) is bytes and len(keys[0]) == KEY_BYTES:
        return keys[0], 1
    raw = _joined(keys)
    if raw is None:  # mixed or malformed keys: one at a time, for the error that names the bad one
        raw = b"".join(_key(k) for k in keys)
    return raw, len(keys)


def _joined(keys):
    """All keys as one bytes object when they are all hex digests or all
    32-byte strings (SGLang's page keys are), in C-level calls rather than a
    Python step per key (30k keys: about 10x faster); None otherwise."""
    if not keys:
        return b""
    if isinstance(keys[0], str):
        if set(map(len, keys)) != {2 * KEY_BYTES}:
            return None
        try:
            return bytes.fromhex("".join(keys))
        except (TypeError, ValueError):
            return None
    if isinstance(keys[0], (bytes, bytearray)) and set(map(len, keys)) == {KEY_BYTES}:
        try:
            return b"".join(keys)
        except TypeError:
            return None
    return None


class Kept:
    """Pins PrefixIndex.keep_block took; release() (or the with block's
    end) gives them back. Pins of a process that ends go with its lease."""

    def __init__(self, handle, present):
        self._h, self.present = handle, present
        self._lock = threading.Lock()

    def release(self):
        with self._lock:
            h, self._h = self._h, 0
        if h:
            _native.call("cxl_prefix_unpin", h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class KeyBlock:
    """n keys back to back in one ctypes array, the form the library takes:
    what part_keys makes in one call, and what PrefixIndex's *_block calls
    take without building a Python object per key."""

    def __init__(self, array, n):
        self.array, self.n = array, n

    def __len__(self):
        return self.n

    def hex(self, i):
        return bytes(self.array[i * KEY_BYTES : (i + 1) * KEY_BYTES]).hex()

    def keys(self):
        """The keys as 32-byte bytes objects, in order."""
        raw = bytes(self.array)
        return [raw[i * KEY_BYTES : (i + 1) * KEY_BYTES] for i in range(self.n)]


def part_mask(tag):
    """The mask of one part of a page (model, rank, layout, part): the same
    as the Go library's prefix.PartMask."""
    return hashlib.sha256(b"cxltier/hicache/v1\x00" + tag.encode()).digest()


def part_keys(pages, masks):
    """The keys of every part of every page, page-major (prefix.PartKeys in
    Go, one call for the batch): each page string (SGLang's hex digest; any
    other string is hashed) XOR each mask. The pages go to Go joined by NUL
    bytes, which costs one join; a page holding a NUL makes Go refuse that
    form, and the pages go again with an array of their ends."""
    n, m = len(pages), len(masks)
    out = (ctypes.c_uint8 * max(n * m * KEY_BYTES, 1))()
    if n and m:
        raw = b"".join(masks)
        mask_arr = (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw)
        joined = "\0".join(pages).encode()
        try:
            _native.call("cxl_prefix_part_keys_joined", joined, len(joined), n, mask_arr, m, out)
        except _native.InvalidError:
            encoded = [p.encode() for p in pages]
            ends = (ctypes.c_int64 * n)(*accumulate(map(len, encoded)))
            _native.call("cxl_prefix_part_keys", b"".join(encoded), ends, n, mask_arr, m, out)
    return KeyBlock(out, n * m)


def page_keys(tokens, page_size, prior=None):
    """SGLang's page-key chain (get_hash_str) over tokens, one hex digest per
    whole page; prior is the hex key of the page before the first."""
    tokens = list(tokens)
    arr = (ctypes.c_int64 * max(len(tokens), 1))(*tokens)
    out = (ctypes.c_uint8 * (KEY_BYTES * max(len(tokens) // max(page_size, 1), 1)))()
    n = ctypes.c_int64()
    prior_arr = None
    if prior is not None:
        prior_arr = (ctypes.c_uint8 * KEY_BYTES).from_buffer_copy(_key(prior))
    _native.call("cxl_prefix_keys", page_size, arr, len(tokens), prior_arr, out, len(out) // KEY_BYTES, ctypes.byref(n))
    raw = bytes(out)
    return [raw[i * KEY_BYTES : (i + 1) * KEY_BYTES].hex() for i in range(n.value)]


def _pointers(buffers, writable):
    """(void* array, int64 size array, keep-alive list) for buffers given as
    objects with the buffer protocol or as (address, size) pairs."""
    n = len(buffers)
    ptrs = (ctypes.c_void_p * n)()
    sizes = (ctypes.c_int64 * n)()
    keep = []
    for i, b in enumerate(buffers):
        if isinstance(b, tuple):
            ptrs[i], sizes[i] = b
            continue
        mv = memoryview(b)
        if not mv.contiguous:
            raise ValueError(f"buffer {i} is not contiguous")
        if writable and mv.readonly:
            raise ValueError(f"buffer {i} is read-only")
        sizes[i] = mv.nbytes
        if mv.nbytes:
            if mv.readonly:
                arr = (ctypes.c_char * mv.nbytes).from_buffer_copy(mv)
            else:
                arr = (ctypes.c_char * mv.nbytes).from_buffer(mv.cast("B"))
            keep.append(arr)
            ptrs[i] = ctypes.addressof(arr)
    return ptrs, sizes, keep


def _page_tokens(tokens, n):
    """tokens (one sequence of token ids per page, all of one length) as one
    flat list, checked before anything is stored."""
    if len(tokens) != n:
        raise ValueError(f"{n} keys but tokens for {len(tokens)} pages")
    flat = []
    page_size = None
    for i, page in enumerate(tokens):
        page = [int(t) for t in page]
        if page_size is None:
            page_size = len(page)
            if not 0 < page_size <= MAX_TOKENS:
                raise ValueError(f"tokens: pages of {page_size} tokens (1..{MAX_TOKENS})")
        elif len(page) != page_size:
            raise ValueError(f"tokens: page {i} has {len(page)} tokens, page 0 {page_size}")
        bad = [t for t in page if not 0 <= t < 1 << 32]
        if bad:
            raise ValueError(f"tokens: page {i} holds {bad[0]}, outside 0..2^32-1")
        flat.extend(page)
    return flat


class PrefixIndex(_native.Child):
    """A prefix index of a tier. Keys are 32-byte digests (bytes) or their
    hex strings, as SGLang's get_hash_str makes them."""

    _kind = "prefix"
    _stats_bytes = 4096

    def __init__(self, tier, name="default", blocks=0, block_bytes=0, key=None):
        h = ctypes.c_uint64()
        _native.call("cxl_prefix_open", tier.handle, name.encode(), key.encode() if key else None, blocks, block_bytes,
                     ctypes.byref(h))
        self._opened(tier, h.value)
        self.name = name
        self._tenant_key = key
        self._hot_calls = threading.local()  # prebuilt hot calls, per thread (each has its error buffer)
        self._recorder = None  # the token index, once set is given tokens

    @property
    def handle(self):
        if self._h is None or self._tier._h is None:
            raise _native.ClosedError(-6, f"prefix index {self.name!r}: closed")
        return self._h

    def close(self):
        if self._recorder is not None:
            recorder, self._recorder = self._recorder, None
            recorder.close()
        super().close()

    def verify_reads(self, on=True):
        """Whether get and getv check each payload against its checksum (on
        by default). Off, a get is a plain copy (memory speed) and damage in
        the tier reaches the caller unnoticed."""
        _native.call("cxl_prefix_verify_reads", self.handle, 1 if on else 0)

    def exists(self, keys):
        """How many leading keys have entries (HiCache batch_exists)."""
        raw, n = _raw_keys(keys)
        fn, ref, out = self._hot("cxl_prefix_exists")
        fn(raw, ctypes.c_int64(n), ref)
        return out.value

    def set(self, keys, buffers, tokens=None, parent=None):
        """Stores buffers[i] under keys[i]; buffers are bytes-like objects or
        (address, size) pairs (zero-copy from host memory). Returns each
        key's status: "stored", "present" or "no_space".

        tokens, when given, are the token ids of each page (one sequence per
        key, all of one length: the page size), recorded beside the index
        (in "<name>@tokens") for the pages stored or present, so that the
        node's uplink publishes them as KV events (cxltier-uplink --events):
        keys[i]'s parent is keys[i-1], and keys[0]'s is parent (the key of
        the page before it; None when keys[0] starts a sequence). SGLang's
        and vLLM's adapters record their pages themselves."""
        if len(buffers) != len(keys):
            raise ValueError(f"{len(keys)} keys but {len(buffers)} buffers")
        flat = None if tokens is None else _page_tokens(tokens, len(keys))
        first_parent = None if parent is None else _key(parent)
        arr, n = _keys(keys)
        ptrs, sizes, keep = _pointers(buffers, writable=False)
        st = (ctypes.c_int8 * max(n, 1))()
        _native.call("cxl_prefix_set", self.handle, arr, n, ptrs, sizes, st)
        del keep
        status = [_STATUS[st[i]] for i in range(n)]
        if flat is not None and n:
            self._record_tokens(keys, status, flat, first_parent)
        return status

    def _record_tokens(self, keys, status, flat, first_parent):
        page_size = len(flat) // len(keys)
        if self._recorder is None or self._recorder.page_size != page_size:
            if self._recorder is not None:
                self._recorder.close()
            self._recorder = TokenRecorder(self._tier, self.name, self._tenant_key, self.stats()["blocks"], page_size)
        raw = [_key(k) for k in keys]
        # Records of consecutive stored pages, each run with its own first
        # parent: a page left out (no room) is not announced, and the page
        # after it still names it.
        i = 0
        while i < len(raw):
            if status[i] == "no_space":
                i += 1
                continue
            j = i
            while j < len(raw) and status[j] != "no_space":
                j += 1
            self._recorder.record(raw[i:j], raw[i:j], first_parent if i == 0 else raw[i - 1],
                                  flat[i * page_size : j * page_size])
            i = j

    def get(self, keys, buffers):
        """Copies the payloads of the longest present prefix of keys into
        buffers (writable bytes-like objects or (address, capacity) pairs).
        Returns (served, lengths). A payload that fails its checksum ends the
        prefix there: the entry is dropped and ChecksumError raised."""
        if len(buffers) != len(keys):
            raise ValueError(f"{len(keys)} keys but {len(buffers)} buffers")
        arr, n = _keys(keys)
        ptrs, caps, keep = _pointers(buffers, writable=True)
        lens = (ctypes.c_int64 * max(n, 1))()
        served = ctypes.c_int64()
        _native.call("cxl_prefix_get", self.handle, arr, n, ptrs, caps, lens, ctypes.byref(served))
        del keep
        return served.value, [lens[i] for i in range(served.value)]

    # Calls on a KeyBlock, with buffers as parallel lists of addresses and
    # sizes: the HiCache backend's path, with nothing built per key.

    def exists_pages(self, pages, masks):
        """How many leading pages (SGLang page strings) have every part (one
        key per mask, as part_keys makes them) stored: one call, keys made
        as they are probed, stopping at the first page missing a part."""
        if not pages or not masks:
            return 0
        joined = "\0".join(pages).encode()
        raw = b"".join(masks)
        out = ctypes.c_int64()
        try:
            _native.call("cxl_prefix_exists_pages", self.handle, joined, len(joined), len(pages),
                         (ctypes.c_uint8 * len(raw)).from_buffer_copy(raw), len(masks), ctypes.byref(out))
        except _native.InvalidError:
            if not any("\0" in p for p in pages):
                raise
            return self.exists_block(part_keys(pages, masks)) // len(masks)  # a page holds a NUL
        return out.value

    def exists_block(self, block):
        """How many leading keys of block have entries."""
        fn, ref, out = self._hot("cxl_prefix_exists")
        fn(block.array, ctypes.c_int64(block.n), ref)
        return out.value

    def has_block(self, block):
        """Whether each key of block has a ready entry, in one call."""
        out = (ctypes.c_int8 * max(block.n, 1))()
        self._hot("cxl_prefix_has")[0](block.array, ctypes.c_int64(block.n), out)
        return [out[i] == 1 for i in range(block.n)]

    def keep_block(self, block):
        """Pins each key of block that has a ready entry, reading nothing,
        so that eviction takes none of them until the Kept it returns is
        released: a prefill keeps the pages it published until its decode
        has landed them. Kept.present says which keys were there. A full
        pin table raises NoSpaceError with nothing kept."""
        out = (ctypes.c_int8 * max(block.n, 1))()
        h = ctypes.c_uint64()
        _native.call("cxl_prefix_keep", self.handle, block.array, block.n, out, ctypes.byref(h))
        return Kept(h.value, [out[i] == 1 for i in range(block.n)])

    def _hot(self, name):
        """(call, pointer to its output word, the word) of a hot call with
        this index's handle prebuilt (_native.prebuilt), one per thread and
        name: only the per-call arguments are made per call."""
        calls = getattr(self._hot_calls, "calls", None)
        if calls is None or calls[0] != self._h:
            self.handle  # a closed index raises here, before anything is built
            calls = self._hot_calls.calls = (self._h, {})
        hot = calls[1].get(name)
        if hot is None:
            out = ctypes.c_int64()
            hot = calls[1][name] = (_native.prebuilt(name, self._h), ctypes.byref(out), out)
        return hot

    def setv(self, block, per, ptrs, sizes):
        """Stores under key i the concatenation of its per buffers (ptrs and
        sizes hold len(block) * per entries, key-major). Returns each key's
        status, as set does."""
        m = block.n * per
        if len(ptrs) != m or len(sizes) != m:
            raise ValueError(f"{block.n} keys of {per} pieces need {m} buffers, got {len(ptrs)} and {len(sizes)} sizes")
        st = (ctypes.c_int8 * max(block.n, 1))()
        self._hot("cxl_prefix_setv")[0](block.array, ctypes.c_int64(block.n), ctypes.c_int64(per),
                                        (ctypes.c_void_p * max(m, 1))(*ptrs), (ctypes.c_int64 * max(m, 1))(*sizes), st)
        return [_STATUS[st[i]] for i in range(block.n)]

    def getv(self, block, per, ptrs, sizes):
        """Copies the longest present prefix of block's payloads, each into
        its per buffers in order (which must hold it exactly). Returns how
        many keys were served."""
        m = block.n * per
        if len(ptrs) != m or len(sizes) != m:
            raise ValueError(f"{block.n} keys of {per} pieces need {m} buffers, got {len(ptrs)} and {len(sizes)} sizes")
        fn, ref, served = self._hot("cxl_prefix_getv")
        served.value = 0
        try:
            fn(block.array, ctypes.c_int64(block.n), ctypes.c_int64(per), (ctypes.c_void_p * max(m, 1))(*ptrs),
               (ctypes.c_int64 * max(m, 1))(*sizes), ref)
        except _native.CxlTierError as e:
            e.served = served.value  # the payloads before the failure were copied and checked
            raise
        return served.value

    def delete(self, keys):
        arr, n = _keys(keys)
        out = ctypes.c_int64()
        _native.call("cxl_prefix_delete", self.handle, arr, n, ctypes.byref(out))
        return out.value

    def keys(self):
        """The keys (32-byte bytes) of every ready entry: a scan of the
        index without a lock, so entries changing during it may or may not
        be listed."""
        cap = 1024
        while True:
            out = (ctypes.c_uint8 * (cap * KEY_BYTES))()
            n = ctypes.c_int64()
            try:
                _native.call("cxl_prefix_list", self.handle, out, cap, ctypes.byref(n))
            except _native.RangeError:
                cap = n.value + n.value // 8 + 64  # entries are added while we grow: leave room
                continue
            raw = bytes(out)
            return [raw[i * KEY_BYTES : (i + 1) * KEY_BYTES] for i in range(n.value)]

    def has(self, keys):
        """Whether each key has a ready entry (each on its own; exists
        stops at the first missing one)."""
        raw, n = _raw_keys(keys)
        out = (ctypes.c_int8 * max(n, 1))()
        self._hot("cxl_prefix_has")[0](raw, ctypes.c_int64(n), out)
        return [out[i] == 1 for i in range(n)]

    def stats(self):
        return self._stats(self.handle)
