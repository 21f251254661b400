import contextlib
import os
import shutil
import subprocess
import sys
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The real library and CLI, built from this checkout (or $CXLTIER_LIB
    and $CXLTIER_CLI when given)."""
    out = tmp_path_factory.mktemp("bin")
    lib = os.environ.get("CXLTIER_LIB")
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
