import contextlib
import os
import shutil
import subprocess
import sys
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))


def say(config, line):
    """A line on pytest's terminal now, between its dots: what a long step
    is doing before it starts."""
    reporter = config.pluginmanager.getplugin("terminalreporter")
    capture = config.pluginmanager.getplugin("capturemanager")
    if reporter is None:
        return
    # Inside a test's setup pytest captures the terminal: the line would
    # show only if the test failed.
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        if getattr(reporter._tw, "width_of_current_line", 0):  # after a run of dots: a line of its own
            reporter.write("\n")
        reporter.write_line(line)


def announce_suite(session, here, what):
    """Before a long suite runs: how many of its tests, against what, and
    about how long they take (pytest's dots alone say nothing for minutes)."""
    mine = [i for i in session.items if str(i.path).startswith(here + os.sep)]
    if mine and session.config.option.verbose <= 0:
        say(session.config, f"{os.path.basename(here)}/: {len(mine)} tests against {what}; -v names each test as it runs")


@pytest.fixture(scope="session")
def built(tmp_path_factory, pytestconfig):
    """The real library and CLI, built from this checkout (or $CXLTIER_LIB
    and $CXLTIER_CLI when given)."""
    out = tmp_path_factory.mktemp("bin")
    lib = os.environ.get("CXLTIER_LIB")
    if not (lib and os.environ.get("CXLTIER_CLI")):
        say(pytestconfig, "cxltier: building libcxltier.so and the cxltier CLI from this checkout with Go (1-2 min when Go's cache is cold)")
    if not lib:
        lib = str(out / "libcxltier.so")
        subprocess.check_call(["go", "build", "-buildmode=c-shared", "-o", lib, "./cmd/libcxltier"], cwd=REPO)
        os.environ["CXLTIER_LIB"] = lib
    cli = os.environ.get("CXLTIER_CLI")
    if not cli:
        cli = str(out / "cxltier")
        subprocess.check_call(["go", "build", "-o", cli, "./cmd/cxltier"], cwd=REPO)
    return {"lib": lib, "cli": cli}


@contextlib.contextmanager
def tier_device(cli, size="64MiB", prefix="cxltier-py"):
    """A fresh tier in /dev/shm of size, formatted by the CLI, removed after."""
    name = f"{prefix}-{uuid.uuid4().hex[:12]}"
    subprocess.check_call([cli, "format", "-device", f"shm:{name}", "-size", size, "-chunk", "256KiB"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield f"shm:{name}"
    finally:
        # destroy takes the sockets a killed uplink left beside the tier too.
        subprocess.run([cli, "destroy", "-force", f"shm:{name}"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        try:
            os.remove(f"/dev/shm/{name}")
        except FileNotFoundError:
            pass


@pytest.fixture
def device(built):
    """A fresh 64 MiB tier in /dev/shm, formatted by the CLI."""
    with tier_device(built["cli"]) as dev:
        yield dev


@pytest.fixture
def cli(built):
    return built["cli"]


def pytest_report_header(config):
    return f"go: {shutil.which('go')}"
