"""cxltier's unified-cache linker inside SGLang's own UnifiedRadixCache, on
CPU: built by SGLang's dynamic factory from the published flags, driven
through the tree's match, load-back, layer wait, load verdict and
write-through offload, as SGLang's scheduler drives them."""

import mmap
import os
import socket
import subprocess
import sys

import pytest
import torch

import cxltier
from linker_stack import LAYERS, Stack, layer_buffers, publish_server_args, same

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def published():
    from sglang.srt.runtime_context import reset_context

    yield
    reset_context()


def entries(device, index="linker"):
    t = cxltier.Tier(device)
    try:
        return t.prefix(index).stats()["ready"]
    finally:
        t.close()


def test_factory_builds_the_linker_from_the_flags(built, device, published):
    from sglang.srt.mem_cache.unified_cache.unified_cache_linker import UnifiedCacheLinker

    args = publish_server_args(device, 4)
    with Stack(args, "mha", 4) as s:
        assert isinstance(s.linker, UnifiedCacheLinker) and type(s.linker).__name__ == "CxlTierLinker"
        assert s.linker.num_layers == LAYERS and not s.linker.rank_replicated


@pytest.mark.parametrize("kind,page_size", [(k, p) for k in ("mha", "mla") for p in (1, 4, 16)] + [("dsa", 64)])
def test_round_trip_through_the_tree(built, device, published, kind, page_size):
    """A prompt stored by one server's tree is loaded by another's: every
    layer holds the stored KV by the time the forward waits for it."""
    args = publish_server_args(device, page_size)
    tokens = list(range(500, 500 + 5 * page_size + page_size // 2))  # a partial page is never stored
    a = Stack(args, kind, page_size)
    kv = a.store(tokens, seed=3)
    pools = len(a.linker._kvpools)  # DSA's indexer keys are entries of their own
    assert a.linker.stats["entries_written"] == 5 * pools and a.linker.stats["offload_failures"] == 0, a.linker.stats
    a.close()
    assert entries(device) == 5 * pools

    with Stack(args, kind, page_size) as b:
        hit, slots, seen, failed = b.load(tokens)
        assert hit == 5 * page_size and failed == []
        paged = [p for _, p in layer_buffers(b.pool, 0)]
        whole = [[x[:5] if p else x[: 5 * page_size] for x, p in zip(layer, paged)] for layer in kv]
        assert same(whole, seen)
        assert b.linker.stats["load_pages"] == 5 and b.linker.stats["load_failures"] == 0


def test_a_miss_loads_nothing(built, device, published):
    args = publish_server_args(device, 4)
    with Stack(args, "mha", 4) as s:
        hit, slots, _, failed = s.load(list(range(64)))
        assert hit == 0 and slots is None and failed == []
        assert s.linker.stats["load_batches"] == 0


def test_a_longer_prompt_loads_the_stored_prefix(built, device, published):
    args = publish_server_args(device, 4)
    a = Stack(args, "mla", 4)
    kv = a.store(list(range(40)), seed=5)
    a.close()
    with Stack(args, "mla", 4) as b:
        hit, _, seen, failed = b.load(list(range(40)) + list(range(900, 932)))
        assert hit == 40 and failed == [] and same(kv, seen)


def flip_in_tier(device, needle):
    """Flips a byte of the tier's copy of needle, found in the shm file
    (another process damaging shared memory)."""
    path = "/dev/shm/" + device.split(":", 1)[1]
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        at = m.find(needle)
        assert at >= 0, "page not found in the tier"
        m[at + 5] ^= 0x10


def test_a_damaged_page_fails_the_load_and_is_dropped(built, device, published):
    """Damage in the tier is caught by the checksum: SGLang aborts the
    request (its KV is never used), the entry is dropped, and the next
    request for the prompt misses and recomputes."""
    args = publish_server_args(device, 4)
    tokens = list(range(300, 324))
    a = Stack(args, "mha", 4)
    kv = a.store(tokens, seed=11)
    a.close()
    flip_in_tier(device, kv[LAYERS - 1][1][8:12].contiguous().view(torch.uint8).numpy().tobytes())

    with Stack(args, "mha", 4) as b:
        hit, _, _, failed = b.load(tokens, rid="damaged")
        assert hit == 24 and failed == ["damaged"]
        assert b.linker.stats["load_failures"] == 1
        assert entries(device) == 5  # of 6
        hit, _, _, failed = b.load(tokens, rid="again")
        assert hit == 8 and failed == []  # the pages before the dropped one


def test_an_evicted_page_fails_the_load(built, device, published):
    """A page evicted between lookup and load fails the batch's load
    (never a partial page set). The eviction is made at that moment by
    wrapping the linker's load, which queues the request's pages, with a
    delete of its last page."""
    args = publish_server_args(device, 4)
    tokens = list(range(60, 76))
    a = Stack(args, "mla", 4)
    a.store(tokens, seed=2)
    a.close()
    with Stack(args, "mla", 4) as b:
        original = b.linker.load

        def load_then_evict(rid, transfers):
            queued = original(rid, transfers)
            keys = b.linker._pending[rid]["kv"][0]
            for _, pool, mask in b.linker._kvpools:
                from cxltier.prefix import part_keys

                block = part_keys(keys[-1:], [mask])
                assert b.linker.index.delete([bytes(block.array)]) == 1
            return queued

        b.linker.load = load_then_evict
        hit, _, _, failed = b.load(tokens, rid="evicted")
        assert hit == 16 and failed == ["evicted"]


def test_sliding_window_model_round_trip(built, device, published):
    """Full attention and a sliding window (SWAKVPool): the full layers'
    pages and the SWA pages SGLang offloads with a node are stored and
    loaded, the SWA layers' window landing in the request's SWA slots; a
    length is restorable only where the window ending there is stored."""
    from sglang.srt.mem_cache.utils import get_hash_str

    from cxltier.prefix import part_keys

    args = publish_server_args(device, 1)  # SGLang's SWA allocator takes single tokens
    tokens = list(range(700, 732))  # the window is 8 tokens
    a = Stack(args, "swa", 1, layers=4)
    kv = a.store(tokens, seed=9)
    assert a.linker.stats["entries_written"] == 64, a.linker.stats  # the full pages, and the node's SWA pages
    a.close()
    with Stack(args, "swa", 1, layers=4) as b:
        hit, slots, seen, failed = b.load(tokens)
        assert hit == 32 and failed == []
        for layer in range(4):
            tail = slice(-8, None) if layer % 2 else slice(None)  # an SWA layer holds the window alone
            for want, got in zip(kv[layer], seen[layer]):
                assert torch.equal(want[tail], got[tail]), layer
        # SWA pages 10..19 gone (as when the tree dropped them before the
        # offload): a prompt of 20 has KV for all of it but no window ending
        # at 20, so the longest restorable prefix is 10 pages (its window,
        # pages 2..9, is there).
        keys = get_hash_str(tokens, None, page_size=1)[10:20]
        block = part_keys(keys, b.linker._masks["swa"])
        assert b.linker.index.delete([block.hex(i) for i in range(block.n)]) == 10
        hit, _, _, failed = b.load(tokens[:20] + [1, 2, 3, 4], rid="cut")
        assert hit == 10 and failed == []


def test_unsupported_pools_are_refused(built, device, published):
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPoolFP4
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType

    from cxltier.sglang.linker import CxlTierLinker, LinkerError

    args = publish_server_args(device, 4)
    with pytest.raises(LinkerError, match="Mamba state is not"):
        CxlTierLinker(args, None, components={ComponentType.FULL, ComponentType.MAMBA})

    class Alloc:
        def get_kvcache(self):
            return MHATokenToKVPoolFP4.__new__(MHATokenToKVPoolFP4)

    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=Alloc(), page_size=4)
    with pytest.raises(LinkerError, match="MHATokenToKVPoolFP4 KV pool is not supported"):
        CxlTierLinker(args, params, components={ComponentType.FULL})


@pytest.mark.parametrize("extra,message", [({"bogus": 1}, r"unknown linker_extra_config keys \['bogus'\]"),
                                           ({"blocks": "many"}, "'blocks' is 'many', not a number"),
                                           ({"verify": -1}, "'verify' is negative")])
def test_bad_config_is_refused_by_name(built, device, published, extra, message):
    from cxltier.sglang.linker import LinkerError

    args = publish_server_args(device, 4, **extra)
    with pytest.raises(LinkerError, match=message):
        Stack(args, "mha", 4)


def test_small_blocks_are_refused_with_the_size_needed(built, device, published):
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType  # noqa: F401

    from cxltier.sglang.linker import LinkerError

    t = cxltier.Tier(device)
    t.prefix("small", 16, 256).close()
    t.close()
    args = publish_server_args(device, 4, index="small")
    with pytest.raises(LinkerError, match="create an index with --block-bytes 768"):
        Stack(args, "mha", 4)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(device, kind, world=2, page_size=4):
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE)]))
    procs = [subprocess.Popen([sys.executable, "-W", "ignore", os.path.join(HERE, "linker_stack.py"), str(r), str(world),
                               str(port), device, kind, str(page_size)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for r in range(world)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    import json

    return [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]


def test_mla_ranks_share_one_copy(built, device):
    """Two TP ranks (OS processes in one gloo group) of an MLA model: each
    page is written once, found by the other rank, and both load it."""
    results = run_ranks(device, "mla")
    assert all(r["hit"] == 32 and r["failed"] == [] and r["same"] for r in results), results
    assert sum(r["stored"]["entries_written"] for r in results) == 8, results
    assert sum(r["stored"]["entries_present"] for r in results) == 8, results
    assert entries(device) == 8


def test_mha_ranks_stay_apart(built, device):
    """MHA ranks hold different heads: each rank's pages are its own."""
    results = run_ranks(device, "mha")
    assert all(r["hit"] == 32 and r["failed"] == [] and r["same"] for r in results), results
    assert [r["stored"]["entries_written"] for r in results] == [8, 8], results
    assert entries(device) == 16


def test_offloaded_pages_carry_their_tokens_for_kv_events(built, device, published):
    """With "kv_events", SGLang's write-through offload of a radix node
    through the linker (its _offload_node, wrapped as the plugin wraps it)
    records each page's tokens and parent, which the node's event stream
    reads: what routers match requests against."""
    from cxltier.cluster import kvevents
    from cxltier.sglang import linker

    linker.install_token_records()
    args = publish_server_args(device, 4, kv_events=1)
    tokens = list(range(700, 700 + 5 * 4 + 2))
    with Stack(args, "mla", 4) as s:
        s.store(tokens, seed=5)
    t = cxltier.Tier(device, name="events")
    try:
        stats = dict.fromkeys(("unparented", "damaged"), 0)
        sc = kvevents.Scanner(t, names=["linker"])
        pages = sc.scan(stats)
        sc.close()
    finally:
        t.close()
    keys = [int.from_bytes(bytes.fromhex(k)[:8], "big", signed=True) for k in cxltier.page_keys(tokens, 4)]
    assert set(pages) == set(keys) and stats == {"unparented": 0, "damaged": 0}, (pages, stats)
    for i, k in enumerate(keys):
        assert pages[k].tokens == tokens[4 * i : 4 * i + 4]
        assert pages[k].parent == (keys[i - 1] if i else None)
