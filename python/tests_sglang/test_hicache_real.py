"""The HiCache backend inside SGLang's real HiCacheController, with real
MHA and MLA device and host pools, for every layout the pools support and
both the zero-copy (interface_v1) and the generic (flat page) paths."""

import threading
from types import SimpleNamespace
import uuid

import pytest
import torch

import cxltier

PAGE, LAYERS, TOKENS = 4, 3, 64
MHA_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["layer_first", "page_first", "page_first_direct"]


def host_pool(mla, layout, dtype=torch.bfloat16):
    if mla:
        from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

        dev = MLATokenToKVPool(size=TOKENS, page_size=PAGE, dtype=dtype, kv_lora_rank=16, qk_rope_head_dim=8,
                               layer_num=LAYERS, device="cpu", enable_memory_saver=False)
        info = dev.get_device_pool_infos()[0].buffer_info
        host = MLATokenToKVPoolHost(info, host_to_device_ratio=2.0, host_size=0, page_size=PAGE, layout=layout,
                                    pin_memory=False, device="cpu", device_capacity_tokens=TOKENS, start_layer=0,
                                    end_layer=LAYERS, target_layer_num=LAYERS)
    else:
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

        dev = MHATokenToKVPool(size=TOKENS, page_size=PAGE, dtype=torch.bfloat16, head_num=2, head_dim=8,
                               layer_num=LAYERS, device="cpu", enable_memory_saver=False, enable_alt_stream=False)
        info = dev.get_device_pool_infos()[0].buffer_info
        host = MHATokenToKVPoolHost(info, host_to_device_ratio=2.0, host_size=0, page_size=PAGE, layout=layout,
                                    pin_memory=False, device="cpu", device_capacity_tokens=TOKENS, start_layer=0,
                                    end_layer=LAYERS)
    return dev, host


def controller(groups, dev, host, device, interface_v1, index="m", **more):
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator

    extra = {"backend_name": "cxltier", "module_path": "cxltier.sglang.hicache", "class_name": "CxlTierStorage",
             "devices": device, "index": index, "blocks": 256, "block_bytes": 16384}
    if interface_v1:
        extra["interface_v1"] = 1
    extra.update(more)
    alloc = TokenToKVPoolAllocator(TOKENS, torch.bfloat16, "cpu", dev, False)
    return HiCacheController(alloc, host, PAGE, groups, threading.Event(), storage_backend="dynamic",
                             storage_backend_extra_config=extra, model_name="org/model")


def page_hashes(n):
    from sglang.srt.mem_cache.utils import get_hash_str

    tokens = [int(x) for x in torch.randint(0, 50000, (n * PAGE,))]
    return get_hash_str(tokens, None, page_size=PAGE)


def fill(host, first_page, n):
    """Random bytes in pages first_page.. of the host pool; returns them."""
    pages = []
    for p in range(first_page, first_page + n):
        page = host.get_data_page(p * PAGE, flat=True)
        data = torch.randint(-100, 100, page.shape, dtype=torch.int16).to(page.dtype)
        host.set_from_flat_data_page(p * PAGE, data)
        pages.append(data.clone())
    return pages


def indices(first_page, n):
    return torch.arange(first_page * PAGE, (first_page + n) * PAGE, dtype=torch.int64)


class Op:
    request_id = "test"

    def is_terminated(self):
        return False


