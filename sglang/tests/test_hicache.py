"""The HiCache adapter against the real library and tier. SGLang (and its
torch host pool) cannot run in CI, so StandInHostPool plays SGLang's
HostKVCache here: it implements only get_page_buffer_meta, the one call the
adapter makes, over pages in ctypes memory, with SGLang's layout (one
buffer per page for MLA, K then V per page for MHA)."""

import ctypes
from types import SimpleNamespace

import pytest

import cxltier
from cxltier.hicache import HiCacheAdapter


class StandInHostPool:
    """Stand-in for SGLang's HostKVCache (page_first layout)."""

    def __init__(self, pages, page_size, part_bytes, parts):
        self.page_size, self.part_bytes, self.parts = page_size, part_bytes, parts
        self.mem = ctypes.create_string_buffer(pages * parts * part_bytes)

    def get_page_buffer_meta(self, host_indices):
        ptrs, sizes = [], []
        for i in range(0, len(host_indices), self.page_size):
            page = host_indices[i] // self.page_size
            for part in range(self.parts):
                ptrs.append(ctypes.addressof(self.mem) + (page * self.parts + part) * self.part_bytes)
                sizes.append(self.part_bytes)
        return ptrs, sizes

    def fill(self, page, seed):
        for part in range(self.parts):
            off = (page * self.parts + part) * self.part_bytes
            ctypes.memmove(ctypes.addressof(self.mem) + off, bytes((seed + part + j) % 256 for j in range(self.part_bytes)), self.part_bytes)

    def page(self, page):
        off = page * self.parts * self.part_bytes
        return self.mem.raw[off : off + self.parts * self.part_bytes]


def adapter(device, pool, mla, tp_rank=0):
    a = HiCacheAdapter()
    cfg = SimpleNamespace(model_name="org/model", is_mla_model=mla, tp_rank=tp_rank, tp_size=2,
                          extra_config={"devices": device, "blocks": 64, "block_bytes": 4096})
    a._setup(cfg, pool)
    return a


@pytest.mark.parametrize("mla", [True, False])
def test_pages_round_trip_through_the_tier(built, device, mla):
    parts, page_size = (1 if mla else 2), 4
    src = StandInHostPool(8, page_size, 1024, parts)
    for p in range(8):
        src.fill(p, p * 3)
    writer = adapter(device, src, mla)
    keys = cxltier.page_keys(range(24), page_size)  # 6 pages
    assert writer.batch_exists(keys) == 0
    host = list(range(0, 6 * page_size))  # pages 0..5 of the host pool
    assert writer.batch_set_v1(keys[:3], host[: 3 * page_size]) == [True] * 3
    assert writer.batch_set_v1(keys[4:6], host[4 * page_size : 6 * page_size]) == [True, True]
    assert writer.batch_exists(keys) == 3  # page 3 is missing

    dst = StandInHostPool(8, page_size, 1024, parts)
    reader = adapter(device, dst, mla)
    into = list(range(2 * page_size, 8 * page_size))  # load into pages 2..7
    assert reader.batch_get_v1(keys, into) == [True, True, True, False, False, False]
    for i in range(3):
        assert dst.page(2 + i) == src.page(i)
    assert reader.get_stats()["ready"] == 5 * parts
    writer.close()
    reader.close()


def test_mha_ranks_do_not_share_and_mla_ranks_do(built, device):
    pool = StandInHostPool(2, 1, 256, 2)
    keys = cxltier.page_keys([7], 1)
    adapter(device, pool, mla=False, tp_rank=0).batch_set_v1(keys, [0])
    assert adapter(device, pool, mla=False, tp_rank=1).batch_exists(keys) == 0
    mla_pool = StandInHostPool(2, 1, 256, 1)
    adapter(device, mla_pool, mla=True, tp_rank=0).batch_set_v1(keys, [0])
    assert adapter(device, mla_pool, mla=True, tp_rank=1).batch_exists(keys) == 1


def test_whole_object_interface(built, device):
    a = adapter(device, None, mla=True)
    assert a.batch_set(["a" * 64, "b" * 64], [b"first", b"second"])
    out = [bytearray(16), bytearray(16)]
    got = a.batch_get(["a" * 64, "b" * 64], out)
    assert got[0] is out[0] and bytes(out[1][:6]) == b"second"
    assert a.exists("a" * 64) and not a.exists("c" * 64)


def test_plugin_without_sglang_does_nothing(built):
    from cxltier import plugin

    assert plugin.install() is False
