"""cxltier.vllm's own calls without an engine: settings, keys, the KV cache
forms it takes and refuses, and blocks of each form (MLA's included)
through the tier and back, byte for byte."""

import re

import pytest
import torch

from cxltier import Tier, _native
from cxltier.vllm import connector as cv
from cxltier.kvpool import KVPool

GEOM = cv.Geometry(block_size=16, layers=("l0", "l1"), layer_bytes=2 * 16 * 128 * 2, kind="mha",
                   dtype="auto:bfloat16", layout="LBHNC")


@pytest.mark.parametrize("extra,what", [
    ({"devise": "shm:x"}, "unknown kv_connector_extra_config keys"),
    ({"index_bytes": "64MB"}, "ambiguous"),
    ({"index_bytes": "-1"}, "non-negative integer"),
    ({"verify": "2"}, "verify='2': want 0 or 1"),
    ({"remote_wait_s": "7200"}, "remote_wait_s"),
    ({"remote_wait_s": "soon"}, "remote_wait_s='soon'"),
    ({"load_deadline_ms": "-1"}, "load_deadline_ms='-1': want 0..3600000 milliseconds"),
    ({"load_deadline_ms": "nan"}, "load_deadline_ms='nan'"),
    ({"load_deadline_ms": "20ms"}, "load_deadline_ms='20ms'"),
])
def test_bad_settings_are_refused_naming_them(extra, what):
    with pytest.raises(ValueError, match=what):
        cv.settings(extra, environ={})


def test_settings_defaults_and_environment():
    cfg = cv.settings({}, environ={"CXLTIER_DEVICES": "shm:node", "CXLTIER_PREFIX_KEY": "k"})
    assert cfg["device"] == "shm:node" and cfg["key"] == "k" and cfg["index_bytes"] == 1 << 30
    assert cfg["verify"] and not cfg["kv_events"] and cfg["remote_wait_s"] == 30 and cfg["load_deadline_ms"] == 0
    assert cv.settings({"load_deadline_ms": "12.5"}, environ={})["load_deadline_ms"] == 12.5
    assert cv.settings({"device": "shm:other", "index_bytes": "64MiB"}, environ={})["index_bytes"] == 64 << 20


def test_keys_chain_the_tokens_and_name_what_changes_the_kv(built):
    tokens = list(range(3, 3 + 64))
    seed = cv.key_seed("m", GEOM, 0)
    keys = cv.block_keys(tokens, 16, seed)
    assert len(keys) == 4 * 32
    assert cv.block_keys(tokens[:32], 16, seed) == keys[:64]  # a prefix's keys are the prefix of the keys
    assert cv.block_keys(tokens[:20] + [9] + tokens[21:], 16, seed)[:32] == keys[:32]
    assert cv.block_keys(tokens[:20] + [9] + tokens[21:], 16, seed)[32:64] != keys[32:64]

    class Req:
        cache_salt, lora_request, mm_features = None, None, []

    plain = cv.key_seed("m", GEOM, 0, Req())
    salted, lora, mm = Req(), Req(), Req()
    salted.cache_salt = "tenant"
    lora.lora_request = type("L", (), {"lora_name": "adapter"})()
    mm.mm_features = [type("F", (), {"identifier": "img0"})()]
    others = [cv.key_seed("m2", GEOM, 0, Req()), cv.key_seed("m", GEOM, 1, Req()), cv.key_seed("m", GEOM, None, Req()),
              cv.key_seed("m", cv.Geometry(**{**GEOM.__dict__, "dtype": "fp8_e4m3:uint8"}), 0, Req()),
              cv.key_seed("m", GEOM, 0, salted), cv.key_seed("m", GEOM, 0, lora), cv.key_seed("m", GEOM, 0, mm)]
    assert len({plain, *others}) == 1 + len(others)


def cpu_layer(num_blocks, heads=2, block=16, dim=64):
    return torch.empty(num_blocks, heads, block, 2 * dim, dtype=torch.bfloat16)


