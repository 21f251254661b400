"""Builds libcxltier.so into the package when Go and the cxltier sources are
at hand (pip install ./python from a checkout); otherwise installs the pure
Python package, which then finds the library through CXLTIER_LIB."""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        out = os.path.abspath(os.path.join(self.build_lib, "cxltier", "libcxltier.so"))
        go = shutil.which("go")
        source = os.path.join(REPO, "cmd", "libcxltier")
        if os.environ.get("CXLTIER_LIB"):
            print(f"cxltier: using CXLTIER_LIB={os.environ['CXLTIER_LIB']} at run time, not building the library")
            return
        if not go or not os.path.isdir(source):
            raise SystemExit(
                "cxltier: cannot build libcxltier.so (need the Go toolchain and the cxltier checkout "
                f"around {HERE}); build it with `go build -buildmode=c-shared -o libcxltier.so ./cmd/libcxltier` "
                "and set CXLTIER_LIB to its path"
            )
        os.makedirs(os.path.dirname(out), exist_ok=True)
        subprocess.check_call([go, "build", "-buildmode=c-shared", "-o", out, "./cmd/libcxltier"], cwd=REPO)
        header = out[: -len(".so")] + ".h"
        if os.path.exists(header):
            os.remove(header)
        # The CLI the README calls (cxltier engram load, prefix create ...),
        # run by the `cxltier` script pip puts on PATH.
        cli = os.path.join(os.path.dirname(out), "bin", "cxltier")
        os.makedirs(os.path.dirname(cli), exist_ok=True)
        subprocess.check_call([go, "build", "-o", cli, "./cmd/cxltier"], cwd=REPO)


setup(cmdclass={"build_py": BuildWithLibrary})
