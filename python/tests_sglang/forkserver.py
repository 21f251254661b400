"""A fork server for the SGLang workers of the tests and benches
(pd_worker.py serve, bench/pd/worker.py serve). Importing torch and SGLang
takes a process about 17 s of CPU, most of a test's or a small bench
run's time when each starts a few workers; a server imports them once
(nothing that starts a thread, or loads libcxltier, whose Go runtime would
not survive a fork) and forks each worker from there. A worker is still a
process of its own: its own pid, leases and tier mappings, killed and
reaped as a started one is. The server writes each worker's exit status
(a negative signal number when killed, as subprocess says it) to the file
its request named.
"""

import os
import signal
import sys
import threading
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
