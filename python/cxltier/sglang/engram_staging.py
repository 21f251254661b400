"""SGLang's Engram row stager reading the tier.

SGLang 0.5.23 stages an extend batch's Engram rows one batch ahead
(sglang.srt.layers.engram_staging.EngramRowStager, enabled by
SGLANG_OPT_DSV41_ENGRAM_HOST_STAGING=1 on GPUs without ATS): the scheduler
hashes the batch's windows on the host, gathers each layer's fp8 rows and
e8m0 scales from the shared host table into pinned memory (torch
index_select on 16 threads), copies them to the GPU on a side stream, and
the Engram layer only dequantises them (forward_batch.engram_staged_rows).

TierRowStager keeps all of SGLang's rules — which batches are staged, the
windows (cached prefixes through the requests' fill ids, encoder replays),
image positions read as the image token with look-back blocked
(EngramHasher.hash_windows), the copy stream and events — and replaces the
gather: each plane of each layer is one libcxltier call over the tier
object that backs the table (cxltier.sglang.engram_host), bounds-checked (a bad
id is an error naming the table, never a read outside it) and copied on
every core.

Decode and target-verify passes are not staged, by SGLang's rule: their
newest tokens (a verify pass's drafts) exist only on the GPU when the
scheduler runs. Their rows are read by the forward's engram_gather straight
from the tier table over UVA (TierHostTable.device_ptr), so speculative
decoding (DSPARK) gets every row from the same single copy.

install() puts the class in place of SGLang's (NgramEmbeddingManager
imports it at call time); the plugin does so with CXLTIER_ENGRAM_HOST_TABLE=1.
"""

import logging
import os

from .. import _native

logger = logging.getLogger(__name__)


# Below this many rows a stager call is torch's index_select (_gather).
SMALL_CALL = 1024

# Tensors a stager remembers as its planes (a few a layer); past this many
# a caller makes new views each call, and the memory starts over.
_SEEN_MAX = 256
_NONE = (None,)


def _base():
    from sglang.srt.layers.engram_staging import EngramRowStager

    return getattr(EngramRowStager, "_cxltier_base", EngramRowStager)


def make_stager_class():
    """TierRowStager, a subclass of the installed SGLang's EngramRowStager."""
    import torch  # bound here: an import statement in _gather costs a lookup every call

    base = _base()
    int64 = torch.int64

    class TierRowStager(base):
        _cxltier = True
        _cxltier_base = base

        def __init__(self, hasher, embeds, device):
            super().__init__(hasher, embeds, device)
            self.bind_tables(embeds)

        def bind_tables(self, embeds):
            """Maps each table plane SGLang gathers from (its tensor's address)
            to the tier object behind it: a weight plane to one gatherer of
            both planes, a scale plane to its own (for a call that does not
            follow its weights')."""
            from .engram_host import TierHostTable

            self.bind_init()
            for e in embeds:
                table = e.host_table
                if not isinstance(table, TierHostTable):
                    self.planes = None  # not ours: SGLang's own gather
                    return
                self.bind_planes(table.object, e.weight.shape[0], e.weight.shape[1], e.scale.shape[1],
                                 e.weight.data.data_ptr(), e.scale.data.data_ptr())

        def bind_init(self, threads=None):
            """No planes bound yet. threads bounds the threads one gather
            copies on (default $CXLTIER_ENGRAM_GATHER_THREADS, else 0: every
            core; calls below a few thousand rows stay on the caller's)."""
            # SGLang stages into pinned memory; a CPU-only process has none.
            self._pin = torch.cuda.is_available()
            self._threads = int(os.environ.get("CXLTIER_ENGRAM_GATHER_THREADS", "0")) if threads is None else threads
            self.planes, self._seen, self._scales = {}, {}, None

        def bind_planes(self, obj, rows, dim, scales, weight_ptr, scale_ptr):
            """Binds one table: rows of dim fp8 bytes at the start of tier
            object obj, then rows of scales bytes, read by SGLang through
            the tensors at weight_ptr and scale_ptr."""
            both = obj.gatherer([(0, dim), (rows * dim, scales)], rows, self._threads)
            self.planes[weight_ptr] = ("both", both, weight_ptr, scale_ptr)
            self.planes[scale_ptr] = ("scale", obj.gatherer([(rows * dim, scales)], rows, self._threads),
                                      scale_ptr, scale_ptr)
            self._seen.clear()

        def _plane(self, table):
            """(table, kind, gatherer, its address, its layer's scale
            address) for a plane of ours, None for a table of SGLang's own.
            Found by the tensor's address, then remembered by the tensor
            itself: stage() passes the same tensors every batch, and a dict
            keyed by the object costs a stage's small calls less than
            data_ptr() does."""
            found = self.planes.get(table.data_ptr()) if self.planes is not None else None
            if found is None:
                return None
            if len(self._seen) >= _SEEN_MAX:  # a caller making new views every call
                self._seen.clear()
            entry = self._seen[id(table)] = (table, *found)  # holds table: its id is not reused
            return entry

        def _gather(self, table, ids):
            """SGLang's stage() gathers a layer's weights, then its scales,
            with the same ids: the weights' call reads both planes in one
            library call into one pinned block, and the scales' call takes
            the half it left. A call below SMALL_CALL rows is torch's own
            index_select on the same tier table: for a few hundred rows a
            library call and an output tensor made from Python cost more
            than the rows (bench/engramhost; index_select makes its output
            inside one op), and this path is kept to a few bytecodes, since
            a Python line costs as much as a row here. torch checks every
            id as the library does; one out of range is an InvalidError
            naming the table."""
            if self._scales is None and self._seen.get(id(table), _NONE)[0] is table:
                n = ids.numel()
                if n < SMALL_CALL:
                    try:
                        if self._pin:
                            out = torch.empty((n, table.shape[1]), dtype=table.dtype, pin_memory=True)
                            return torch.index_select(table, 0, ids, out=out)
                        return torch.index_select(table, 0, ids)
                    except IndexError as e:
                        raise self._outside(table, e) from e
            return self._gather_planes(table, ids)

        def _outside(self, table, err):
            gather = self._seen[id(table)][2]
            return _native.InvalidError(-1, f"Engram table {gather.obj.name}: an id outside [0, {gather.rows}) ({err})")

        def _gather_planes(self, table, ids):
            """_gather past its fast path: a table not seen yet, a scale
            call after a weights' call, or a large call."""
            plane = self._seen.get(id(table))
            if plane is None or plane[0] is not table:
                plane = self._plane(table)
                if plane is None:
                    return super()._gather(table, ids)
            _, kind, gather, at, scale_at = plane
            kept = self._scales
            if kept is not None:
                self._scales = None
                if kind == "scale" and kept[0] is ids and kept[1] == at:
                    return kept[2]
            n = ids.numel()
            if n < SMALL_CALL:
                return self._gather(table, ids)  # _scales is None now: the short path
            if table.data_ptr() != at:  # the tensor was pointed at other memory since
                self._seen.pop(id(table), None)
                return self._gather(table, ids)
            given = ids
            if ids.dtype is not int64 or not ids.is_contiguous():
                ids = ids.to(int64).contiguous()
            out, views = gather.empty(n, pin_memory=self._pin)
            gather(ids, out)
            if kind == "both":
                self._scales = (given, scale_at, views[1])
            return views[0]

    return TierRowStager


def install():
    """Puts TierRowStager in place of SGLang's EngramRowStager. True when
    it changed something."""
    from sglang.srt.layers import engram_staging

    if getattr(engram_staging.EngramRowStager, "_cxltier", False):
        return False
    engram_staging.EngramRowStager = make_stager_class()
    return True
