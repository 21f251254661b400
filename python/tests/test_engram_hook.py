"""The Engram forward-pass hook against the real library and a real tier
(CPU engine). SGLang's ModelRunner, ForwardBatch and ForwardMode do not
exist here: the classes named Stand-in* below copy only the fields the hook
reads, as named stand-ins for them."""

import json
import struct
import subprocess

import pytest

import cxltier
from cxltier.sglang import engram_hook
from test_engram import GEOMETRY, synthetic_row

LOOKUP = [7, 3, 99, 0, 42, 42, 5, 17, 64, 1]  # raw id -> compressed id (vocab 100)


@pytest.fixture
def loaded(cli, device, tmp_path):
    """The tier with synthetic tables of layers 1 and 3, and the geometry
    with a lookup table file."""
    (tmp_path / "lookup.bin").write_bytes(struct.pack(f"<{len(LOOKUP)}q", *LOOKUP))
    geo = dict(GEOMETRY, lookup=str(tmp_path / "lookup.bin"))
    path = tmp_path / "geo.json"
    path.write_text(json.dumps(geo))
    for layer in (1, 3):
        subprocess.run([cli, "engram", "load", "--config", str(path), "--layer", str(layer), "--synthetic", device],
                       check=True, capture_output=True)
    return device, geo, path


def expected_rows(geo, layer, compressed):
    """Rows of every position of a whole sequence, hashed in one piece."""
    return [r for pos in cxltier.engram_hash(geo, layer, compressed) for r in pos]


def check_pass(pf, batch, geo, whole, already):
    """Every layer's slots of this pass hold the rows of the new positions
    of each request, as hashing whole sequences gives them."""
    per = (geo["max_ngram"] - 1) * geo["heads_per_order"]
    for layer in (1, 3):
        got = batch.rows(layer)
        want = []
        for seq, before, n in zip(whole, already, batch.seq_lens):
            want += expected_rows(geo, layer, seq[: before + n])[before * per :]
        assert len(got.slots) == len(want)
        for row, slot in zip(want, got.slots):
            assert pf.read_row(layer, slot, geo["row_bytes"]) == synthetic_row(layer, row, geo["row_bytes"])


def test_pieces_hash_like_whole_sequences(loaded):
    device, geo, _ = loaded
    raw_a, raw_b = [1, 2, 3, 4, 5, 6], [9, 8, 7]
    with cxltier.Tier(device) as t, cxltier.EngramPrefetcher(t, geo, engine="cpu", slots=512) as pf:
        assert pf.layers == [1, 3] and pf.has_lookup
        hook = engram_hook.EngramForwardHook(pf)
        assert hook.raw_ids
        whole = [pf.compress(raw_a), pf.compress(raw_b)]
        assert whole[0] == [LOOKUP[i] for i in raw_a]
        # prefill of both, then decode steps one token each
        check_pass(pf, hook.begin([4, 7], [raw_a[:4], raw_b[:1]], [0, 0]), geo, whole, [0, 0])
        for step in range(2):
            ids = [[raw_a[4 + step]], [raw_b[1 + step]]]
            check_pass(pf, hook.begin([4, 7], ids, [4 + step, 1 + step]), geo, whole, [4 + step, 1 + step])
        assert hook.counters["prefetched"] == 3
        with pytest.raises(cxltier.InvalidError, match="raw id 10 at position 1"):
            hook.begin([4], [[1, 10]], [6])


def test_unknown_history_is_not_prefetched(loaded):
    device, geo, _ = loaded
    with cxltier.Tier(device) as t, cxltier.EngramPrefetcher(t, geo, engine="cpu", slots=512) as pf:
        hook = engram_hook.EngramForwardHook(pf)
        # a request arriving with a 5-token cached prefix the hook never saw
        assert hook.begin([2], [[1]], [5]) is None
        # one new token is not enough history for trigrams: still unknown
        assert hook.begin([2], [[3]], [6]) is None
        assert hook.counters["no_history"] == 2
        # now the last two ids are the history: exact again
        whole = [[0] * 5 + pf.compress([1, 3, 4])]  # the prefix ids do not matter for position 7
        check_pass(pf, hook.begin([2], [[4]], [7]), geo, whole, [7])
        # a reused index with a different count is never given old history
        assert hook.begin([2], [[1]], [3]) is None


class StandInMode:
    """Stand-in for SGLang's ForwardMode."""

    def __init__(self, name):
        self.name = name

    def is_idle(self):
        return self.name == "idle"

    def is_decode(self):
        return self.name == "decode"

    def is_extend(self):
        return self.name in ("extend", "mixed", "target_verify")

    def is_target_verify(self):
        return self.name == "target_verify"


class StandInBatch:
    """Stand-in for SGLang's ForwardBatch (the fields the hook reads)."""

    def __init__(self, mode, reqs, ids, seq_lens=None, extend_lens=None, prefix_lens=None):
        self.forward_mode = StandInMode(mode)
        self.req_pool_indices, self.input_ids = reqs, ids
        self.seq_lens_cpu, self.extend_seq_lens_cpu, self.extend_prefix_lens_cpu = seq_lens, extend_lens, prefix_lens


class StandInReqToTokenPool:
    def __init__(self):
        self.freed = []

    def free(self, idx):
        self.freed.append(idx)


class StandInModelRunner:
    """Stand-in for SGLang's ModelRunner: forward returns what the model saw."""

    def __init__(self):
        self.req_to_token_pool = StandInReqToTokenPool()

    def forward(self, forward_batch):
        return forward_batch.cxltier_engram


def test_model_runner_wrapper(loaded):
    device, geo, _ = loaded
    t = cxltier.Tier(device)
    pf = cxltier.EngramPrefetcher(t, geo, engine="cpu", slots=512)
    made = []

    def make(runner):
        made.append(engram_hook.EngramForwardHook(pf))
        return made[-1]

    cls = type("Runner", (StandInModelRunner,), {})
    assert engram_hook.wrap_model_runner(cls, make)
    assert not engram_hook.wrap_model_runner(cls, make)  # once only
    runner = cls()
    raw = [1, 2, 3, 4]
    whole = [pf.compress(raw)]
    got = runner.forward(StandInBatch("extend", [3], raw[:3], extend_lens=[3], prefix_lens=[0]))
    check_pass(pf, got, geo, whole, [0])
    got = runner.forward(StandInBatch("decode", [3], raw[3:], seq_lens=[4]))
    check_pass(pf, got, geo, whole, [3])
    assert runner.forward(StandInBatch("idle", [], [])) is None
    assert runner.forward(StandInBatch("target_verify", [3], [1], extend_lens=[1], prefix_lens=[4])) is None
    # SGLang frees the index: the history goes with it
    runner.req_to_token_pool.free(3)
    assert runner.req_to_token_pool.freed == [3]
    assert runner.forward(StandInBatch("decode", [3], [5], seq_lens=[5])) is None
    # a failing pass is counted and the model runs without prefetch
    assert runner.forward(StandInBatch("extend", [1], [1, 2], extend_lens=[3], prefix_lens=[0])) is None
    hook = made[0]
    assert len(made) == 1 and hook.counters["errors"] == 1 and hook.counters["skipped"] == 1
    t.close()
