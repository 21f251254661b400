"""Token records: which tokens each stored page holds, kept beside a page
index so that a node's KV event stream (cxltier.cluster.kvevents) can tell
routers the token ids of the pages a tier holds.

A router matches token ids, but an engine's storage calls see only page
keys. The engine adapters (SGLang's HiCache backend and linker, vLLM's
connector) write one record per page they store: a prefix index named
"<index>@tokens" (same tenant key, fixed size, so bounded) keyed by the
page's entry key, holding the page's key, its parent's and its token ids.
A record is written after its page, so a record whose page is absent
describes a page that went. Records are read back from shared memory and so
are untrusted: decode_record checks every field.
"""

import struct

TOKENS_SUFFIX = "@tokens"
_RECORD = struct.Struct("<4sHHI32s32s")  # magic, version, flags, token count, page key, parent page key
_MAGIC = b"CXTK"
_VERSION = 1
_HAS_PARENT = 1  # the parent key is the page before it
_PARENT_UNKNOWN = 2  # the server did not pass prefix keys: the parent cannot be named
MAX_TOKENS = 1 << 16


class RecordError(ValueError):
    """A token record read from the tier is damaged (shared memory is
    untrusted input: the record is skipped, never trusted)."""


def record_bytes(page_size):
    """The block size of a token index for pages of page_size tokens."""
    return _RECORD.size + 4 * page_size


def encode_record(page_key, parent, tokens, parent_known=True):
    if len(page_key) != 32 or (parent is not None and len(parent) != 32):
        raise ValueError("token record: keys are 32 bytes")
    if not 0 < len(tokens) <= MAX_TOKENS:
        raise ValueError(f"token record: {len(tokens)} tokens (1..{MAX_TOKENS})")
    flags = (_HAS_PARENT if parent is not None else 0) | (0 if parent_known else _PARENT_UNKNOWN)
    try:
        body = struct.pack(f"<{len(tokens)}I", *tokens)
    except struct.error as e:
        raise ValueError(f"token record: a token id outside 0..2^32-1: {e}") from None
    return _RECORD.pack(_MAGIC, _VERSION, flags, len(tokens), page_key, parent or bytes(32)) + body


def decode_record(raw):
    """(page key, parent key or None, tokens, parent known) of a record;
    RecordError when anything in it is inconsistent."""
    if len(raw) < _RECORD.size:
        raise RecordError(f"token record: {len(raw)} bytes, shorter than its header")
    magic, version, flags, n, page, parent = _RECORD.unpack_from(raw)
    if magic != _MAGIC:
        raise RecordError(f"token record: bad magic {magic!r}")
    if version != _VERSION:
        raise RecordError(f"token record: version {version}, this cxltier reads {_VERSION}")
    if flags & ~(_HAS_PARENT | _PARENT_UNKNOWN):
        raise RecordError(f"token record: unknown flags {flags:#x}")
    if not 0 < n <= MAX_TOKENS or _RECORD.size + 4 * n != len(raw):
        raise RecordError(f"token record: {n} tokens in a record of {len(raw)} bytes")
    tokens = struct.unpack_from(f"<{n}I", raw, _RECORD.size)
    return page, (parent if flags & _HAS_PARENT else None), list(tokens), not flags & _PARENT_UNKNOWN


class TokenRecorder:
    """Writes the token records of one page index (the SGLang server's side)."""

    def __init__(self, tier, index, key, blocks, page_size):
        self.page_size = page_size
        self.index = tier.prefix(index + TOKENS_SUFFIX, blocks, record_bytes(page_size), key)

    def record(self, entry_keys, page_keys, first_parent, tokens, parent_known=True):
        """Records pages: entry_keys[i] (the page's key in the page index)
        covers tokens[i*page_size:(i+1)*page_size]; the first page's parent
        is first_parent (None at the start of a sequence), each next page's
        the page before it. Pages recorded already are left as they are.
        Returns how many records were stored."""
        n = min(len(entry_keys), len(page_keys), len(tokens) // self.page_size)
        if n <= 0:
            return 0
        keys = list(entry_keys[:n])
        missing = [i for i, have in enumerate(self.index.has(keys)) if not have]
        if not missing:
            return 0
        records = []
        for i in missing:
            parent = first_parent if i == 0 else page_keys[i - 1]
            records.append(encode_record(page_keys[i], parent, tokens[i * self.page_size : (i + 1) * self.page_size],
                                         parent_known or i > 0))
        st = self.index.set([keys[i] for i in missing], records)
        return sum(s == "stored" for s in st)

    def close(self):
        self.index.close()
