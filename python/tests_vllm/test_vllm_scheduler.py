"""The connector's scheduler side driven by vLLM's own Scheduler, Request
and SchedulerOutput (scheduler_harness.py): no worker, no model, seconds a
test. Each test pins one decision an engine would otherwise reveal only in
its outputs: how many tokens match, which blocks a load fills, which blocks
a store covers, what a consumer waits for, what a partial block, a small
index and another block size do."""

import pytest

from scheduler_harness import Engine

BS = 16


@pytest.fixture
def engine(device, tmp_path):
    engines = []

    def make(**kw):
        e = Engine(device, str(tmp_path / f"e{len(engines)}"), **kw)
        engines.append(e)
        return e

    yield make
    for e in engines:
        e.close()


def prompt(blocks, base=1000, extra=0):
    return list(range(base, base + blocks * BS + extra))


def the_load(meta, name):
    loads = [m for m in meta.loads if m.req_id == name]
    assert len(loads) <= 1, loads
    return loads[0] if loads else None


def stores_of(meta, name):
    return [m for m in meta.stores if m.req_id == name]


def test_a_prefix_in_the_tier_is_loaded_into_the_blocks_vllm_gives_it(engine):
    e = engine()
    tokens = prompt(6, extra=5)
    keys = e.keys(tokens)
    assert len(keys) == 6
    e.put(keys[:4])
    req = e.add("a", tokens)
    out, meta = e.step()
    load = the_load(meta, "a")
    assert load is not None, meta
    ids = e.block_ids("a")
    assert load.blocks == ids[:4]
    assert load.keys == b"".join(keys[:4])
    # vLLM computes only what the tier did not hold.
    assert out.num_scheduled_tokens["a"] == len(tokens) - 4 * BS
    assert req.num_computed_tokens == len(tokens)


def test_a_miss_in_the_middle_ends_the_match(engine):
    e = engine()
    tokens = prompt(5)
    keys = e.keys(tokens)
    e.put([keys[0], keys[1], keys[3]])
    e.add("a", tokens)
    out, meta = e.step()
    assert the_load(meta, "a").blocks == e.block_ids("a")[:2]
    assert out.num_scheduled_tokens["a"] == len(tokens) - 2 * BS


def test_the_last_token_is_always_computed(engine):
    """A prompt of whole blocks, every one in the tier: the last block is
    computed (vLLM needs the last token's logits), never loaded."""
    e = engine()
    tokens = prompt(4)
    e.put(e.keys(tokens))
    e.add("a", tokens)
    out, meta = e.step()
    assert the_load(meta, "a").blocks == e.block_ids("a")[:3]
    assert out.num_scheduled_tokens["a"] == BS


def test_vllms_own_cache_hit_is_not_loaded_again(engine):
    """vLLM's prefix cache holds the first blocks (a finished request's),
    the tier more: only the blocks past vLLM's own hit are loaded."""
    e = engine()
    first = prompt(2, extra=3)
    e.add("a", first)
    for _ in range(10):
        e.step()
    assert e.requests["a"].is_finished()
    longer = prompt(6, extra=3)
    keys = e.keys(longer)
    assert e.keys(first) == keys[:2]
    e.put(keys[:5])  # the tier holds five, vLLM's own cache the first two
    e.add("b", longer)
    out, meta = e.step()
    load = the_load(meta, "b")
    assert load.blocks == e.block_ids("b")[2:5]
    assert load.keys == b"".join(keys[2:5])
    assert out.num_scheduled_tokens["b"] == len(longer) - 5 * BS


