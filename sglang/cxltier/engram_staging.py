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

logger = logging.getLogger(__name__)


def _base():
    from sglang.srt.layers.engram_staging import EngramRowStager

    return getattr(EngramRowStager, "_cxltier_base", EngramRowStager)


def make_stager_class():
    """TierRowStager, a subclass of the installed SGLang's EngramRowStager."""
    base = _base()

    class TierRowStager(base):
        _cxltier = True
        _cxltier_base = base

        def __init__(self, hasher, embeds, device):
            super().__init__(hasher, embeds, device)
            self.bind_tables(embeds)

        def bind_tables(self, embeds):
            """Maps each table plane SGLang gathers from (its tensor's address)
            to the tier object and plane offset behind it."""
            from .engram_host import TierHostTable

            self.planes = {}
            for e in embeds:
                table = e.host_table
                if not isinstance(table, TierHostTable):
                    self.planes = None  # not ours: SGLang's own gather
                    return
                n, dim = e.weight.shape[0], e.weight.shape[1]
                scales = e.scale.shape[1]
                obj = table.object
                self.planes[e.weight.data.data_ptr()] = (obj.gatherer([(0, dim)], n), dim)
                self.planes[e.scale.data.data_ptr()] = (obj.gatherer([(n * dim, scales)], n), scales)

        def _gather(self, table, ids):
            plane = self.planes.get(table.data_ptr()) if self.planes is not None else None
            if plane is None:
                return super()._gather(table, ids)
            import torch

            gather, row_bytes = plane
            out = torch.empty((ids.numel(), row_bytes), dtype=torch.uint8, pin_memory=torch.cuda.is_available())
            gather(ids.to(torch.int64).contiguous(), [out])
            return out

    return TierRowStager


def install():
    """Puts TierRowStager in place of SGLang's EngramRowStager. True when
    it changed something."""
    from sglang.srt.layers import engram_staging

    if getattr(engram_staging.EngramRowStager, "_cxltier", False):
        return False
    engram_staging.EngramRowStager = make_stager_class()
    return True
