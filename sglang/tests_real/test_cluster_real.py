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
    py = ch.mooncake_python()
    if py is None:
        if os.environ.get("CXLTIER_REQUIRE_MOONCAKE") == "1":
            pytest.fail("CXLTIER_MOONCAKE_PYTHON does not name a Python with mooncake.store")
        pytest.skip("Mooncake is not installed (CXLTIER_MOONCAKE_PYTHON); .ci/run installs it")
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
