"""cxltier.vllm.CxlTierConnector in vLLM's real engine on CPU.

Two sequences of engines side by side, each engine its own process tree,
on one tier; in each, an engine starts after the one before it exited.
On index vllm-test:

  A      kv_both, KV events on: stores P1 and P2 (a gate between them lets
         the test tell P2's blocks from P1's)
  C      kv_producer: P1 again (a restart: found in the tier), stores P3
         and returns kv_transfer_params for a proxy
  (the test clears P2's blocks in the tier to zeros)
  M      kv_consumer with verify 0, its own prefix cache off: loads P2's
         zeroed blocks as they are. Its tokens must differ from a plain
         run's, or the comparisons below could not catch wrong KV
  B      kv_consumer, every load asynchronous (async_load_bytes 0; C's
         loads are small, so synchronous): P1 (found), P1 under another
         cache salt (computed: the same engine without the tier's blocks),
         P2 (fails its check: recomputed), P3 with C's params (found), P4
         (never stored: computed, and B stores nothing)
  D      kv_consumer with a load deadline no load can make (1 ns): P1's
         blocks are in the tier, none lands, vLLM computes them

and beside them, on other indexes:

  plain  no connector: the reference tokens
  K1     kv_producer on index vllm-keyed, with a tenant key: stores P5
  (a process without the key replaces P2's blocks, valid CRCs and all)
  K2     kv_consumer on vllm-keyed with the key: P5's blocks fail their
         signatures, so they are recomputed, not used
  MLA    a dense DeepSeek-V2 on vLLM's reference CPU MLA backend (asked
         for: on a CPU with AMX tiles vLLM would pick its AMX MLA backend,
         whose blocks are 128 tokens), kv_both, in an index with room for 12
         blocks: a 25-block prompt overfills it. That backend cannot
         prefill after a prefix it did not compute, so the connector loads
         nothing there (tests_vllm/test_vllm_layout.py moves MLA blocks
         through the connector's own calls; tests_vllm/test_vllm_tp.py
         stores them on the backend vLLM picks)
"""

import os
import random

import pytest

from vllm_suite import (damage, forge, in_parallel, index_keys, read_when, records, run_engine, same, start_engine,
                        tier_device)

BLOCK = 128  # vLLM's CPU block size
TENANT = "vllm-tenant"  # the tenant key of index vllm-keyed


def prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


P1, P2, P3, P4 = prompt(1, 400), prompt(2, 300), prompt(3, 300), prompt(4, 300)
P5 = prompt(6, 300)  # the keyed index's alone: no other index holds its bytes or keys
Q1 = prompt(5, 400)


@pytest.fixture(scope="module")
def tier(built):
    with tier_device(built["cli"], "256MiB", "cxltier-vllm") as dev:
        yield dev


def connector(device, role, **extra):
    return {"kv_connector": "CxlTierConnector", "kv_connector_module_path": "cxltier.vllm", "kv_role": role,
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"device": device, "index": "vllm-test", "index_bytes": "32MiB", **extra}}


