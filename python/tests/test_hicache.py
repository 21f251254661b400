"""The HiCache backend's keys and whole-object calls against the real
library and tier, without SGLang. Everything that touches SGLang's pools
and controller runs against SGLang itself in tests_sglang/."""

import ctypes
import hashlib
from types import SimpleNamespace

import pytest

import cxltier
from cxltier.sglang.hicache import HiCacheAdapter
from cxltier.prefix import part_keys, part_mask


def adapter(device, mla=True, tp_rank=0):
    a = HiCacheAdapter()
    cfg = SimpleNamespace(model_name="org/model", is_mla_model=mla, tp_rank=tp_rank, tp_size=2,
                          extra_config={"devices": device, "blocks": 64, "block_bytes": 4096})
    a._setup(cfg)
    return a


def test_part_keys_are_digest_xor_mask(built):
    digest = hashlib.sha256(b"page").hexdigest()
    masks = [part_mask("m/kv/LTD/k"), part_mask("m/kv/LTD/v")]
    for pages in ([digest, "not a digest", "ünïcode"], [digest, "a\0nul", "ünïcode"]):
        check_part_keys(pages, masks)


def check_part_keys(pages, masks):
    """Every key is the page's digest (or hash) XOR the part's mask; a page
    with a NUL takes the library's other form of the call."""
    block = part_keys(pages, masks)
    assert len(block) == 2 * len(pages)
    digests = [bytes.fromhex(p) if len(p) == 64 else hashlib.sha256(p.encode()).digest() for p in pages]
    for i, page in enumerate(digests):
        for j, m in enumerate(masks):
            want = bytes(a ^ b for a, b in zip(page, m))
            assert bytes.fromhex(block.hex(i * 2 + j)) == want


def test_whole_object_interface(built, device):
    a = adapter(device)
    src = ctypes.create_string_buffer(b"first-object", 32)
    assert a.set("a" * 64, target_location=ctypes.addressof(src), target_sizes=12)
    assert a.exists("a" * 64) and not a.exists("b" * 64)
    dst = ctypes.create_string_buffer(12)
    assert a.get("a" * 64, target_location=ctypes.addressof(dst), target_sizes=12) is True
    assert dst.raw == b"first-object"
    assert a.get("b" * 64, target_location=ctypes.addressof(dst), target_sizes=12) is False
    with pytest.raises(ValueError, match="target_sizes"):
        a.set("c" * 64, target_location=ctypes.addressof(src))
    a.close()


def test_pages_need_a_host_pool(built, device):
    a = adapter(device)
    with pytest.raises(ValueError, match="no host pool"):
        a.batch_exists(cxltier.page_keys(range(4), 4))
    a.close()


def test_plugin_without_sglang_installs_nothing(built, monkeypatch, caplog):
    try:
        import sglang  # noqa: F401
        pytest.skip("SGLang is installed: tests_sglang covers the plugin")
    except ImportError:
        pass
    from cxltier.sglang import plugin

    monkeypatch.setenv("CXLTIER_HISPARSE_HOST_POOL", "1")
    monkeypatch.setenv("CXLTIER_ENGRAM", "v4.1-flash")
    with caplog.at_level("WARNING", logger="cxltier.sglang.plugin"):
        assert plugin.install() == []
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "SGLang is not installed" in said and "not been tested" not in said and "not one this" not in said, said


def test_engram_host_table_without_torch_makes_nothing(built, device, monkeypatch):
    try:
        import torch  # noqa: F401
        pytest.skip("torch is installed: tests_sglang covers the table")
    except ImportError:
        pass
    from cxltier.sglang import engram_host
    from cxltier import objects

    monkeypatch.setenv("CXLTIER_DEVICES", device)
    monkeypatch.setattr(engram_host, "_tier", None)
    with pytest.raises(ImportError, match="needs torch"):
        engram_host.TierHostTable("per_rank", 1 << 20, "sglang_engram_1", None)
    t = cxltier.Tier(device)
    try:
        assert objects.list_objects(t) == []
    finally:
        t.close()
