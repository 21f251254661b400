"""KV events of node tiers, end to end with the real parts: SGLang's real
HiCacheController backs pages up into each node's tier (its backup thread,
wrapped as the cxltier plugin wraps it, records their tokens), each node's
uplink (python -m cxltier.cluster.uplink --events, no cluster) publishes them, and
Dynamo's real standalone KV indexer ($CXLTIER_DYNAMO_PYTHON) subscribes to
both and answers which node holds a request's prefix. SGLang's own
KVEventBatch decodes the wire."""

import os
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import cluster_harness as ch  # noqa: E402
from test_hicache_real import PAGE, controller, fill, host_pool, indices  # noqa: E402

MODEL = "org-model"


def tokens_of(n, seed):
    g = torch.Generator().manual_seed(seed)
    return [int(x) for x in torch.randint(0, 50000, (n * PAGE,), generator=g)]


def hashes_of(tokens):
    from sglang.srt.mem_cache.utils import get_hash_str

    return get_hash_str(tokens, None, page_size=PAGE)


class EventNode:
    """A node: its tier, SGLang's controller on it, and its uplink with --events."""

    def __init__(self, built, tmp_path, groups, name):
        self.node = ch.Node(sys.executable, built["cli"], built["lib"], str(tmp_path), name)
        self.events, self.replay = f"tcp://127.0.0.1:{ch.free_port()}", f"tcp://127.0.0.1:{ch.free_port()}"
        dev, self.host = host_pool(False, "layer_first")
        self.ctl = controller(groups, dev, self.host, self.node.devices, True, index=MODEL, kv_events=1)
        self.start()

    def start(self):
        self.node.start_uplink(args=["--events", self.events, "--events-replay", self.replay,
                                     "--events-interval", "0.1"])

    def back_up(self, tokens, hashes, prefix_keys, first_page=1):
        """Backs pages up through the controller's own queue and backup
        thread, as the radix cache does for a node."""
        fill(self.host, first_page, len(hashes))
        self.ctl.write_storage(indices(first_page, len(hashes)), tokens, hashes, prefix_keys)

    def stored(self):
        return self.node.metrics().get("events_stored", 0)

    def close(self):
        self.ctl.storage_backend.close()
        self.node.destroy()


@pytest.fixture
def indexer(tmp_path):
    ix = ch.Indexer(ch.require_dynamo(), str(tmp_path)).start()
    yield ix
    ix.kill()


@pytest.fixture
def nodes(built, tmp_path, sglang_process_groups):
    from cxltier.sglang import hicache

    hicache.install_token_records()  # what the plugin does at SGLang's start-up (test_plugin_real)
    made = []
    try:
        for name in ("a", "b"):
            made.append(EventNode(built, tmp_path, sglang_process_groups, name))
        yield made
    finally:
        for n in made:
            n.close()


def settle(check, what, timeout=20):
    return ch.wait_for(check, timeout, what)


