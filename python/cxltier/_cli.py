"""The `cxltier` command that `pip install` puts on PATH: it runs the Go CLI
built into the package (cxltier/bin/cxltier), or $CXLTIER_CLI when set."""

import os
import sys


def binary():
    """Path of the Go CLI this package runs."""
    env = os.environ.get("CXLTIER_CLI")
    if env:
        return env
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "cxltier")


def main():
    path = binary()
    if not os.access(path, os.X_OK):
        sys.stderr.write(
            f"cxltier: no CLI at {path}: reinstall the package from a cxltier checkout with Go "
            "(pip install ./python), or set CXLTIER_CLI to a cxltier binary (go build ./cmd/cxltier)\n")
        sys.exit(127)
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
