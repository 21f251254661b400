"""Real cluster parts for tests and benchmarks on one machine: a
mooncake_master on loopback, node tiers in /dev/shm, and each node's uplink
(python -m cxltier.cluster.uplink) as its own process, run by the Python that has
Mooncake installed ($CXLTIER_MOONCAKE_PYTHON; .ci/run makes that
virtualenv). Nothing here stands in for Mooncake or the uplink."""

import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def mooncake_python():
    """The Python with mooncake.store importable, or None."""
    py = os.environ.get("CXLTIER_MOONCAKE_PYTHON")
    if not py or not os.path.exists(py):
        return None
    ok = subprocess.run([py, "-c", "import mooncake.store"], capture_output=True).returncode == 0
    return py if ok else None


def require_mooncake():
    """The Mooncake Python for a test: a skip without one, or a failure
    where CXLTIER_REQUIRE_MOONCAKE=1 (CI) says it must be there."""
    import pytest

    py = mooncake_python()
    if py is None:
        if os.environ.get("CXLTIER_REQUIRE_MOONCAKE") == "1":
            pytest.fail("CXLTIER_MOONCAKE_PYTHON does not name a Python with mooncake.store")
        pytest.skip("Mooncake is not installed (CXLTIER_MOONCAKE_PYTHON); .ci/run installs it")
    return py


def master_binary(py):
    """mooncake_master beside the Mooncake Python."""
    path = os.path.join(os.path.dirname(py), "mooncake_master")
    return path if os.path.exists(path) else shutil.which("mooncake_master")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise TimeoutError(f"{what}: not within {timeout} s")


class Master:
    """A mooncake_master on 127.0.0.1 (P2PHANDSHAKE metadata: no HTTP
    metadata server, which would bind every address)."""

    def __init__(self, py, workdir, client_ttl=None):
        self.binary = master_binary(py)
        self.port, self.metrics_port = free_port(), free_port()
        self.log = os.path.join(workdir, f"master-{self.port}.log")
        self.client_ttl = client_ttl
        self.proc = None

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        args = [self.binary, "--rpc_address=127.0.0.1", f"--rpc_port={self.port}", f"--metrics_port={self.metrics_port}"]
        if self.client_ttl:
            args.append(f"--client_ttl={self.client_ttl}")
        self.proc = subprocess.Popen(args, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        wait_for(lambda: _connects(self.port), 10, f"mooncake_master on {self.port}")
        return self

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _connects(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def http_ok(url):
    """Whether url answers 200 within half a second."""
    try:
        with urllib.request.urlopen(url, timeout=0.5) as r:
            return r.status == 200
    except OSError:
        return False


class Node:
    """One node: its tier in /dev/shm (formatted by the CLI) and its uplink."""

    def __init__(self, py, cli, lib, workdir, name, size="64MiB"):
        self.py, self.cli, self.lib, self.workdir = py, cli, lib, workdir
        self.shm = f"cxltier-node-{name}-{uuid.uuid4().hex[:8]}"
        self.devices = f"shm:{self.shm}"
        self.name = name
        subprocess.check_call([cli, "format", "-device", self.devices, "-size", size, "-chunk", "256KiB"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.proc = None
        self.metrics_port = None
        self.log = os.path.join(workdir, f"uplink-{name}.log")

    def start_uplink(self, master=None, segment="32MiB", env=None, args=()):
        self.metrics_port = free_port()
        cmd = [self.py, "-m", "cxltier.cluster.uplink", "--tier", self.devices, "--hostname", "127.0.0.1",
               "--segment", segment, "--metrics", f"127.0.0.1:{self.metrics_port}", *args]
        if master is not None:
            cmd += ["--master", master.address]
        e = dict(os.environ, CXLTIER_LIB=self.lib, PYTHONPATH=os.path.join(REPO, "python"))
        e.update(env or {})
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, env=e)
        wait_for(lambda: self.proc.poll() is not None or self._healthy(), 30, f"uplink of {self.name}")
        if self.proc.poll() is not None:
            raise RuntimeError(f"uplink of {self.name} exited {self.proc.returncode}: {self.tail()}")
        return self

    def _healthy(self):
        return http_ok(f"http://127.0.0.1:{self.metrics_port}/healthz")

    def metrics(self):
        """The uplink's counters and gauges by name (without the _total)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line.startswith("#") or "{" in line:
                continue
            name, value = line.rsplit(" ", 1)
            out[name.removeprefix("cxltier_uplink_").removesuffix("_total")] = float(value)
        return out

    def tail(self, n=20):
        try:
            with open(self.log, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def kill_uplink(self, sig=signal.SIGKILL):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)

    def stop_uplink(self):
        self.kill_uplink(signal.SIGTERM)

    def destroy(self):
        self.kill_uplink()
        # destroy takes the sockets a killed uplink left beside the tier too.
        subprocess.run([self.cli, "destroy", "-force", self.devices], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        try:
            os.remove(f"/dev/shm/{self.shm}")
        except FileNotFoundError:
            pass


def dynamo_python():
    """The Python with Dynamo's standalone KV indexer (dynamo.indexer), or None."""
    py = os.environ.get("CXLTIER_DYNAMO_PYTHON")
    if not py or not os.path.exists(py):
        return None
    ok = subprocess.run([py, "-c", "import dynamo.indexer"], capture_output=True).returncode == 0
    return py if ok else None


def require_dynamo():
    """The Dynamo Python for a test: a skip without one, or a failure where
    CXLTIER_REQUIRE_DYNAMO=1 (CI) says it must be there."""
    import pytest

    py = dynamo_python()
    if py is None:
        if os.environ.get("CXLTIER_REQUIRE_DYNAMO") == "1":
            pytest.fail("CXLTIER_DYNAMO_PYTHON does not name a Python with dynamo.indexer")
        pytest.skip("Dynamo's indexer is not installed (CXLTIER_DYNAMO_PYTHON); .ci/run installs it")
    return py


class Indexer:
    """Dynamo's standalone KV indexer (python -m dynamo.indexer) on loopback:
    nodes register their KV event streams with it and it answers which
    instance holds the longest prefix of a request's tokens."""

    def __init__(self, py, workdir):
        self.py = py
        self.port = free_port()
        self.log = os.path.join(workdir, f"indexer-{self.port}.log")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([self.py, "-m", "dynamo.indexer", "--port", str(self.port), "--threads", "1"],
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT)
        wait_for(lambda: self.proc.poll() is not None or _connects(self.port), 30, f"dynamo.indexer on {self.port}")
        if self.proc.poll() is not None:
            raise RuntimeError(f"dynamo.indexer exited {self.proc.returncode}")
        return self

    def post(self, path, body):
        import json

        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.loads(r.read() or b"{}")

    def register(self, instance_id, endpoint, replay, model, block_size):
        return self.post("/register", {"instance_id": instance_id, "endpoint": endpoint, "replay_endpoint": replay,
                                       "model_name": model, "block_size": block_size})

    def matched(self, tokens, model):
        """{instance id: tokens of the longest prefix it holds}."""
        got = self.post("/query", {"token_ids": list(tokens), "model_name": model})
        return {int(i): int(v["longest_matched"]) for i, v in got.get("instances", {}).items()}

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