def test_router_sends_a_prefix_to_the_node_that_holds_it(nodes, indexer):
    a, b = nodes
    for i, n in enumerate(nodes, 1):
        indexer.register(i, n.events, n.replay, MODEL, PAGE)
    tokens = tokens_of(6, seed=1)
    hashes = hashes_of(tokens)
    a.back_up(tokens, hashes, [])
    b.back_up(tokens[: 2 * PAGE], hashes[:2], [])
    settle(lambda: a.stored() >= 6 and b.stored() >= 2, "both nodes' events")
    got = settle(lambda: (m := indexer.matched(tokens, MODEL)).get(1) == 6 * PAGE and m.get(2) == 2 * PAGE and m,
                 "the indexer's view of both nodes")
    assert max(got, key=got.get) == 1, got  # node A is the one to route to

    # Pages deleted on A (an eviction, a delete: the index loses them) lower its score.
    backend = a.ctl.storage_backend
    from cxltier.prefix import part_keys

    backend.index.delete(part_keys(hashes[3:], backend._kv_masks).keys())
    settle(lambda: indexer.matched(tokens, MODEL).get(1) == 3 * PAGE, "A's score after losing pages 3-5")

    # A restarted publisher keeps the indexer right: while A's uplink is down
    # page 1 goes, and after the restart the indexer no longer counts it.
    a.node.kill_uplink()
    backend.index.delete(part_keys(hashes[1:2], backend._kv_masks).keys())
    a.start()
    settle(lambda: indexer.matched(tokens, MODEL).get(1) == PAGE, "A's score after its uplink restarted")
    assert indexer.matched(tokens, MODEL).get(2) == 2 * PAGE

    # And it goes on publishing: page 1 backed up again (its parent is page 0).
    a.back_up(tokens[PAGE : 2 * PAGE], hashes[1:2], hashes[:1], first_page=2)
    settle(lambda: indexer.matched(tokens, MODEL).get(1) == 3 * PAGE, "pages 1 and 2 back on A")


def test_the_wire_is_sglangs_kv_event_batch(nodes):
    import msgspec
    import zmq
    from sglang.srt.disaggregation.kv_events import BlockStored, KVEventBatch

    a = nodes[0]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(a.events)
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    try:
        time.sleep(0.3)  # the subscription reaches the publisher
        tokens = tokens_of(3, seed=2)
        hashes = hashes_of(tokens)
        a.back_up(tokens, hashes, [])
        deadline, stored, last_seq = time.monotonic() + 20, [], None
        while time.monotonic() < deadline and sum(len(e.block_hashes) for e in stored) < 3:
            if not sub.poll(500):
                continue
            topic, seq, payload = sub.recv_multipart()
            seq = int.from_bytes(seq, "big")
            assert last_seq is None or seq == last_seq + 1, "batches numbered one after another"
            last_seq = seq
            batch = decoder.decode(payload)
            stored += [e for e in batch.events if isinstance(e, BlockStored)]
        assert sum(len(e.block_hashes) for e in stored) == 3, stored
        want = [int.from_bytes(bytes.fromhex(h)[:8], "big", signed=True) for h in hashes]
        assert [h for e in stored for h in e.block_hashes] == want
        assert stored[0].parent_block_hash is None
        assert [t for e in stored for t in e.token_ids] == tokens
        assert all(e.block_size == PAGE and e.medium == "EXTERNAL" and e.lora_id is None for e in stored)
    finally:
        sub.close(0)
        ctx.term()


def test_a_keyed_index_is_not_published_by_default(built, tmp_path, sglang_process_groups):
    from cxltier.sglang import hicache

    hicache.install_token_records()
    node = ch.Node(sys.executable, built["cli"], built["lib"], str(tmp_path), "tenant")
    events = f"tcp://127.0.0.1:{ch.free_port()}"
    dev, host = host_pool(False, "layer_first")
    ctl = controller(sglang_process_groups, dev, host, node.devices, True, index="acme", kv_events=1, key="acme-key")
    try:
        node.start_uplink(args=["--events", events, "--events-interval", "0.1"])
        tokens = tokens_of(2, seed=3)
        fill(host, 1, 2)
        ctl.write_storage(indices(1, 2), tokens, hashes_of(tokens), [])
        settle(lambda: ctl.storage_backend._recorder is not None
               and ctl.storage_backend._recorder.index.stats()["ready"] == 2, "the tenant's token records")
        time.sleep(0.5)  # several scans
        assert node.metrics().get("events_stored", 0) == 0
    finally:
        ctl.storage_backend.close()
        node.destroy()


