"""The cluster tier under SGLang's real HiCacheController: node A's server
backs pages up into its tier, node A's uplink writes them behind to a real
mooncake_master, and node B's server, configured exactly as A's (the same
extra_config: no cluster setting anywhere in SGLang), finds them with
batch_exists and loads them byte-identical. Uplinks run in the Mooncake
virtualenv ($CXLTIER_MOONCAKE_PYTHON), their own processes."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import cluster_harness as ch  # noqa: E402
from test_hicache_real import PAGE, Op, controller, fill, host_pool, indices, page_hashes  # noqa: E402


@pytest.fixture
def two_nodes(built, tmp_path):
    py = ch.require_mooncake()
    master = ch.Master(py, str(tmp_path)).start()
    nodes = [ch.Node(py, built["cli"], built["lib"], str(tmp_path), n) for n in ("a", "b")]
    try:
        for n in nodes:
            n.start_uplink(master)
        yield nodes
    finally:
        for n in nodes:
            n.destroy()
        master.kill()


@pytest.mark.parametrize("mla", [False, True], ids=["mha", "mla"])
def test_node_b_loads_node_a_pages(two_nodes, sglang_process_groups, mla):
    a, b = two_nodes
    dev_a, host_a = host_pool(mla, "layer_first")
    dev_b, host_b = host_pool(mla, "page_first_direct")  # another layout, the same byte order: shared pages
    ctl_a = controller(sglang_process_groups, dev_a, host_a, a.devices, True)
    ctl_b = controller(sglang_process_groups, dev_b, host_b, b.devices, True)
    try:
        n = 5
        hashes = page_hashes(n)
        want = fill(host_a, 1, n)
        assert ctl_a.page_set_func(hashes, indices(1, n))
        parts = n * (1 if mla else 2)
        ch.wait_for(lambda: a.metrics()["put_pages"] >= parts, 10, "node A's write-behind")
        assert ctl_b.storage_backend.batch_exists(hashes) == n
        assert b.metrics()["fetched_pages"] == parts
        fill(host_b, 10, n)  # other bytes where the pages will land
        assert ctl_b.page_get_func(Op(), hashes, indices(10, n)) == n
        for i in range(n):
            got = host_b.get_data_page((10 + i) * PAGE, flat=True)
            assert torch.equal(got.view(torch.int16), want[i].view(torch.int16)), f"page {i}"
        # A page neither node holds is a plain miss, counted by B's uplink.
        assert ctl_b.storage_backend.batch_exists(page_hashes(2)) == 0
    finally:
        ctl_a.storage_backend.close()
        ctl_b.storage_backend.close()


RANK = r"""
import hashlib, json, os, sys, time
sys.path.insert(0, sys.argv[1])
import torch, torch.distributed as dist
from sglang.srt.runtime_context import get_parallel
from test_hicache_real import PAGE, Op, controller, host_pool, indices
devices, go, rank, ranks, hashes = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), json.loads(sys.argv[6])
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", sys.argv[7]
dist.init_process_group("gloo", rank=0, world_size=1)
with get_parallel().override(attn_dcp_size=1, attn_dcp_rank=0, tp_rank=rank, tp_size=ranks, pp_rank=0, pp_size=1):
    dev, host = host_pool(True, "layer_first")
    ctl = controller(dist.group.WORLD, dev, host, devices, True)
    open(go + f".ready{rank}", "w").close()
    while not os.path.exists(go):
        time.sleep(0.005)
    hit = ctl.storage_backend.batch_exists(hashes)
    got = ctl.page_get_func(Op(), hashes[:hit], indices(10, hit)) if hit else 0
    digests = [hashlib.sha256(host.get_data_page((10 + i) * PAGE, flat=True).view(torch.int16).numpy().tobytes()).hexdigest()
               for i in range(got)]
    print(json.dumps({"hit": hit, "got": got, "digests": digests}), flush=True)
    ctl.storage_backend.close()
"""


def test_ranks_on_node_b_fetch_each_page_once(built, tmp_path, sglang_process_groups):
    """Four TP ranks of an MLA server on node B, each its own process with
    SGLang's HiCacheController, miss the same prefix at once: node B's uplink
    fetches each page once (it holds the fetch before publishing, so the
    other ranks must join it), and every rank loads every page."""
    import hashlib
    import json
    import subprocess

    py = ch.require_mooncake()
    master = ch.Master(py, str(tmp_path)).start()
    a = ch.Node(py, built["cli"], built["lib"], str(tmp_path), "a")
    b = ch.Node(py, built["cli"], built["lib"], str(tmp_path), "b")
    try:
        a.start_uplink(master)
        b.start_uplink(master, segment="0", env={"CXLTIER_UPLINK_TEST_PAUSE_BEFORE_PUBLISH": "0.5"})
        dev, host = host_pool(True, "layer_first")
        ctl = controller(sglang_process_groups, dev, host, a.devices, True)
        n = 4
        hashes = page_hashes(n)
        want = fill(host, 1, n)
        assert ctl.page_set_func(hashes, indices(1, n))
        ctl.storage_backend.close()
        ch.wait_for(lambda: a.metrics()["put_pages"] >= n, 10, "node A's write-behind")
        go = tmp_path / "go"
        here = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, CXLTIER_LIB=built["lib"])
        procs = [subprocess.Popen([sys.executable, "-W", "ignore", "-c", RANK, here, b.devices, str(go), str(r), "4",
                                   json.dumps(hashes), str(ch.free_port())], stdout=subprocess.PIPE, text=True, env=env)
                 for r in range(4)]
        ch.wait_for(lambda: all(os.path.exists(f"{go}.ready{r}") or procs[r].poll() is not None for r in range(4)), 180,
                    "the ranks' controllers")
        go.write_text("")  # all four miss the prefix at once
        outs = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
        digests = [hashlib.sha256(w.view(torch.int16).numpy().tobytes()).hexdigest() for w in want]
        for o in outs:
            assert o["hit"] == n and o["got"] == n and o["digests"] == digests
        mb = b.metrics()
        assert mb["fetched_pages"] == n and mb["joined_pages"] > 0
    finally:
        a.destroy()
        b.destroy()
        master.kill()