@pytest.fixture(scope="module")
def runs(tier, tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("vllm"))
    from vllm_engine import DEEPSEEK, write_model

    model = write_model(os.path.join(tmp, "llama"))
    mla = write_model(os.path.join(tmp, "deepseek"), DEEPSEEK)
    spec = lambda conn, reqs, **kw: {"model_dir": model, "connector": conn, "requests": reqs, **kw}  # noqa: E731
    out = {"keys": {}}

    def shared_index():  # A, C, M and B on index vllm-test, in that order
        gate = os.path.join(tmp, "gate-a")
        proc, path = start_engine(spec(connector(tier, "kv_both", kv_events=1), [
            {"name": "P1", "tokens": P1}, {"name": "P2", "tokens": P2, "wait_for": gate}]), tmp, "A")
        out["A"] = read_when(path, "P1", proc)
        out["keys"]["after P1"] = index_keys(tier, "vllm-test")
        open(gate, "w").close()
        assert proc.wait(timeout=900) == 0, proc.stderr.read()[-6000:]
        out["A"] = read_when(path, "P2", proc)
        out["keys"]["after A"] = index_keys(tier, "vllm-test")
        out["records"] = records(tier, "vllm-test")

        out["C"], _ = run_engine(spec(connector(tier, "kv_producer"), [
            {"name": "P1", "tokens": P1}, {"name": "P3", "tokens": P3}]), tmp, "C")
        out["keys"]["after C"] = index_keys(tier, "vllm-test")

        out["P2 keys"] = sorted(out["keys"]["after A"] - out["keys"]["after P1"])
        damage(tier, "vllm-test", out["P2 keys"], zero=True)
        out["M"], _ = run_engine(spec(connector(tier, "kv_consumer", verify=0), [{"name": "P2", "tokens": P2}],
                                      prefix_caching=False), tmp, "M")

        params = out["C"]["P3"]["params"]
        out["B"], _ = run_engine(spec(connector(tier, "kv_consumer", async_load_bytes=0), [
            {"name": "P1", "tokens": P1}, {"name": "P1 salted", "tokens": P1, "salt": "another tenant"},
            {"name": "P2", "tokens": P2}, {"name": "P3", "tokens": P3, "params": params},
            {"name": "P4", "tokens": P4}]), tmp, "B")
        out["keys"]["after B"] = index_keys(tier, "vllm-test")

        out["D"], out["D log"] = run_engine(spec(connector(tier, "kv_consumer", load_deadline_ms=1e-6),
                                                 [{"name": "P1", "tokens": P1}]), tmp, "D")
        out["keys"]["after D"] = index_keys(tier, "vllm-test")

    def other_indexes():  # plain (none), K1 and K2 on vllm-keyed, MLA on vllm-mla
        out["plain"], _ = run_engine(spec(None, [{"name": "P1", "tokens": P1}, {"name": "P2", "tokens": P2},
                                                 {"name": "P5", "tokens": P5}]), tmp, "plain")

        keyed = dict(index="vllm-keyed", key=TENANT)
        out["K1"], _ = run_engine(spec(connector(tier, "kv_producer", **keyed), [{"name": "P5", "tokens": P5}]), tmp,
                                  "K1")
        out["K keys"] = sorted(index_keys(tier, "vllm-keyed", TENANT))
        forge(tier, "vllm-keyed", TENANT, out["K keys"])
        out["K2"], _ = run_engine(spec(connector(tier, "kv_consumer", **keyed), [{"name": "P5", "tokens": P5}],
                                       prefix_caching=False), tmp, "K2")
        out["keys"]["after K2"] = index_keys(tier, "vllm-keyed", TENANT)

        small = connector(tier, "kv_both", index="vllm-mla", index_bytes=str(MLA_ROOM * MLA_BLOCK_BYTES))
        out["MLA"], _ = run_engine({"model_dir": mla, "connector": small, "prefix_caching": False,
                                    "attention_backend": "CPU_MLA", "requests": [
            {"name": "Q1", "tokens": Q1}, {"name": "Q1 again", "tokens": Q1}]}, tmp, "MLA")
        out["keys"]["MLA"] = index_keys(tier, "vllm-mla")

    # No engine of one chain touches the other's indexes: they run side by
    # side (the suite's longest part, halved).
    in_parallel(shared_index, other_indexes)
    return out


# vLLM's reference CPU MLA backend runs 16-token blocks: one in the index is 2 layers x
# 16 tokens x (512 + 64) bf16, and its trailer's room.
MLA_BLOCK = 16
MLA_BLOCK_BYTES = 2 * MLA_BLOCK * 576 * 2 + 64
MLA_ROOM = 12  # blocks: Q1's 25 do not fit


def full_blocks(tokens):
    return (len(tokens) - 1) // BLOCK


def test_the_first_engine_stores_every_whole_block(runs):
    assert len(runs["keys"]["after P1"]) == len(P1) // BLOCK
    assert len(runs["keys"]["after A"]) == len(P1) // BLOCK + len(P2) // BLOCK
    assert runs["A"]["P1"]["cached"] == 0


