"""What the Python benchmarks share: libcxltier and the cxltier CLI, built
from this checkout unless CXLTIER_LIB and CXLTIER_CLI name them, and fresh
tiers in /dev/shm."""

import os
import subprocess
import sys
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(tmp):
    """Paths of libcxltier and the CLI (built into tmp when not given);
    sets CXLTIER_LIB for the cxltier package."""
    lib, cli = os.environ.get("CXLTIER_LIB"), os.environ.get("CXLTIER_CLI")
    if not (lib and cli):
        print("building libcxltier.so and the cxltier CLI from this checkout with Go (1-2 min when Go's cache is cold)",
              file=sys.stderr, flush=True)
    if not lib:
        lib = os.path.join(tmp, "libcxltier.so")
        subprocess.check_call(["go", "build", "-buildmode=c-shared", "-o", lib, "./cmd/libcxltier"], cwd=REPO)
        os.environ["CXLTIER_LIB"] = lib
    if not cli:
        cli = os.path.join(tmp, "cxltier")
        subprocess.check_call(["go", "build", "-o", cli, "./cmd/cxltier"], cwd=REPO)
    return lib, cli


def cpu_model():
    """The first CPU's model name, from /proc/cpuinfo ("" where it cannot
    tell): what a result says of the machine it ran on."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        return ""


class ShmTier:
    """A fresh /dev/shm tier of size (the CLI's form: "256MiB"), formatted by
    the CLI with 1 MiB chunks, removed on exit; spec is its device."""

    def __init__(self, cli, size, what="bench"):
        self.name = f"cxltier-{what}-{uuid.uuid4().hex[:10]}"
        self.spec = f"shm:{self.name}"
        subprocess.check_call([cli, "format", "-device", self.spec, "-size", size, "-chunk", "1MiB"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        try:
            os.remove(f"/dev/shm/{self.name}")
        except FileNotFoundError:
            pass
