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
from cxltier.sglang import engram_host, engram_staging


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


def test_a_layer_is_one_call_into_one_block(tier_embeddings):
    """stage()'s order (a layer's weights, then its scales, same ids): one
    library call fills one block, and the scales are its second half; a
    scale call with other ids, or of int32 ids, is still right."""
    s = stager_over(tier_embeddings)
    gen = torch.Generator().manual_seed(5)
    for weight, scale in s.tables:
        ids = torch.randint(0, 5000, (engram_staging.SMALL_CALL + 777,), generator=gen)
        rows, scales = s._gather(weight, ids), s._gather(scale, ids)
        assert torch.equal(rows, torch.index_select(weight, 0, ids))
        assert torch.equal(scales, torch.index_select(scale, 0, ids))
        assert rows.untyped_storage().data_ptr() == scales.untyped_storage().data_ptr()
        assert scales.data_ptr() == rows.data_ptr() + rows.numel()
        other = ids.to(torch.int32).flip(0)
        s._gather(weight, ids)
        got = s._gather(scale, other)
        assert torch.equal(got, torch.index_select(scale, 0, other.to(torch.int64)))
        assert got.untyped_storage().data_ptr() != rows.untyped_storage().data_ptr()


def test_bad_ids_are_errors_naming_nothing_outside(tier_embeddings):
    """Small calls (torch's index_select on the tier table) and large ones
    (the library's gather) refuse the same ids, naming the table."""
    s = stager_over(tier_embeddings)
    weight, scale = s.tables[0]
    pad = torch.zeros(engram_staging.SMALL_CALL, dtype=torch.int64)
    for bad in ([5000], [-1], [0, 1 << 40]):
        for ids in (torch.tensor(bad), torch.cat([pad, torch.tensor(bad)])):
            for table in (weight, scale):
                with pytest.raises(cxltier.InvalidError, match="sglang_engram_1.*outside"):
                    s._gather(table, ids)


def test_tables_of_sglangs_own_are_left_to_sglang(tier_embeddings):
    s = stager_over(tier_embeddings)
    other = torch.randint(0, 256, (10, 256), dtype=torch.uint8)
    assert s.planes.get(other.data_ptr()) is None


def test_kept_scales_are_only_their_own_layers(tier_embeddings):
    """A large weights' call keeps its layer's scales for the scales' call
    that follows with the same ids: a scale call of another layer with
    those ids gets its own rows."""
    s = stager_over(tier_embeddings)
    (w0, _), (_, s1) = s.tables
    ids = torch.randint(0, 5000, (engram_staging.SMALL_CALL + 5,), generator=torch.Generator().manual_seed(9))
    s._gather(w0, ids)
    assert torch.equal(s._gather(s1, ids), torch.index_select(s1, 0, ids))


def test_new_views_and_repointed_tensors_read_their_own_memory(tier_embeddings):
    """The stager remembers its tables by tensor object: a caller making a
    new view every call stays right and bounded, and a tensor pointed at
    another table since reads that table."""
    s = stager_over(tier_embeddings)
    (weight, _), (other, _) = s.tables
    gen = torch.Generator().manual_seed(11)
    for n in (24, engram_staging.SMALL_CALL + 1):
        for _ in range(engram_staging._SEEN_MAX + 10):
            view = weight.view(weight.shape)
            ids = torch.randint(0, 5000, (n,), generator=gen)
            assert torch.equal(s._gather(view, ids), torch.index_select(weight, 0, ids))
        assert len(s._seen) <= engram_staging._SEEN_MAX
    moved = weight.view(weight.shape)
    ids = torch.randint(0, 5000, (engram_staging.SMALL_CALL + 1,), generator=gen)
    s._gather(moved, ids)
    moved.set_(other)
    assert not torch.equal(weight, other)
    for n in (24, engram_staging.SMALL_CALL + 1):
        ids = torch.randint(0, 5000, (n,), generator=gen)
        assert torch.equal(s._gather(moved, ids), torch.index_select(other, 0, ids))
