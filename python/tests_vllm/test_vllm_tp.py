"""Tensor parallel in vLLM's real CPU engine: each engine runs two worker
processes (vLLM's multiprocessing executor), on one tier.

  S      TP 2, kv_both, KV events on: computes P and stores its blocks,
         each rank its own heads' half under its own keys
  R      TP 2, kv_both, a restart: P from the tier (every rank loads its
         half), and Q computed
  MLA    a dense DeepSeek-V2 at TP 2 on the MLA backend vLLM picks for
         this CPU: every rank holds the same latent blocks, so rank 0
         stores one copy and no rank stores another
         (Q again: from vLLM's own prefix cache where the backend has
         one)
  MLA-R  the same, restarted: where the backend prefills after a prefix
         it did not compute (AMX MLA), Q from the tier, every rank loading
         the one copy; where it cannot (the reference CPU MLA), computed.
         Either way it answers as MLA's Q again: on AMX MLA a prefill
         after cached blocks is not a full prefill's arithmetic (vLLM's
         own cache hit differed from the computation by 0.04 in a logprob,
         and then in tokens), so a load is held to what vLLM's own cache
         gives
         (beside S and R: it has an index of its own)

S's own computation of P is the reference: R must answer the same tokens
and top-5 logprobs, having found every whole block but the last.
"""

import os
import random

import pytest

from vllm_suite import in_parallel, index_keys, records, run_engine, same, tier_device

BLOCK = 128  # vLLM's CPU block size


def prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


P, Q = prompt(11, 400), prompt(12, 300)


def connector(device, index, **extra):
    return {"kv_connector": "CxlTierConnector", "kv_connector_module_path": "cxltier.vllm", "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"device": device, "index": index, "index_bytes": "32MiB", **extra}}


@pytest.fixture(scope="module")
def runs(built, tmp_path_factory):
    from vllm_engine import DEEPSEEK, write_model

    tmp = str(tmp_path_factory.mktemp("vllm-tp"))
    out = {}
    with tier_device(built["cli"], "256MiB", "cxltier-vllm-tp") as tier:
        llama = write_model(os.path.join(tmp, "llama"))
        mla = write_model(os.path.join(tmp, "deepseek"), DEEPSEEK)
        spec = lambda conn, reqs, model=llama, **kw: {"model_dir": model, "connector": conn, "requests": reqs,  # noqa: E731
                                                      "tp": 2, **kw}

        def restart():  # S, then R, on index vllm-tp
            out["S"], _ = run_engine(spec(connector(tier, "vllm-tp", kv_events=1), [{"name": "P", "tokens": P}]),
                                     tmp, "S")
            out["keys S"] = index_keys(tier, "vllm-tp")
            out["records"] = records(tier, "vllm-tp")
            out["R"], _ = run_engine(spec(connector(tier, "vllm-tp"), [{"name": "P", "tokens": P},
                                                                        {"name": "Q", "tokens": Q}]), tmp, "R")

        def mla_blocks():  # beside them, on index vllm-tp-mla: MLA, then MLA-R
            out["MLA"], _ = run_engine(spec(connector(tier, "vllm-tp-mla"), [{"name": "Q", "tokens": Q},
                                                                          {"name": "Q again", "tokens": Q}],
                                            model=mla), tmp, "MLA")
            out["keys MLA"] = index_keys(tier, "vllm-tp-mla")
            out["MLA-R"], _ = run_engine(spec(connector(tier, "vllm-tp-mla"), [{"name": "Q", "tokens": Q}], model=mla),
                                         tmp, "MLA-R")

        in_parallel(restart, mla_blocks)
    return out


def test_each_rank_stores_its_own_half_of_every_whole_block(runs):
    assert len(runs["keys S"]) == 2 * (len(P) // BLOCK)
    assert runs["S"]["P"]["cached"] == 0


def test_a_restarted_tp_engine_loads_every_rank_and_answers_the_same(runs):
    assert runs["R"]["P"]["cached"] == (len(P) - 1) // BLOCK * BLOCK
    assert same(runs["R"]["P"], runs["S"]["P"])
    assert runs["R"]["Q"]["cached"] == 0


def test_every_ranks_token_records_name_parents_that_are_there(runs):
    by_key = {page: (parent, tokens) for page, parent, tokens in runs["records"]}
    assert set(by_key) == runs["keys S"]
    roots = [k for k, (parent, _) in by_key.items() if parent is None]
    assert len(roots) == 2  # the first block of P, once per rank
    for page, (parent, tokens) in by_key.items():
        assert parent is None or parent in by_key
        assert len(tokens) == BLOCK


def test_mla_blocks_are_stored_once_for_every_rank(runs):
    # vLLM picks the MLA backend by CPU: AMX MLA (128-token blocks) where the
    # CPU has AMX tiles, its reference CPU MLA (16-token blocks) elsewhere.
    block = runs["MLA"]["block_size"]
    assert block in (16, 128), block
    assert len(runs["keys MLA"]) == len(Q) // block


def test_a_restarted_mla_engine_loads_the_one_copy_where_its_backend_can(runs):
    block = runs["MLA"]["block_size"]
    got, own = runs["MLA-R"]["Q"], runs["MLA"]["Q again"]
    if block == 128:  # AMX MLA: prefix caching on, prefills after loaded blocks
        assert got["cached"] == own["cached"] == (len(Q) - 1) // block * block
    else:  # the reference CPU MLA: vLLM turns prefix caching off, the connector loads nothing
        assert got["cached"] == own["cached"] == 0
    # The tier's blocks give what vLLM's own cache of the same blocks gives.
    assert same(got, own)
