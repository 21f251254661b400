"""The real-vLLM suite: cxltier's KV connector in vLLM's own engine on CPU
(the version pinned in requirements-vllm.txt). .ci/run installs it into a
cached virtualenv and runs this folder with CXLTIER_REQUIRE_VLLM=1, so a
missing vLLM fails the run instead of skipping it. Each engine is a real
vLLM process tree (main, EngineCore, Worker); starting one takes about a
minute on 2 cores (vLLM's CPU platform spawns each process anew, so each
imports vLLM), so the suite starts few, reads several results from each,
and starts those of independent chains side by side (vllm_suite.in_parallel)."""

import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.dirname(HERE)
sys.path.insert(0, PACKAGE_DIR)

_spec = importlib.util.spec_from_file_location("cxltier_test_fixtures", os.path.join(PACKAGE_DIR, "tests", "conftest.py"))
_fixtures = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_fixtures)
built, cli, device = _fixtures.built, _fixtures.cli, _fixtures.device

try:
    import vllm  # noqa: F401
except ImportError as e:
    if os.environ.get("CXLTIER_REQUIRE_VLLM") == "1":
        raise
    # Not an error: python -m pytest python runs every suite this
    # environment can, and says which it left out and why.
    _MISSING = f"vLLM is not installed ({e}); .ci/run installs it"
    collect_ignore_glob = ["test_*.py"]

    def pytest_terminal_summary(terminalreporter):
        terminalreporter.write_line(f"{os.path.basename(HERE)}/ not run: {_MISSING}")
else:

    def pytest_collection_finish(session):
        _fixtures.announce_suite(session, HERE, f"vLLM {vllm.__version__}'s own engine and scheduler, an engine a process tree that takes about a minute to start, two at a time (the whole suite: about 7 min on 2 cores)")

sys.path.insert(0, HERE)  # vllm_suite, vllm_engine, scheduler_harness