@pytest.mark.parametrize("make,per_layer", [
    (lambda nb: cpu_layer(nb), 1),  # vLLM's CPU backend: [blocks, heads, block, 2*dim]
    (lambda nb: torch.empty(nb * 4, 2, 4, 128, dtype=torch.bfloat16), 1),  # kernel blocks of 4 tokens
    (lambda nb: torch.empty(nb, 16, 576, dtype=torch.bfloat16), 1),  # MLA: [blocks, block, 512 + 64]
    (lambda nb: torch.empty(2, nb, 16, 2, 64, dtype=torch.bfloat16), 2),  # FlashAttention: [2, blocks, ...]
])
def test_the_forms_it_moves(make, per_layer):
    layers = [make(10), make(10)]
    layer_bytes = layers[0].numel() * 2 // 10
    buffers, per, chunk, stride, on_device = cv.pool_buffers(layers, 10, layer_bytes)
    assert per == per_layer and chunk == stride == layer_bytes // per_layer and not on_device
    assert len(buffers) == 2 * per_layer and all(n == 10 * chunk for _, n in buffers)


@pytest.mark.parametrize("layers,what", [
    ([cpu_layer(9)], r"shape \(9, 2, 16, 128\)"),
    ([cpu_layer(10).transpose(1, 2)], "non-contiguous"),
    ([cpu_layer(10), torch.empty(2, 10, 16, 2, 64, dtype=torch.bfloat16)], "different forms"),
])
def test_forms_it_refuses_are_named(layers, what):
    with pytest.raises(cv.LayoutError, match=what):
        cv.pool_buffers(layers, 10, cpu_layer(1).numel() * 2)


def random_caches(make, nb, layers):
    """layers caches of nb blocks (make(nb) each) of random bits, zeroed
    caches of the same form to land them in, and the bytes of a block of
    a layer."""
    src = [make(nb) for _ in range(layers)]
    for t in src:
        t.view(torch.int16).copy_(torch.randint(-30000, 30000, t.shape, dtype=torch.int16))
    return src, [torch.zeros_like(t) for t in src], src[0].numel() * 2 // nb


@pytest.mark.parametrize("make", [
    lambda nb: cpu_layer(nb),
    lambda nb: torch.empty(nb, 16, 576, dtype=torch.bfloat16),
    lambda nb: torch.empty(2, nb, 16, 2, 64, dtype=torch.bfloat16),
], ids=["cpu", "mla", "kv-major"])
def test_blocks_go_through_the_tier_and_back_byte_for_byte(device, make):
    """What wait_for_save and start_load_kv do, on two engines' caches:
    blocks 1, 4 and 7 of one land in blocks 0, 2 and 9 of the other."""
    nb = 10
    src, dst, layer_bytes = random_caches(make, nb, 3)
    keys = cv.key_block(cv.block_keys(list(range(48)), 16, cv.key_seed("m", GEOM, 0)))
    with Tier(device) as t:
        ix = t.prefix("vllm-layout", 32, 3 * layer_bytes + 64)
        pools = []
        for caches in (src, dst):
            buffers, per, chunk, stride, _ = cv.pool_buffers(caches, nb, layer_bytes)
            pools.append(KVPool(ix, buffers, per, chunk, stride))
        assert pools[0].store(keys, [1, 4, 7]) == ["stored"] * 3
        assert pools[0].store(keys, [1, 4, 7]) == ["present"] * 3
        load = pools[1].load(keys, [0, 2, 9])
        for layer in range(pools[1].layers):
            load.layer(layer)
        load.close()
        for p in pools:
            p.close()
        ix.close()
    block_dim = 1 if src[0].shape[0] == 2 else 0
    for s, d in zip(src, dst):
        s, d = s.view(torch.int16), d.view(torch.int16)  # random bits: NaNs compare unequal as floats
        for a, b in ((1, 0), (4, 2), (7, 9)):
            assert torch.equal(s.select(block_dim, a), d.select(block_dim, b))
        assert not d.select(block_dim, 1).any()  # nothing else written


def test_an_index_the_tier_cannot_hold_names_the_setting(built):
    """index_bytes of 1 GiB (the default) on a small tier: refused at once
    naming index_bytes (the engine died deep in a worker with 'tier space
    exhausted'); a size that fits opens."""
    from cxltier import _native
    from vllm_suite import tier_device

    cfg = cv.settings({}, environ={})
    with tier_device(built["cli"], "64MiB", "cxltier-vllm-small") as dev, Tier(dev) as t:
        cfg["device"] = dev
        with pytest.raises(_native.NoSpaceError, match="index_bytes"):
            cv.open_index(t, "too-big", GEOM, cfg)
        cfg["index_bytes"] = 16 << 20
        cv.open_index(t, "fits", GEOM, cfg).close()


