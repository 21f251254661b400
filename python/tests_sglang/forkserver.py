"""A fork server for the SGLang workers of the tests and benches
(pd_worker.py serve, engram_host_worker.py serve, bench/pd/worker.py
serve). Importing torch and SGLang
takes a process about 17 s of CPU, most of a test's or a small bench
run's time when each starts a few workers; a server imports them once
(nothing that starts a thread, or loads libcxltier, whose Go runtime would
not survive a fork) and forks each worker from there. A worker is still a
process of its own: its own pid, leases and tier mappings, killed and
reaped as a started one is. The server writes each worker's exit status
(a negative signal number when killed, as subprocess says it) to the file
its request named.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback


class Server:
    """Forks workers; made after the imports it shares."""

    def __init__(self, name):
        if threading.active_count() != 1:
            raise SystemExit(f"{name}: {threading.active_count()} threads after the imports: a fork would lose them")
        self.children = {}  # pid: the file its exit status goes to
        signal.signal(signal.SIGCHLD, self.reap)

    def reap(self, *_):
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            rc = self.children.pop(pid, None)
            if rc is not None:
                with open(rc + ".tmp", "w") as f:
                    f.write(str(os.waitstatus_to_exitcode(status)))
                os.replace(rc + ".tmp", rc)

    def fork(self, rc, work):
        """Forks a worker that runs work() and exits with 0, a SystemExit's
        code, or 1 on an exception (its traceback on its stderr); returns
        its pid."""
        sys.stdout.flush()
        sys.stderr.flush()
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])  # its pid is known before it is reaped
        pid = os.fork()
        if pid == 0:
            _run(work)
        self.children[pid] = rc
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        self.reap()
        return pid

    def close(self):
        """Kills the workers still running: nothing outlives the server."""
        for pid in list(self.children):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def serve_lines(name, main):
    """The server's loop for the tests' workers: for each line on stdin
    ({"argv", "env", "out", "err", "rc"}) it forks a child that takes env
    as its whole environment, writes its stdout and stderr to the files out
    and err, and runs main(argv) as the script started with those arguments
    would; it answers {"pid"} and, when the child ends, writes its exit
    status to rc. Call it after the imports the workers share."""
    server = Server(name)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = server.fork(req["rc"], lambda: _child(req, main))
        print(json.dumps({"pid": pid}), flush=True)
    server.close()  # the tests are over


def _child(req, main):
    fds = [os.open(os.devnull, os.O_RDONLY)]
    fds += [os.open(req[k], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for k in ("out", "err")]
    redirect(req["env"], fds)
    main(req["argv"])


class Client:
    """A test's side of serve_lines: `python -W ignore SCRIPT serve` started
    with env, a forked worker per start(), asked as a subprocess.Popen is."""

    def __init__(self, script, env, folder):
        self.folder, self.n = folder, 0
        self.proc = subprocess.Popen([sys.executable, "-W", "ignore", script, "serve"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        assert line.startswith('{"ready"'), f"the fork server {script} did not start (exit {self.proc.wait()})"

    def start(self, argv, env, tag="worker"):
        """Forks a worker that runs as `SCRIPT *argv` would, with env as
        its whole environment."""
        self.n += 1
        base = os.path.join(self.folder, f"{self.n}-{tag}")
        req = {"argv": argv, "env": env, "out": base + ".out", "err": base + ".err", "rc": base + ".rc"}
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return Worker(json.loads(self.proc.stdout.readline())["pid"], req, tag)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


class Forked:
    """A forked worker's pid and exit status, the latter from the file its
    server writes when it ends: poll, wait, send_signal and kill, as a
    subprocess.Popen has them."""

    def __init__(self, pid, rc, name):
        self.pid, self.rc, self.name, self.returncode = pid, rc, name, None

    def poll(self):
        if self.returncode is None and os.path.exists(self.rc):
            with open(self.rc) as f:
                self.returncode = int(f.read())
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.name, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig):
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass  # ended since: the server writes its status

    def kill(self):
        self.send_signal(signal.SIGKILL)


class Worker(Forked):
    """A worker of serve_lines: a Forked whose stdout and stderr (files it
    writes) are read as they grow, or whole by communicate."""

    def __init__(self, pid, req, tag):
        super().__init__(pid, req["rc"], tag)
        self.req = req
        self.stdout, self.stderr = _Tail(req["out"]), _Tail(req["err"])

    def communicate(self, timeout=None):
        self.wait(timeout)
        return tuple(open(self.req[k]).read() for k in ("out", "err"))


class _Tail:
    """A worker's output file, read a line at a time as it is written."""

    def __init__(self, path):
        self.path, self.at = path, 0

    def readline(self):
        time.sleep(0.01)
        try:
            with open(self.path) as f:
                f.seek(self.at)
                line = f.readline()
        except FileNotFoundError:
            return ""
        if not line.endswith("\n"):
            return ""
        self.at += len(line.encode())
        return line

    def read(self):
        try:
            with open(self.path) as f:
                return f.read()
        except FileNotFoundError:
            return ""


def redirect(env, fds):
    """In a worker: env as its whole environment, and fds (stdin, stdout,
    stderr) as its standard streams, with new stream objects (the server's
    may hold bytes it read ahead)."""
    os.environ.clear()
    os.environ.update(env)
    for std, f in enumerate(fds):
        os.dup2(f, std)
        os.close(f)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)


def _run(work):
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        work()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