def test_a_restarted_engine_finds_the_blocks_and_computes_the_same_tokens(runs):
    got = runs["C"]["P1"]
    assert got["cached"] == full_blocks(P1) * BLOCK
    assert same(got, runs["plain"]["P1"])


def test_output_through_the_tier_equals_a_run_without_the_connector(runs):
    assert same(runs["A"]["P1"], runs["plain"]["P1"])
    assert same(runs["B"]["P1"], runs["plain"]["P1"])
    assert runs["B"]["P1"]["cached"] == full_blocks(P1) * BLOCK
    # The same engine computing P1 itself (another salt: no block of the tier's,
    # none of its own cache) gives the same tokens.
    assert runs["B"]["P1 salted"]["cached"] == 0
    assert same(runs["B"]["P1 salted"], runs["B"]["P1"])


def test_the_consumer_loads_what_the_producer_stored(runs):
    params = runs["C"]["P3"]["params"]
    assert params["do_remote_prefill"] is True and params["cxltier_blocks"] == len(P3) // BLOCK
    assert runs["B"]["P3"]["cached"] == full_blocks(P3) * BLOCK
    assert same(runs["B"]["P3"], runs["C"]["P3"])


def test_wrong_kv_changes_the_output(runs):
    """The power of every comparison here: an engine that trusts the tier
    (verify 0) and loads P2's zeroed blocks answers differently."""
    assert runs["M"]["P2"]["cached"] == (len(P2) - 1) // BLOCK * BLOCK
    assert not same(runs["M"]["P2"], runs["plain"]["P2"])


def test_a_damaged_block_is_recomputed_not_used(runs):
    assert same(runs["B"]["P2"], runs["plain"]["P2"])
    # The damaged entries were dropped when their check failed.
    assert not set(runs["P2 keys"]) & runs["keys"]["after B"]


def test_a_block_forged_without_the_key_is_recomputed_not_used(runs):
    """In an index with a tenant key, blocks a writer of the tier without
    the key replaced (bytes of its own with a valid CRC, which an index
    without a key serves: tests/test_kvpool.py) fail their signature when
    K2 loads them: dropped, recomputed, and K2 answers as a plain run (M
    shows, on P2, that wrong KV changes this model's answer)."""
    assert len(runs["K keys"]) == full_blocks(P5)
    assert same(runs["K2"]["P5"], runs["plain"]["P5"])
    assert not set(runs["K keys"]) & runs["keys"]["after K2"]


def test_a_load_past_its_deadline_is_computed_by_vllm_instead(runs):
    """D's deadline passes before any of P1's blocks can land: the
    connector lands none, says so, and reports them to vLLM, which
    computes them and answers as a plain run (had it not been told, it
    would have run on KV never written, which M shows changes the
    answer)."""
    assert "would have landed past load_deadline_ms" in runs["D log"]
    assert same(runs["D"]["P1"], runs["plain"]["P1"])
    assert runs["keys"]["after D"] == runs["keys"]["after B"]  # a load left out drops nothing from the tier


def test_stored_blocks_carry_their_tokens_for_kv_events(runs):
    by_key = {page: (parent, tokens) for page, parent, tokens in runs["records"]}
    assert set(by_key) == runs["keys"]["after A"]
    firsts = sorted(tuple(t) for p, (parent, t) in by_key.items() if parent is None)
    assert firsts == sorted([tuple(P1[:BLOCK]), tuple(P2[:BLOCK])])
    # Each later block names the block before it, whose record is there too.
    for page, (parent, tokens) in by_key.items():
        assert parent is None or parent in by_key
        assert len(tokens) == BLOCK


def test_an_overfull_index_and_an_engine_that_cannot_load_stay_correct(runs):
    mla = runs["MLA"]
    assert mla["block_size"] == MLA_BLOCK
    assert mla["Q1"]["cached"] == 0 and mla["Q1 again"]["cached"] == 0
    assert same(mla["Q1 again"], mla["Q1"])
    # 25 blocks stored into room for 12: the index holds what fits.
    assert 0 < len(runs["keys"]["MLA"]) <= MLA_ROOM