@pytest.mark.parametrize("interface_v1", [True, False], ids=["v1", "generic"])
@pytest.mark.parametrize("mla,layout", [(False, l) for l in MHA_LAYOUTS] + [(True, l) for l in MLA_LAYOUTS])
def test_controller_backs_up_and_loads_pages(built, device, sglang_process_groups, mla, layout, interface_v1):
    dev, host = host_pool(mla, layout)
    ctl = controller(sglang_process_groups, dev, host, device, interface_v1)
    try:
        assert type(ctl.storage_backend).__name__ == "CxlTierStorage"
        zero_copy = ctl.page_get_func.__name__ == "_page_get_zero_copy"
        assert zero_copy == interface_v1
        n = 5
        hashes = page_hashes(n)
        want = fill(host, 1, n)
        assert ctl.page_set_func(hashes, indices(1, n))
        assert ctl.storage_backend.batch_exists(hashes) == n
        assert ctl.storage_backend.batch_exists(hashes[:2] + page_hashes(1) + hashes[2:]) == 2
        fill(host, 10, n)  # other bytes where the pages will land
        assert ctl.page_get_func(Op(), hashes, indices(10, n)) == n
        for i in range(n):
            got = host.get_data_page((10 + i) * PAGE, flat=True)
            assert torch.equal(got.view(torch.int16), want[i].view(torch.int16)), f"page {i}"
    finally:
        ctl.storage_backend.close()


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_both_paths_share_pages(built, device, sglang_process_groups, mla):
    """A page stored zero-copy is found and read by a server on the generic
    path (the same keys and bytes), and the other way round."""
    dev, host = host_pool(mla, "layer_first")
    v1 = controller(sglang_process_groups, dev, host, device, True)
    generic = controller(sglang_process_groups, dev, host, device, False)
    try:
        for writer, reader in ((v1, generic), (generic, v1)):
            hashes = page_hashes(3)
            want = fill(host, 2, 3)
            assert writer.page_set_func(hashes, indices(2, 3))
            assert reader.storage_backend.batch_exists(hashes) == 3
            fill(host, 20, 3)
            assert reader.page_get_func(Op(), hashes, indices(20, 3)) == 3
            for i in range(3):
                got = host.get_data_page((20 + i) * PAGE, flat=True)
                assert torch.equal(got.view(torch.int16), want[i].view(torch.int16))
    finally:
        v1.storage_backend.close()
        generic.storage_backend.close()


def test_layouts_do_not_share_bytes(built, device, sglang_process_groups):
    """page_first orders a page's bytes differently from layer_first: its
    pages are other entries, never misread as layer-first ones."""
    dev, first = host_pool(False, "layer_first")
    _, other = host_pool(False, "page_first")
    a = controller(sglang_process_groups, dev, first, device, True)
    b = controller(sglang_process_groups, dev, other, device, True)
    try:
        hashes = page_hashes(2)
        fill(first, 1, 2)
        assert a.page_set_func(hashes, indices(1, 2))
        assert b.storage_backend.batch_exists(hashes) == 0
    finally:
        a.storage_backend.close()
        b.storage_backend.close()