def test_pages_a_node_fetched_from_the_cluster_are_announced(built, tmp_path, sglang_process_groups):
    """Node B never backs these pages up: its prefetch query (SGLang's
    _storage_hit_query, wrapped) finds them through its uplink in the
    cluster, and from then on B announces them too."""
    from sglang.srt.managers.cache_controller import PrefetchOperation

    from cxltier.sglang import hicache

    hicache.install_token_records()
    py = ch.require_mooncake()
    master = ch.Master(py, str(tmp_path)).start()
    a, b = (ch.Node(py, built["cli"], built["lib"], str(tmp_path), n) for n in ("a", "b"))
    ctls = []
    try:
        a.start_uplink(master)
        b.start_uplink(master, args=["--events", f"tcp://127.0.0.1:{ch.free_port()}", "--events-interval", "0.1"])
        for n in (a, b):
            dev, host = host_pool(False, "layer_first")
            ctls.append((controller(sglang_process_groups, dev, host, n.devices, True, index=MODEL, kv_events=1), host))
        (ctl_a, host_a), (ctl_b, _) = ctls
        tokens = tokens_of(5, seed=4)
        fill(host_a, 1, 5)
        ctl_a.write_storage(indices(1, 5), tokens, hashes_of(tokens), [])
        settle(lambda: a.metrics()["put_pages"] >= 10, "node A's write-behind (K and V of 5 pages)")
        assert b.metrics().get("events_stored", 0) == 0
        op = PrefetchOperation("r", tokens, last_hash=None, prefix_keys=[])
        _, hit_tokens = ctl_b._storage_hit_query(op)
        assert hit_tokens == 5 * PAGE and b.metrics()["fetched_pages"] == 10
        settle(lambda: b.metrics().get("events_stored", 0) == 5, "node B announcing the pages it fetched")
    finally:
        for ctl, _ in ctls:
            ctl.storage_backend.close()
        a.destroy()
        b.destroy()
        master.kill()


def test_pages_the_linker_fetched_from_the_cluster_are_announced(built, tmp_path):
    """Node B's unified-cache linker never offloads these pages: its lookup
    (SGLang's UnifiedCacheLinkerWrapper.match, wrapped as the plugin wraps
    it) finds them through B's uplink in the cluster, and from then on B
    announces them too. (Only the HiCache prefetch path recorded them.)"""
    from cxltier.sglang import linker
    from linker_stack import Stack, publish_server_args

    linker.install_token_records()
    py = ch.require_mooncake()
    master = ch.Master(py, str(tmp_path)).start()
    a, b = (ch.Node(py, built["cli"], built["lib"], str(tmp_path), n) for n in ("a", "b"))
    try:
        a.start_uplink(master)
        b.start_uplink(master, args=["--events", f"tcp://127.0.0.1:{ch.free_port()}", "--events-interval", "0.1"])
        tokens = list(range(900, 900 + 5 * 4))
        with Stack(publish_server_args(a.devices, 4, kv_events=1), "mla", 4) as s:
            s.store(tokens, seed=3)
        settle(lambda: a.metrics().get("put_pages", 0) >= 5, "node A's write-behind")
        assert b.metrics().get("events_stored", 0) == 0
        with Stack(publish_server_args(b.devices, 4, kv_events=1), "mla", 4) as s:
            hit, _, _, failed = s.load(tokens)
        assert hit == len(tokens) and not failed and b.metrics()["fetched_pages"] >= 5, (hit, failed)
        settle(lambda: b.metrics().get("events_stored", 0) == 5, "node B announcing the pages it fetched")
    finally:
        a.destroy()
        b.destroy()
        master.kill()


def test_events_cli_says_when_it_hears_nothing(monkeypatch, capsys):
    """At an endpoint where no uplink publishes, ZMQ connects and waits
    without a word: the command says what to check, once."""
    import socket

    from cxltier.cluster import events_cli

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(events_cli, "SILENT_HINT_S", 0.2)
    assert events_cli.main([f"tcp://127.0.0.1:{port}", "--stored", "1", "--timeout", "1.5"]) == 1
    err = capsys.readouterr().err
    assert err.count("nothing from tcp://127.0.0.1") == 1 and "--events endpoint" in err
