"""What the Python benchmarks share: libcxltier and the cxltier CLI, built
from this checkout unless CXLTIER_LIB and CXLTIER_CLI name them."""

import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(tmp):
    """Paths of libcxltier and the CLI (built into tmp when not given);
    sets CXLTIER_LIB for the cxltier package."""
    lib, cli = os.environ.get("CXLTIER_LIB"), os.environ.get("CXLTIER_CLI")
    if not lib:
        lib = os.path.join(tmp, "libcxltier.so")
        subprocess.check_call(["go", "build", "-buildmode=c-shared", "-o", lib, "./cmd/libcxltier"], cwd=REPO)
        os.environ["CXLTIER_LIB"] = lib
    if not cli:
        cli = os.path.join(tmp, "cxltier")
        subprocess.check_call(["go", "build", "-o", cli, "./cmd/cxltier"], cwd=REPO)
    return lib, cli
