"""The row stager over tier tables, against SGLang's: real EngramEmbedding
layers with their host tables in the tier (one process, SGLang's
GroupCoordinator over a one-rank gloo group), gathered by TierRowStager
and by the torch op SGLang's own stager runs (index_select), same ids.

What needs a GPU is not run here: stage() itself (CUDA stream and events)
and dequant_staged (a Triton kernel). The CPU patches are those of
engram_host_worker.py: torch.cuda.current_device and _sorted_host_reads."""

import pytest
import torch

import cxltier
from cxltier import engram_host, engram_staging


@pytest.fixture
def tier_embeddings(built, device, sglang_process_groups, monkeypatch):
    from sglang.srt.distributed.parallel_state import GroupCoordinator
    from sglang.srt.layers import engram
    from sglang.srt.runtime_context import get_parallel

    monkeypatch.setenv("CXLTIER_DEVICES", device)
    monkeypatch.setenv("CXLTIER_ENGRAM_MODEL", "stager-test")
    monkeypatch.setenv("SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE", "1")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(engram, "_sorted_host_reads", lambda device: False)
    monkeypatch.setattr(engram, "_HostTable", engram_host.TierHostTable)
    monkeypatch.setattr(engram_host, "_tier", None)
    group = GroupCoordinator([[0]], 0, "gloo", use_pynccl=False, use_mscclpp=False, use_custom_allreduce=False,
                             use_torch_symm_mem_all_reduce=False, use_hpu_communicator=False,
                             use_xpu_communicator=False, group_name="tp")
    rows = 5000
    embeds = []
    with get_parallel().override(tp_group=group):
        for layer in (1, 14):
            e = engram.EngramEmbedding(rows, 256, layer, column_bounds=(0, 2000, rows))
            g = torch.Generator().manual_seed(layer)
            e.weight.weight_loader(e.weight, torch.randint(0, 256, (rows, 256), dtype=torch.uint8, generator=g).view(e.weight.dtype))
            e.scale.weight_loader(e.scale, torch.randint(0, 256, (rows, 8), dtype=torch.uint8, generator=g).view(e.scale.dtype))
            e.finish_load(f"layer {layer}")
            embeds.append(e)
    yield embeds
    engram_host._tier.close()
    engram_host._tier = None


def stager_over(embeds):
    """A TierRowStager bound as SGLang's __init__ binds its tables, without
    the CUDA stream __init__ also makes (no GPU here)."""
    cls = engram_staging.make_stager_class()
    s = cls.__new__(cls)
    s.tables = [(e.weight.data.view(torch.uint8), e.scale.data.view(torch.uint8)) for e in embeds]
    s.bind_tables(embeds)
    return s


def test_tier_gather_matches_sglangs(tier_embeddings):
    s = stager_over(tier_embeddings)
    ids = torch.cat([torch.tensor([0, 4999, 7, 7]), torch.randint(0, 5000, (20_000,), generator=torch.Generator().manual_seed(3))])
    for weight, scale in s.tables:
        for table in (weight, scale):
            got = s._gather(table, ids)
            want = torch.index_select(table, 0, ids)
            assert got.shape == want.shape and torch.equal(got, want)


def test_bad_ids_are_errors_naming_nothing_outside(tier_embeddings):
    s = stager_over(tier_embeddings)
    weight = s.tables[0][0]
    for bad in ([5000], [-1], [0, 1 << 40]):
        with pytest.raises(cxltier.InvalidError, match="outside"):
            s._gather(weight, torch.tensor(bad))


def test_tables_of_sglangs_own_are_left_to_sglang(tier_embeddings):
    s = stager_over(tier_embeddings)
    other = torch.randint(0, 256, (10, 256), dtype=torch.uint8)
    assert s.planes.get(other.data_ptr()) is None
