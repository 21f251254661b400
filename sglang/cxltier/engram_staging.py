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
object that backs the table (cxltier.engram_host), bounds-checked (a bad
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

from . import _native

logger = logging.getLogger(__name__)


# Below this many rows a stager call is torch's index_select (_gather).
SMALL_CALL = 1024


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
            self.planes, self._scales = {}, None

        def bind_planes(self, obj, rows, dim, scales, weight_ptr, scale_ptr):
            """Binds one table: rows of dim fp8 bytes at the start of tier
            object obj, then rows of scales bytes, read by SGLang through
            the tensors at weight_ptr and scale_ptr."""
            self.planes[weight_ptr] = ("both", obj.gatherer([(0, dim), (rows * dim, scales)], rows, self._threads))
            self.planes[scale_ptr] = ("scale", obj.gatherer([(rows * dim, scales)], rows, self._threads))

        def _gather(self, table, ids):
            """SGLang's stage() gathers a layer's weights, then its scales,
            with the same ids: the weights' call reads both planes in one
            library call into one pinned block, and the scales' call takes
            the half it left. A call below SMALL_CALL rows is torch's own
            index_select on the same tier table: for a few hundred rows a
            library call and an output tensor made from Python cost more
            than the rows (bench/engramhost; index_select makes its output
            inside one op). torch checks every id as the library does; one
            out of range is an InvalidError naming the table."""
            plane = self.planes.get(table.data_ptr()) if self.planes is not None else None
            if plane is None:
                return super()._gather(table, ids)
            kind, gather = plane
            if kind == "scale" and self._scales is not None:
                kept, self._scales = self._scales, None
                if kept[0] is ids:
                    return kept[1]
            n = ids.numel()
            if n < SMALL_CALL:
                try:
                    if self._pin:
                        out = torch.empty((n, table.shape[1]), dtype=table.dtype, pin_memory=True)
                        return torch.index_select(table, 0, ids, out=out)
                    return torch.index_select(table, 0, ids)
                except IndexError as e:
                    raise _native.InvalidError(
                        -1, f"Engram table {gather.obj.name}: an id outside [0, {gather.rows}) ({e})") from e
            given = ids
            if ids.dtype is not int64 or not ids.is_contiguous():
                ids = ids.to(int64).contiguous()
            out, views = gather.empty(n, pin_memory=self._pin)
            gather(ids, out)
            if kind == "both":
                self._scales = (given, views[1])
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