def test_kv_dtypes_do_not_share_pages(built, device, sglang_process_groups, monkeypatch):
    """fp8_e4m3 and fp8_e5m2 pools both hold uint8: the server's
    --kv-cache-dtype (SGLang's published model config; patched here, where
    no server publishes it) keeps their pages apart, and a server of the
    same dtype finds them."""
    import sglang.srt.runtime_context as rc

    made = {}
    for name, dtype in (("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2), ("again", torch.float8_e4m3fn)):
        kv = "fp8_e4m3" if name == "again" else name
        monkeypatch.setattr(rc, "get_model", lambda kv=kv: SimpleNamespace(kv_cache_dtype=kv))
        dev, host = host_pool(True, "layer_first", dtype)
        assert host.dtype == torch.uint8  # what the pool alone cannot tell apart
        made[name] = (host, controller(sglang_process_groups, dev, host, device, True))
    try:
        hashes = page_hashes(2)
        fill(made["fp8_e4m3"][0], 1, 2)
        assert made["fp8_e4m3"][1].page_set_func(hashes, indices(1, 2))
        assert made["fp8_e5m2"][1].storage_backend.batch_exists(hashes) == 0
        assert made["again"][1].storage_backend.batch_exists(hashes) == 2
        assert made["fp8_e5m2"][1].storage_backend.kv_dtype == "fp8_e5m2"
    finally:
        for _, c in made.values():
            c.storage_backend.close()


def test_kv_dtype_from_config_or_pool(built, device, sglang_process_groups):
    """Without a published server config: extra_config's kv_dtype, else the
    host pool's own dtype (bf16 and fp16 pools never share)."""
    dev, host = host_pool(True, "layer_first")
    a = controller(sglang_process_groups, dev, host, device, True)
    b = controller(sglang_process_groups, dev, host, device, True, kv_dtype="fp8_e4m3")
    try:
        assert a.storage_backend.kv_dtype == "bfloat16" and b.storage_backend.kv_dtype == "fp8_e4m3"
        hashes = page_hashes(1)
        fill(host, 1, 1)
        assert a.page_set_func(hashes, indices(1, 1))
        assert b.storage_backend.batch_exists(hashes) == 0
    finally:
        a.storage_backend.close()
        b.storage_backend.close()


def test_unsupported_layout_is_refused_at_attach(built, device, sglang_process_groups):
    dev, host = host_pool(True, "page_first")
    host.layout = "page_first_kv_split"  # Ascend's split layout, which this backend does not store
    with pytest.raises(Exception, match="layout 'page_first_kv_split' is not supported"):
        controller(sglang_process_groups, dev, host, device, True)


def test_extra_pools_through_v2(built, device, sglang_process_groups):
    """A hybrid model's extra pool (a second real MLA host pool as the DSA
    indexer) is stored, counted and loaded through the v2 calls."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    dev, host = host_pool(True, "page_first")
    _, indexer = host_pool(True, "page_first")
    ctl = controller(sglang_process_groups, dev, host, device, True)
    backend = ctl.storage_backend
    try:
        backend.register_mem_host_pool_v2(indexer, PoolName.INDEXER)
        n = 4
        hashes = page_hashes(n)
        fill(host, 1, n)
        want = fill(indexer, 1, n)
        assert ctl.page_set_func(hashes, indices(1, n))
        put = backend.batch_set_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=indices(1, 3), keys=hashes[:3])])
        assert put == {"indexer": [True, True, True]}
        probe = [PoolTransfer(name=PoolName.INDEXER, keys=hashes, hit_policy=PoolHitPolicy.ALL_PAGES)]
        res = backend.batch_exists_v2(hashes, probe)
        assert res.kv_hit_pages == 3 and res.extra_pool_hit_pages == {"kv": 4, "indexer": 3}
        trailing = [PoolTransfer(name=PoolName.INDEXER, keys=hashes[-2:], hit_policy=PoolHitPolicy.TRAILING_PAGES)]
        assert backend.batch_exists_v2(hashes, trailing).restorable_prefix_pages == [1, 2, 3]
        fill(indexer, 10, n)
        got = backend.batch_get_v2([PoolTransfer(name=PoolName.INDEXER, host_indices=indices(10, n), keys=hashes)])
        assert got == {"indexer": [True, True, True, False]}
        for i in range(3):
            assert torch.equal(indexer.get_data_page((10 + i) * PAGE).view(torch.int16), want[i].view(torch.int16))
    finally:
        backend.close()


def test_sglangs_mooncake_backend_test_runs_on_cxltier(built, device, monkeypatch):
    """SGLang's own backend test (mooncake_store/test_mooncake_store.py),
    its functions unchanged, with our backend where it builds MooncakeStore
    (the config it passes names no tier, so the environment does)."""
    from sglang.srt.mem_cache.storage.mooncake_store import test_mooncake_store as shipped

    from cxltier.sglang.hicache import CxlTierStorage

    with cxltier.Tier(device) as t:
        t.prefix("default", blocks=256, block_bytes=16384).close()
    monkeypatch.setenv("CXLTIER_DEVICES", device)
    made = []

    def store(config):
        made.append(CxlTierStorage(config, {}))
        return made[-1]

    monkeypatch.setattr(shipped, "MooncakeStore", store)
    shipped.test_single_operation()
    for mla, rank, size in [(False, 0, 1), (True, 0, 1), (False, 1, 4), (True, 3, 8)]:
        shipped.test_batch_operation(shipped.make_hicache_storage_config(is_mla_model=mla, tp_rank=rank, tp_size=size))
    assert len(made) == 5
    for s in made:
        s.close()


def test_plugin_registers_no_named_backend(built):
    """SGLang 0.5.23's factory cannot build a backend registered by name
    (it only knows its built-ins), so the plugin registers none: the dynamic
    backend is the way in."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    from cxltier.sglang import plugin

    plugin.install()
    assert "cxltier" not in StorageBackendFactory._registry


def test_mha_ranks_do_not_share_and_mla_ranks_do(built, device):
    from cxltier.sglang.hicache import HiCacheAdapter

    def adapter(mla, rank, pool):
        a = HiCacheAdapter()
        a._setup(SimpleNamespace(model_name="m", is_mla_model=mla, tp_rank=rank, tp_size=2,
                                 extra_config={"devices": device, "blocks": 64, "block_bytes": 16384}), pool)
        return a

    for mla, shared in ((False, False), (True, True)):
        _, pool = host_pool(mla, "page_first")
        hashes = page_hashes(2)
        fill(pool, 1, 2)
        a, b = adapter(mla, 0, pool), adapter(mla, 1, pool)
        assert a.batch_set_v1(hashes, indices(1, 2)) == [True, True]
        assert b.batch_exists(hashes) == (2 if shared else 0)
        a.close()
        b.close()