@pytest.mark.parametrize("version,sleep,environ,refused", [
    ("0.32.0", False, {}, None),
    ("0.32.0+cpu", False, {}, None),
    ("0.33.0", False, {}, "vLLM 0.33.0 is not a release it is tested against (0.32.0)"),
    ("0.33.0", False, {"CXLTIER_VLLM_UNTESTED": "0"}, "set CXLTIER_VLLM_UNTESTED=1"),
    ("0.33.0", False, {"CXLTIER_VLLM_UNTESTED": "1"}, None),
    ("0.32.0", True, {}, "enable-sleep-mode"),
    ("0.33.0", True, {"CXLTIER_VLLM_UNTESTED": "1"}, "enable-sleep-mode"),
])
def test_an_untested_vllm_or_sleep_mode_is_refused_at_start(version, sleep, environ, refused):
    if refused is None:
        cv.check_vllm(version, sleep, environ)
        return
    with pytest.raises(cv.UnsupportedError, match=re.escape(refused)):
        cv.check_vllm(version, sleep, environ)


def test_vllm_is_told_the_connector_cannot_sleep():
    assert cv.CxlTierConnector.supports_sleep_mode(None) is False


class SlowLink:
    """The clock of a link on which every launch takes `per_call` seconds:
    each get the load makes moves real bytes through the tier, then moves
    this clock on (a stand-in for time, so the test does not hang on the
    machine's speed)."""

    def __init__(self, pool, per_call):
        self.pool, self.per_call, self.now, self.calls = pool, per_call, 0.0, 0

    def clock(self):
        return self.now

    def get(self, raw, ids):
        self.calls += 1
        self.pool.get(cv.key_block(raw), ids)
        self.now += self.per_call


@pytest.mark.parametrize("deadline,started,stored,want_landed,want_calls,error", [
    (0, 0.0, 6, 6, 1, None),  # no deadline: one launch, every block
    (0.025, 0.0, 6, 2, 2, None),  # 10 ms a block: the third would end at 30 ms
    (0.1, 0.0, 6, 6, 6, None),  # room for all
    (0.5, -1.0, 6, 0, 0, None),  # the deadline passed while the load queued
    (0.1, 0.0, 3, 3, 4, _native.NotFoundError),  # block 3 is gone: its run fails, the rest with it
])
def test_a_load_lands_what_its_deadline_allows_and_leaves_the_rest_to_vllm(device, deadline, started, stored,
                                                                           want_landed, want_calls, error):
    """land_in_time with a real pool, runs of one block, each 10 ms on
    the clock: what lands is a prefix of the blocks, byte for byte, and
    nothing past it is written; a run that would end past the deadline
    at the pace of the runs before it is not started."""
    nb = 6
    src, dst, layer_bytes = random_caches(cpu_layer, nb, 2)
    raw = cv.block_keys(list(range(nb * 16)), 16, cv.key_seed("m", GEOM, 0))
    with Tier(device) as t:
        ix = t.prefix("vllm-deadline", 32, 2 * layer_bytes + 64)
        pools = [KVPool(ix, *cv.pool_buffers(caches, nb, layer_bytes)[:4]) for caches in (src, dst)]
        assert pools[0].store(cv.key_block(raw[:stored * 32]), list(range(stored))) == ["stored"] * stored
        link = SlowLink(pools[1], 0.010)
        landed, err = cv.land_in_time(link.get, raw, list(range(nb)), 2 * layer_bytes, deadline, started,
                                      clock=link.clock, run_bytes=2 * layer_bytes)
        for p in pools:
            p.close()
        ix.close()
    assert landed == want_landed and link.calls == want_calls
    assert (err is None) if error is None else isinstance(err, error)
    for s, d in zip(src, dst):
        s, d = s.view(torch.int16), d.view(torch.int16)
        assert torch.equal(s[:landed], d[:landed])
        assert not d[landed:].any()  # nothing past the landed prefix is written
