"""The real-SGLang suite: cxltier's adapters against SGLang itself (the
version pinned in requirements-sglang.txt), on CPU. .ci/run installs it into
a cached virtualenv and runs this folder with CXLTIER_REQUIRE_SGLANG=1, so a
missing SGLang fails the run instead of skipping it.

Where building a real SGLang object needs what a CPU machine lacks, a test
patches the least it can and says so: the parallel context and a
single-process gloo group stand for a launched server's process groups, and
cudaHostRegister (no CUDA) is recorded instead of called."""

import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

_spec = importlib.util.spec_from_file_location("cxltier_test_fixtures", os.path.join(os.path.dirname(HERE), "tests", "conftest.py"))
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
built, device, cli = _fixtures.built, _fixtures.device, _fixtures.cli

try:
    import sglang  # noqa: F401
    import torch  # noqa: F401
except ImportError as e:
    if os.environ.get("CXLTIER_REQUIRE_SGLANG") == "1":
        raise
    # Not an error: python -m pytest python runs every suite this
    # environment can, and says which it left out and why.
    _MISSING = f"SGLang is not installed ({e}); .ci/run installs it"
    collect_ignore_glob = ["test_*.py"]

    def pytest_terminal_summary(terminalreporter):
        terminalreporter.write_line(f"{os.path.basename(HERE)}/ not run: {_MISSING}")
else:

    def pytest_collection_finish(session):
        _fixtures.announce_suite(session, HERE, f"SGLang {sglang.__version__} itself, many starting processes of their own (the whole suite: about 5 min on 2 cores)")


@pytest.fixture(scope="session")
def sglang_process_groups():
    """A one-process gloo group and the parallel widths a launched server
    would publish: what HiCacheController needs to attach storage on CPU."""
    import torch.distributed as dist
    from sglang.srt.runtime_context import get_parallel

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        dist.init_process_group("gloo", rank=0, world_size=1)
    with get_parallel().override(attn_dcp_size=1, attn_dcp_rank=0, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1):
        yield dist.group.WORLD


@pytest.fixture
def no_cuda_register(monkeypatch):
    """SGLang pins host pools with cudaHostRegister, which needs CUDA: the
    calls are recorded instead (the one patch the host-pool tests make)."""
    from sglang.srt.mem_cache.pool_host import common

    calls = []
    monkeypatch.setattr(common, "_cuda_host_register", lambda buf, *a, **k: calls.append((buf.data_ptr(), buf.nbytes)))
    return calls