def test_a_chunked_prefill_stores_each_block_once_in_the_step_that_completes_it(engine):
    """max_num_batched_tokens 2 blocks: a 5.5-block prompt prefills in three
    steps; each stores the whole blocks it completed and nothing twice;
    the partial sixth block is never stored."""
    e = engine(batched_tokens=2 * BS)
    tokens = prompt(5, extra=BS // 2)
    keys = e.keys(tokens)
    e.add("a", tokens)
    stored = []
    for want in ([0, 1], [2, 3], [4]):
        _, meta = e.step()
        (mv,) = stores_of(meta, "a")
        ids = e.block_ids("a")
        assert mv.blocks == [ids[i] for i in want]
        assert mv.keys == b"".join(keys[i] for i in want)
        stored += want
    for _ in range(3):  # decode steps: no block is stored again, the partial one never
        _, meta = e.step()
        assert not stores_of(meta, "a")
    assert stored == [0, 1, 2, 3, 4]


def test_a_store_starts_past_the_blocks_the_tier_held(engine):
    e = engine()
    tokens = prompt(5, extra=1)
    keys = e.keys(tokens)
    e.put(keys[:2])
    e.add("a", tokens)
    _, meta = e.step()
    (mv,) = stores_of(meta, "a")
    assert mv.keys == b"".join(keys[2:5])
    assert mv.blocks == e.block_ids("a")[2:5]


def test_a_store_carries_the_tokens_of_its_blocks_for_kv_events(engine):
    e = engine(kv_events="1", batched_tokens=2 * BS)
    tokens = prompt(3, extra=1)
    keys = e.keys(tokens)
    e.add("a", tokens)
    _, meta = e.step()
    (first,) = stores_of(meta, "a")
    assert first.tokens == tokens[: 2 * BS] and first.parent is None
    _, meta = e.step()
    (second,) = stores_of(meta, "a")
    assert second.tokens == tokens[2 * BS : 3 * BS] and second.parent == keys[1]


def test_a_consumer_waits_for_a_producers_blocks_then_loads_them(engine):
    e = engine(role="kv_consumer", remote_wait_s="30")
    tokens = prompt(4, extra=2)
    keys = e.keys(tokens)
    e.add("a", tokens, params={"do_remote_prefill": True, "cxltier_blocks": 4})
    out, meta = e.step()
    assert "a" not in out.num_scheduled_tokens and the_load(meta, "a") is None
    e.put(keys[:2])
    out, meta = e.step()  # two of the four blocks it was told of: it waits on
    assert "a" not in out.num_scheduled_tokens
    e.put(keys[2:])
    out, meta = e.step()
    assert the_load(meta, "a").blocks == e.block_ids("a")[:4]
    assert out.num_scheduled_tokens["a"] == 2
    assert not meta.stores  # a consumer stores nothing


def test_a_consumer_not_told_to_wait_computes_at_once(engine):
    e = engine(role="kv_consumer")
    e.add("a", prompt(3, extra=2))
    out, meta = e.step()
    assert out.num_scheduled_tokens["a"] == 3 * BS + 2 and not meta.loads


def test_a_consumer_stops_waiting_after_remote_wait_s(engine):
    e = engine(role="kv_consumer", remote_wait_s="0")
    e.add("a", prompt(3, extra=2), params={"do_remote_prefill": True, "cxltier_blocks": 3})
    out, _ = e.step()
    assert out.num_scheduled_tokens["a"] == 3 * BS + 2


def test_a_producer_tells_the_consumer_how_many_blocks_to_wait_for(engine):
    e = engine(role="kv_producer")
    tokens = prompt(3, extra=5)
    e.add("a", tokens, max_tokens=1)
    e.step()
    assert e.requests["a"].is_finished()
    (params,) = [o.kv_transfer_params for o in e.outputs if o.request_id == "a" and o.finished]
    want = {"do_remote_prefill": True, "cxltier_blocks": 3, "cxltier_index": e.connector._index_name}
    assert params.items() >= want.items(), params


def test_a_failed_load_is_recomputed(engine):
    """The workers report a loaded block as failed: vLLM recomputes from
    there (kv_load_failure_policy "recompute"), the request goes on."""
    e = engine()
    tokens = prompt(4, extra=3)
    e.put(e.keys(tokens)[:4])
    req = e.add("a", tokens)
    _, meta = e.step(fail=lambda meta: [the_load(meta, "a").blocks[1]])
    assert the_load(meta, "a").blocks == e.block_ids("a")[:4]
    assert req.num_computed_tokens == BS  # only the block before the failed one counts
    out, _ = e.step()
    assert out.num_scheduled_tokens["a"] == len(tokens) - BS


@pytest.mark.parametrize("parts", [1, 3])
def test_a_prompt_longer_than_the_index_is_computed_past_what_is_left(engine, parts):
    """An index of 7 blocks, a 20-block prompt stored in one call (what
    does not fit is refused) or in three (later blocks evict the oldest):
    a later request loads only a leading run of blocks that are all there
    and computes the rest, and nothing fails."""
    e = engine(index_bytes=str(8 * 16 * 1024))
    blocks = e.connector.index.stats()["blocks"]
    assert blocks < 20
    tokens = prompt(20, extra=1)
    keys = e.keys(tokens)
    step = -(-20 // parts)
    for i in range(0, 20, step):
        assert set(e.put(keys[i:i + step])) <= {"stored", "no_space"}
    held = e.connector.index.has(keys)
    assert 0 < sum(held) <= blocks
    if parts == 1:
        assert held == [True] * blocks + [False] * (20 - blocks)  # the head kept, the rest refused
    else:
        assert not held[0] and held[-1]  # the oldest evicted for the newest
    lead = held.index(False)
    e.add("a", tokens)
    out, meta = e.step()
    load = the_load(meta, "a")
    assert (load.blocks if load else []) == e.block_ids("a")[:lead]
    assert out.num_scheduled_tokens["a"] == len(tokens) - lead * BS


def test_engines_of_other_block_sizes_share_nothing_and_fail_nothing(engine):
    a, b = engine(block_size=16), engine(block_size=32)
    assert a.connector._index_name != b.connector._index_name
    tokens = prompt(8, extra=1)
    a.put(a.keys(tokens))
    b.add("x", tokens)
    out, meta = b.step()
    assert not meta.loads and out.num_scheduled_tokens["x"] == len(tokens)


def test_a_cache_salt_keys_blocks_apart(engine):
    e = engine()
    tokens = prompt(3, extra=1)
    e.put(e.keys(tokens, salt="tenant-a"))
    e.add("a", tokens, salt="tenant-b")
    out, meta = e.step()
    assert not meta.loads and out.num_scheduled_tokens["a"] == len(tokens)
    other = prompt(3, base=5000, extra=1)
    e.put(e.keys(other, salt="tenant-a"))
    e.add("b", other, salt="tenant-a")
    out, meta = e.step()
    assert the_load(meta, "b").blocks == e.block_ids("b")[:3]


def test_a_chunk_ending_inside_a_block_stores_that_block_only_once_it_is_whole(engine):
    """Chunks of 2.5 blocks: a store never covers a block whose tokens are
    not all computed (its KV would be half garbage under a key that says
    whole)."""
    e = engine(batched_tokens=2 * BS + BS // 2)
    tokens = prompt(5, extra=BS // 2)
    keys = e.keys(tokens)
    e.add("a", tokens)
    for done, want in ((2 * BS + BS // 2, [0, 1]), (5 * BS, [2, 3, 4])):
        out, meta = e.step()
        assert e.requests["a"].num_computed_tokens == done
        (mv,) = stores_of(meta, "a")
        assert mv.keys == b"".join(keys[i] for i in want)
    _, meta = e.step()
    assert not stores_of(meta, "a")


def test_vllms_scheduler_refuses_the_connector_on_an_untested_release(engine, monkeypatch):
    """Through vLLM's own connector factory: the engine does not start."""
    import vllm

    from cxltier.vllm import connector as cv

    monkeypatch.setattr(vllm, "__version__", "0.99.0")
    monkeypatch.delenv(cv.UNTESTED_ENV, raising=False)
    with pytest.raises(cv.UnsupportedError, match="vLLM 0.99.0 is not a release"):
        engine()
    monkeypatch.setenv(cv.UNTESTED_ENV, "1")
    engine()


def test_a_large_load_runs_beside_the_other_requests(engine):
    """async_load_bytes 0: a request with a hit waits for its load
    (WAITING_FOR_REMOTE_KVS) while a request without one runs in the same
    steps; once the workers report the load landed it computes only what
    the tier lacked."""
    from vllm.v1.request import RequestStatus

    e = engine(async_load_bytes="0")
    hit, miss = prompt(4, extra=3), prompt(2, base=9000, extra=1)
    e.put(e.keys(hit))
    a, b = e.add("a", hit), e.add("b", miss)
    out, meta = e.step()
    load = the_load(meta, "a")
    assert load.background and load.blocks == e.block_ids("a")[:4]
    assert a.status == RequestStatus.WAITING_FOR_REMOTE_KVS and "a" not in out.num_scheduled_tokens
    assert out.num_scheduled_tokens["b"] == len(miss)  # the request without a hit does not wait
    out, meta = e.step()  # the load has not landed yet: still waiting
    assert "a" not in out.num_scheduled_tokens and not meta.loads
    e.step(landed={"a"})
    out, meta = e.step()
    assert out.num_scheduled_tokens["a"] == len(hit) - 4 * BS
    assert not meta.loads  # nothing is loaded twice
    assert b.is_finished() or b.num_computed_tokens > len(miss)


def test_a_small_load_stays_synchronous(engine):
    e = engine(async_load_bytes=str(4 * 16 * 1024 + 1))  # one byte more than four blocks
    tokens = prompt(4, extra=3)
    e.put(e.keys(tokens))
    e.add("a", tokens)
    out, meta = e.step()
    assert not the_load(meta, "a").background
    assert out.num_scheduled_tokens["a"] == 3


def test_a_failed_asynchronous_load_is_recomputed_from_the_failed_block(engine):
    e = engine(async_load_bytes="0")
    tokens = prompt(4, extra=3)
    e.put(e.keys(tokens))
    a = e.add("a", tokens)
    _, meta = e.step()
    failed = the_load(meta, "a").blocks[2]
    e.step(fail=lambda meta: [failed], landed={"a"})
    out, meta = e.step()
    assert out.num_scheduled_tokens["a"] == len(tokens) - 2 * BS
    assert a.num_computed_tokens == len(tokens)


def test_a_load_deadline_needs_vllm_to_recompute(engine):
    """The blocks a load deadline leaves out reach vLLM as load errors:
    under kv_load_failure_policy "fail" they would fail the request, so
    the connector refuses to start, naming the setting."""
    with pytest.raises(ValueError, match='load_deadline_ms needs kv_load_failure_policy "recompute"'):
        engine(load_deadline_ms="20", policy="fail")
    engine(load_deadline_ms="20")  # with "recompute" it starts
