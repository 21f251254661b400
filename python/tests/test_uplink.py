"""The cluster tier, for real: a mooncake_master on loopback, node tiers in
/dev/shm, each node's uplink (python -m cxltier.cluster.uplink) in its own process,
and the node's clients (this process, or several) through the library.
Skipped without Mooncake, unless CXLTIER_REQUIRE_MOONCAKE=1 (CI) makes that
a failure."""

import os
import re
import shutil
import signal
import struct
import subprocess
import threading
import sys
import tempfile
import textwrap
import time

import pytest

import cxltier
from cxltier.cluster import uplink as up

import cluster_harness as ch


# The wire format and rules, which need no cluster.


def test_parse_request_refuses_damage():
    """The parser's refusals. That it reads what Go writes, and Go what it
    writes, is cluster/wire_test.go's TestWireAgreesWithThePython, which
    runs this module on messages Go built."""
    keys = [bytes([i]) * 32 for i in range(3)]
    msg = up._REQ_HEADER.pack(b"CXU1", up.OP_STORED, 0, 1, 3) + b"m" + b"".join(keys)
    assert up.parse_request(msg) == (up.OP_STORED, "m", keys)
    for bad in (msg[:-1], msg + b"x", b"XXXX" + msg[4:], msg[:4] + bytes([9]) + msg[5:], b""):
        with pytest.raises(ValueError):
            up.parse_request(bad)


def test_admission_rules():
    assert up._admission("all")("m", b"k") and not up._admission("none")("m", b"k")
    rule = up._admission("index:a,b")
    assert rule("a", b"k") and not rule("c", b"k")
    for bad in ("some", "index:", ""):
        with pytest.raises(ValueError):
            up._admission(bad)


def test_keys_file(tmp_path):
    f = tmp_path / "keys"
    f.write_text("# tenants\nacme = k1\n\nbeta=k2\n")
    f.chmod(0o600)
    assert up._keys_file(str(f)) == {"acme": "k1", "beta": "k2"}
    f.chmod(0o644)
    with pytest.raises(up.UplinkError, match="chmod 600"):
        up._keys_file(str(f))
    f.chmod(0o600)
    f.write_text("acme\n")
    with pytest.raises(up.UplinkError, match="INDEX=KEY"):
        up._keys_file(str(f))


SHARED_GID = 54321  # no account's: a child is made a member by its credentials alone


def _enterable_dir():
    """A directory whose every ancestor other users may enter, so that the
    kernel, not the path to it, decides whether they reach a socket there:
    $TMPDIR when it is so (pytest's tmp_path and a suite's private TMPDIR,
    made 0700, are not), else /tmp or /dev/shm."""
    def enterable(d):
        d = os.path.abspath(d)
        while True:
            if not os.stat(d).st_mode & 0o001:
                return False
            if d == os.path.dirname(d):
                return True
            d = os.path.dirname(d)
    for d in (tempfile.gettempdir(), "/tmp", "/dev/shm"):
        if os.path.isdir(d) and enterable(d):
            return d
    pytest.skip("no temporary directory that other users may enter")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
@pytest.mark.parametrize("named,peer_gid,trusted", [
    (True, SHARED_GID, True),     # a non-root server of the shared group
    (False, SHARED_GID, False),   # no group named: only root and this user
    (True, 65534, False),         # the group named, the peer's another
])
def test_the_shared_group_reaches_the_uplink(monkeypatch, named, peer_gid, trusted):
    """Issue 64, defect 4: an uplink of a tier shared by a group (a non-root
    pod) makes its socket the group's, so members may connect, and trusts a
    peer of that group; where no group is named, as before, only root and
    its own user."""
    monkeypatch.setenv("CXLTIER_SHARED_GROUP", str(SHARED_GID) if named else "")
    where = tempfile.mkdtemp(prefix="cxltier-shared-", dir=_enterable_dir())
    os.chmod(where, 0o755)
    path = os.path.join(where, "uplink.sock")
    sock, lock = up._bind_socket(path)
    try:
        st = os.stat(path)
        if named:
            assert (st.st_gid, st.st_mode & 0o777) == (SHARED_GID, 0o660)
        dial = textwrap.dedent("""
            import os, socket, sys
            os.setgroups([]); os.setgid(int(sys.argv[2])); os.setuid(65534)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            try:
                s.connect(sys.argv[1])
            except PermissionError:
                print("refused", flush=True); sys.exit(0)
            print("connected", flush=True); sys.stdin.read()
        """)
        peer = subprocess.Popen([sys.executable, "-c", dial, path, str(peer_gid)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        try:
            said = peer.stdout.readline().strip()
            # the socket is the group's: its members connect, others are refused by the kernel
            assert said == ("connected" if named and peer_gid == SHARED_GID else "refused")
            if said == "connected":
                conn, _ = sock.accept()
                assert up._trusted_peer(conn) is trusted
                conn.close()
        finally:
            peer.kill()
            peer.wait()
    finally:
        up._unbind_socket(path, lock)
        sock.close()
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another group")
def test_a_key_file_may_be_the_shared_groups(tmp_path, monkeypatch):
    """A Kubernetes Secret a non-root uplink reads is root:fsGroup 0440: it
    is accepted when that group is CXLTIER_SHARED_GROUP's, never when it is
    another's or others may read it."""
    f = tmp_path / "cluster.key"
    f.write_text("k" * 32)
    os.chown(f, 0, SHARED_GID)
    f.chmod(0o440)
    monkeypatch.setenv("CXLTIER_SHARED_GROUP", "")
    with pytest.raises(up.UplinkError, match="chmod 600"):
        up._cluster_key_file(str(f))
    monkeypatch.setenv("CXLTIER_SHARED_GROUP", str(SHARED_GID))
    assert up._cluster_key_file(str(f)) == b"k" * 32
    f.chmod(0o444)
    with pytest.raises(up.UplinkError, match="readable by group or others"):
        up._cluster_key_file(str(f))
    f.chmod(0o440)
    os.chown(f, 0, SHARED_GID + 1)
    with pytest.raises(up.UplinkError, match="readable by group or others"):
        up._cluster_key_file(str(f))


def test_an_unknown_shared_group_is_named(monkeypatch):
    monkeypatch.setenv("CXLTIER_SHARED_GROUP", "no-such-group-cxltier")
    with pytest.raises(up.UplinkError, match="no-such-group-cxltier"):
        up._shared_gid()


# The cluster.


@pytest.fixture(scope="session")
def mooncake_py():
    return ch.require_mooncake()


@pytest.fixture
def cluster(built, mooncake_py, tmp_path):
    """make(master_ttl=None) -> master; node(name) -> Node; all torn down."""
    masters, nodes = [], []

    class Cluster:
        def master(self, client_ttl=None):
            m = ch.Master(mooncake_py, str(tmp_path), client_ttl).start()
            masters.append(m)
            return m

        def node(self, name, **kw):
            n = ch.Node(mooncake_py, built["cli"], built["lib"], str(tmp_path), name, **kw)
            nodes.append(n)
            return n

    yield Cluster()
    for n in nodes:
        n.destroy()
    for m in masters:
        m.kill()


PAGE = 40_000
BLOCK = 64 << 10


def pages(n, seed=0):
    keys = [cxltier.string_key(f"page-{seed}-{i}") for i in range(n)]
    payloads = [bytes((i * 7 + j + seed) % 251 for j in range(PAGE - 100 * (i % 3))) for i in range(n)]
    return keys, payloads


def index(node, name="m", key=None):
    t = cxltier.Tier(node.devices)
    return t, t.prefix(name, blocks=128, block_bytes=BLOCK, key=key)


def read_back(ix, keys):
    bufs = [bytearray(BLOCK) for _ in keys]
    n, lens = ix.get(keys, bufs)
    return [bytes(bufs[i][: lens[i]]) for i in range(n)]


def wait_metric(node, name, value, timeout=10):
    return ch.wait_for(lambda: node.metrics().get(name, 0) >= value, timeout, f"{node.name}: {name} >= {value}")


def store_on(node, ix, keys, payloads):
    """Stores the pages on node's index ix and waits for its uplink to have
    written them to the cluster."""
    assert ix.set(keys, payloads) == ["stored"] * len(keys)
    wait_metric(node, "put_pages", len(keys))


def assert_served(ix, keys, payloads):
    """Every key is a hit on ix (filled from the cluster if need be) and
    reads back its payload."""
    assert ix.exists(keys) == len(keys)
    assert read_back(ix, keys) == payloads


def test_pages_stored_on_a_are_hits_on_b(cluster):
    m = cluster.master()
    a, b = cluster.node("a").start_uplink(m), cluster.node("b").start_uplink(m)
    keys, payloads = pages(16)
    ta, ia = index(a)
    tb, ib = index(b)
    try:
        store_on(a, ia, keys, payloads)
        assert_served(ib, keys, payloads)
        assert b.metrics()["fetched_pages"] == 16
        assert ib.exists(keys) == 16 and b.metrics()["fetch_seconds_count"] == 1  # local hits now
        assert ib.stats()["uplink"]["filled"] == 16
        # Pages that fill their blocks exactly move with their trailer apart.
        tight_keys, tight = pages(6, seed=2)
        tight = [p[:4096].ljust(4096, b"t") for p in tight]
        ia_t = ta.prefix("tight", blocks=16, block_bytes=4096)
        ib_t = tb.prefix("tight", blocks=16, block_bytes=4096)
        assert ia_t.set(tight_keys, tight) == ["stored"] * 6
        wait_metric(a, "put_pages", 22)
        assert ib_t.exists(tight_keys) == 6
        bufs = [bytearray(4096) for _ in tight_keys]
        assert ib_t.get(tight_keys, bufs)[0] == 6 and [bytes(b) for b in bufs] == tight
        # A get with no exists before it fills too (a third node).
        c = cluster.node("c").start_uplink(m)
        tc, ic = index(c)
        assert read_back(ic, keys) == payloads
        tc.close()
    finally:
        ta.close()
        tb.close()


CLIENT = textwrap.dedent("""
    import os, sys, time
    import cxltier
    devices, go, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t = cxltier.Tier(devices)
    ix = t.prefix("m")
    keys = [cxltier.string_key(f"page-0-{i}") for i in range(n)]
    while not os.path.exists(go):
        time.sleep(0.005)
    print(ix.exists(keys), flush=True)
    t.close()
""")


def test_eight_processes_one_fetch_per_page(cluster, built, tmp_path):
    """Eight processes of node B miss the same pages at once: each page
    crosses the network once, and every process gets the hit (the uplink
    holds its fetch before publishing, so the others must join it)."""
    m = cluster.master()
    a = cluster.node("a").start_uplink(m)
    b = cluster.node("b").start_uplink(m, env={"CXLTIER_UPLINK_TEST_PAUSE_BEFORE_PUBLISH": "0.4"})
    keys, payloads = pages(12)
    ta, ia = index(a)
    tb, ib = index(b)  # creates B's index before the clients open it
    try:
        ia.set(keys, payloads)
        wait_metric(a, "put_pages", 12)
        go = tmp_path / "go"
        env = dict(os.environ, CXLTIER_LIB=built["lib"], PYTHONPATH=os.path.join(ch.REPO, "python"))
        procs = [subprocess.Popen([sys.executable, "-c", CLIENT, b.devices, str(go), "12"], stdout=subprocess.PIPE,
                                  text=True, env=env) for _ in range(8)]
        time.sleep(1.0)  # let them attach and wait
        go.write_text("")
        results = [int(p.communicate(timeout=30)[0].strip() or -1) for p in procs]
        assert results == [12] * 8
        mb = b.metrics()
        assert mb["fetched_pages"] == 12
        assert mb["joined_pages"] > 0
        assert read_back(ib, keys) == payloads
    finally:
        ta.close()
        tb.close()


def test_master_down_is_a_local_miss(cluster):
    m = cluster.master()
    b = cluster.node("b").start_uplink(m)
    keys, payloads = pages(6)
    local, local_pay = pages(3, seed=9)
    tb, ib = index(b)
    try:
        assert ib.set(local, local_pay) == ["stored"] * 3
        m.kill()
        for attempt in range(3):
            started = time.monotonic()
            assert ib.exists(keys) == 0  # never stored anywhere: the cluster must be asked, and is gone
            took = time.monotonic() - started
            assert took <= 1.5, f"lookup {attempt} with the master down took {took:.2f} s"
        assert ib.exists(local) == 3 and read_back(ib, local) == local_pay  # local hits keep working
        started = time.monotonic()
        assert ib.set(keys[:2], payloads[:2]) == ["stored"] * 2  # writes too: write-behind never blocks them
        assert time.monotonic() - started < 0.5
        wait_metric(b, "remote_errors", 1)
    finally:
        tb.close()


def test_stalled_master_is_a_local_miss(cluster):
    """A master that stops answering (SIGSTOP: a partition, a stalled host)
    leaves Mooncake calls hanging for minutes. The first lookup gives up at
    the link's timeout; the uplink then counts the cluster down and answers
    at once; when the master answers again, fills work again."""
    m = cluster.master()
    a, b = cluster.node("a").start_uplink(m), cluster.node("b").start_uplink(m)
    keys, payloads = pages(6)
    local, local_pay = pages(2, seed=4)
    ta, ia = index(a)
    tb, ib = index(b)
    try:
        ia.set(keys[:3], payloads[:3])
        wait_metric(a, "put_pages", 3)
        ib.set(local, local_pay)
        os.kill(m.proc.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert ib.exists(keys[:3]) == 0
            assert time.monotonic() - started <= 1.5
            ch.wait_for(lambda: b.metrics()["cluster_up"] == 0, 5, "B's uplink noticing the stall")
            for _ in range(5):
                started = time.monotonic()
                assert ib.exists(keys[3:]) == 0
                assert time.monotonic() - started <= 0.2, "a lookup waited on a cluster known to be down"
            assert ib.exists(local) == 2 and read_back(ib, local) == local_pay
        finally:
            os.kill(m.proc.pid, signal.SIGCONT)
        ch.wait_for(lambda: ib.exists(keys[:3]) == 3, 20, "fills once the master answers again")
        assert read_back(ib, keys[:3]) == payloads[:3]
    finally:
        ta.close()
        tb.close()


def test_a_dead_master_stays_down_until_a_probe_answers(cluster):
    """A master that is gone: once a call fails, /metrics says the cluster
    is down at every scrape (no timed return to up between probes), and
    every miss meanwhile answers at once instead of trying the master."""
    m = cluster.master()
    b = cluster.node("b").start_uplink(m)
    keys, _ = pages(4)
    tb, ib = index(b)
    try:
        m.proc.kill()
        m.proc.wait()
        ch.wait_for(lambda: ib.exists(keys[:1]) == 0 and b.metrics()["cluster_up"] == 0, 10,
                    "B's uplink noticing the master is gone")
        for i in range(8):
            started = time.monotonic()
            assert ib.exists(keys[1 + i % 3:]) == 0
            assert time.monotonic() - started <= 0.2, "a miss waited on a master known to be gone"
            assert b.metrics()["cluster_up"] == 0, f"scrape {i}: up with the master gone"
            time.sleep(0.5)
    finally:
        tb.close()


def test_sigterm_after_the_master_died_exits_at_once(cluster):
    """Mooncake's client, torn down at exit, would retry unmounting the
    node's segment from a master that is gone for about ten seconds: the
    uplink leaves without that teardown, cleanly, within seconds."""
    m = cluster.master()
    node = cluster.node("a")
    node.start_uplink(m)
    m.kill()
    started = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    assert node.proc.wait(timeout=30) == 0, node.tail()
    assert time.monotonic() - started < 4, f"{time.monotonic() - started:.1f} s to exit: {node.tail()}"
    assert "terminate called" not in node.tail(50) and "leaving without Mooncake's teardown" in node.tail(50)


def test_uplink_killed_and_restarted(cluster):
    m = cluster.master()
    # B lends no memory: its death must not fail A's puts (that is the
    # replicas test's subject).
    a, b = cluster.node("a").start_uplink(m), cluster.node("b").start_uplink(m, segment="0")
    keys, payloads = pages(8)
    ta, ia = index(a)
    tb, ib = index(b)
    try:
        ia.set(keys[:4], payloads[:4])
        wait_metric(a, "put_pages", 4)
        assert ib.exists(keys[:4]) == 4
        b.kill_uplink()
        ia.set(keys[4:], payloads[4:])
        wait_metric(a, "put_pages", 8)
        started = time.monotonic()
        for _ in range(20):
            assert ib.exists(keys) == 4  # local only, at once
        assert time.monotonic() - started < 0.5
        b.start_uplink(m, segment="0")
        time.sleep(0.3)  # past the link's retry pause
        assert ib.exists(keys) == 8
        assert read_back(ib, keys) == payloads
    finally:
        ta.close()
        tb.close()


def test_peer_gone_replicas_keep_pages(cluster):
    """A node lending its memory to the cluster goes away: with --replicas 2
    its pages live on another node's segment; with one replica they vanish
    after the master's client TTL, and the lookup is a plain miss."""
    m = cluster.master(client_ttl=2)
    a = cluster.node("a").start_uplink(m, args=["--replicas", "2"])
    b = cluster.node("b").start_uplink(m)
    c = cluster.node("c").start_uplink(m, segment="0")
    keys, payloads = pages(6)
    ta, ia = index(a)
    tc, ic = index(c)
    try:
        ia.set(keys, payloads)
        wait_metric(a, "put_pages", 6)
        a.kill_uplink()
        time.sleep(3.5)  # past the client TTL: A's segment is gone
        assert ic.exists(keys) == 6
        assert read_back(ic, keys) == payloads
        # One replica, only D lends memory: gone with D.
        d = cluster.node("d").start_uplink(m)
        b.kill_uplink()
        b.start_uplink(m, segment="0")
        more, more_pay = pages(4, seed=5)
        td, idd = index(d)
        idd.set(more, more_pay)
        wait_metric(d, "put_pages", 4)
        d.kill_uplink()
        time.sleep(3.5)
        started = time.monotonic()
        assert ic.exists(more) == 0
        assert time.monotonic() - started <= 1.5
        td.close()
    finally:
        ta.close()
        tc.close()


def put_raw(mooncake_py, master, key, data):
    """Puts bytes under a cluster key with Mooncake's own client: a damaged
    or foreign object as another node could have left it."""
    code = textwrap.dedent("""
        import sys, ctypes, mmap
        from mooncake.store import MooncakeDistributedStore
        s = MooncakeDistributedStore()
        assert s.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE", "global_segment_size": 16 << 20,
                        "local_buffer_size": 16 << 20, "protocol": "tcp", "master_server_addr": sys.argv[1]}) == 0
        data = open(sys.argv[3], "rb").read()
        assert s.put(sys.argv[2], data) == 0
        print("ok", flush=True)
        sys.stdin.read()  # keeps its segment until the test ends
    """)
    path = os.path.join(os.path.dirname(master.log), f"obj-{abs(hash(key))}")
    with open(path, "wb") as f:
        f.write(data)
    p = subprocess.Popen([mooncake_py, "-c", code, master.address, key, path], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert p.stdout.readline().strip() == "ok"
    return p


def trailer(length, crc, mac=None):
    """A page trailer as Go's cluster.Trailer writes it (version 2: magic,
    version, flags, length, CRC-32C, a MAC where flag 1 says so)."""
    return struct.pack("<4sHHII16s", b"CXLP", 2, 1 if mac else 0, length, crc, mac or bytes(16))


def test_damaged_transfer_is_a_miss(cluster, mooncake_py):
    m = cluster.master()
    b = cluster.node("b").start_uplink(m)
    keys, payloads = pages(3, seed=3)
    tb, ib = index(b)
    holders = []
    try:
        good = payloads[0]
        bad_crc = trailer(len(good), 0x12345678)  # Go's cluster.Trailer, written here wrong on purpose
        short = trailer(len(good) + 5, 0)
        holders.append(put_raw(mooncake_py, m, f"cxltier/m/{keys[0].hex()}", good + bad_crc))
        holders.append(put_raw(mooncake_py, m, f"cxltier/m/{keys[1].hex()}", good + short))
        assert ib.exists(keys[:1]) == 0
        assert ib.exists(keys[1:2]) == 0
        mb = b.metrics()
        assert mb["rejected_pages"] == 2 and mb["fetched_pages"] == 0
        st = ib.stats()
        assert st["ready"] == 0 and st["reserved"] == 0 and st["used_blocks"] == 0
    finally:
        for h in holders:
            h.kill()
        tb.close()


@pytest.fixture(scope="session")
def daemon_bin(built, tmp_path_factory):
    """cxltierd: $CXLTIER_DAEMON, or built from this checkout."""
    if os.environ.get("CXLTIER_DAEMON"):
        return os.environ["CXLTIER_DAEMON"]
    import shutil

    if shutil.which("go") is None:
        pytest.skip("no cxltierd: set CXLTIER_DAEMON, or install Go to build it")
    out = str(tmp_path_factory.mktemp("daemon") / "cxltierd")
    subprocess.check_call(["go", "build", "-o", out, "./cmd/cxltierd"], cwd=ch.REPO)
    return out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a process as another user")
def test_a_non_root_uplink_serves_a_root_daemons_tier(built, daemon_bin):
    """Issue 64, defect 4, as the Kubernetes manifests run it: a root
    cxltierd with CXLTIER_SHARED_GROUP set makes the tier the group's; an
    uplink running as another user with that group as its own maps it,
    binds its socket beside the daemon's, registers with the daemon, and
    answers a root client's fills, which trusts it for its group."""
    work = tempfile.mkdtemp(prefix="cxltier-shared-")  # readable by the uplink's user, unlike pytest's tmp
    try:
        os.chmod(work, 0o755)
        for name in ("lib", "pkg", "tier"):
            os.mkdir(os.path.join(work, name), 0o755)
        lib = shutil.copy(built["lib"], os.path.join(work, "lib"))
        shutil.copytree(os.path.join(ch.REPO, "python", "cxltier"), os.path.join(work, "pkg", "cxltier"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.check_call(["chmod", "-R", "a+rX", work])
        device = "file:" + os.path.join(work, "tier", "tier")
        group = {"CXLTIER_SHARED_GROUP": str(SHARED_GID)}
        daemon = subprocess.Popen([daemon_bin, "-device", device, "-size", "64MiB", "-listen", f"127.0.0.1:{ch.free_port()}"],
                                  env=dict(os.environ, **group), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        uplink = None
        try:
            ch.wait_for(lambda: any(n.endswith(".sock") for n in os.listdir(os.path.join(work, "tier"))), 30,
                        "the daemon's socket")
            st = os.stat(os.path.join(work, "tier", "tier"))
            assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, SHARED_GID, 0o660)

            env = dict(os.environ, CXLTIER_LIB=lib, PYTHONPATH=os.path.join(work, "pkg"), **group)
            python = _python_another_user_runs(env, work)
            uplink = subprocess.Popen([python, "-m", "cxltier.cluster.uplink", "--tier", device], env=env,
                                      preexec_fn=_become_uplink_user, cwd=work, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True)
            said = uplink.stdout.readline() + uplink.stdout.readline()
            assert "serving" in said, said + (uplink.stdout.read() if uplink.poll() is not None else "")
            sock = re.search(r"serving \S+ at (/\S+\.sock)", said).group(1)
            assert os.stat(sock).st_uid == 65532
            # A root client (a serving pod in SGLang's image), started with the
            # group named as the pod would be: it asks the uplink and trusts it.
            client = textwrap.dedent("""
                import sys, cxltier
                t = cxltier.Tier(sys.argv[1])
                ix = t.prefix("m", blocks=8, block_bytes=4096)
                print(ix.exists([cxltier.string_key("nothing")]), ix.stats()["uplink"]["fills"])
                t.close()
            """)
            r = subprocess.run([sys.executable, "-c", client, device], capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, CXLTIER_LIB=built["lib"],
                                        PYTHONPATH=os.path.join(ch.REPO, "python"), **group))
            assert r.returncode == 0 and r.stdout.split() == ["0", "1"], r.stdout + r.stderr[-1000:]
            uplink.terminate()
            rest = uplink.communicate(timeout=10)[0]
            assert uplink.returncode == 0, said + rest
            assert "does not know this uplink" not in said + rest  # the daemon proved and registered it
        finally:
            if uplink is not None and uplink.poll() is None:
                uplink.kill()
                uplink.wait()
            daemon.terminate()
            daemon.wait(timeout=10)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _become_uplink_user():
    os.setgroups([])
    os.setgid(SHARED_GID)
    os.setuid(65532)


def _python_another_user_runs(env, cwd):
    """This Python, or the system's, whichever uid 65532 may run with the
    package importable (this one may live in root's home)."""
    for python in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        try:
            r = subprocess.run([python, "-c", "import cxltier.cluster.uplink"], env=env, cwd=cwd,
                               preexec_fn=_become_uplink_user, capture_output=True)
        except OSError:  # not this user's to run (under a home only root enters), or not there
            continue
        if r.returncode == 0:
            return python
    pytest.skip("no Python interpreter that uid 65532 may run and import cxltier with")


def test_uplink_crash_mid_fetch_publishes_nothing(cluster, daemon_bin):
    """The uplink dies after the transfer wrote the blocks and before it
    published them: the pages are not served, the node's daemon reclaims
    the reservations, and the next uplink fetches them whole."""
    m = cluster.master()
    a = cluster.node("a").start_uplink(m)
    b = cluster.node("b").start_uplink(m, segment="0", env={"CXLTIER_UPLINK_TEST_PAUSE_BEFORE_PUBLISH": "30"})
    keys, payloads = pages(5, seed=7)
    ta, ia = index(a)
    tb, ib = index(b)
    port = ch.free_port()
    daemon = subprocess.Popen([daemon_bin, "-device", b.devices, "-listen", f"127.0.0.1:{port}", "-lease-timeout", "1s"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ia.set(keys, payloads)
        wait_metric(a, "put_pages", 5)
        assert ib.exists(keys) == 0  # the fill timed out: the uplink holds the blocks unpublished
        ch.wait_for(lambda: ib.stats()["reserved"] == 5, 5, "the uplink's reservations")
        b.kill_uplink()
        assert ib.exists(keys) == 0
        ch.wait_for(lambda: ib.stats()["reserved"] == 0, 15, "the daemon reclaiming the dead uplink's reservations")
        b.start_uplink(m, segment="0")
        time.sleep(0.3)
        assert ib.exists(keys) == 5
        assert read_back(ib, keys) == payloads
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)
        ta.close()
        tb.close()


def test_tenant_keys_hold_across_nodes(cluster, tmp_path):
    m = cluster.master()
    files = {}
    for name, key in (("k1", "tenant-one"), ("k2", "tenant-two")):
        f = tmp_path / name
        f.write_text(f"t={key}\n")
        f.chmod(0o600)
        files[name] = str(f)
    a = cluster.node("a").start_uplink(m, args=["--keys", files["k1"]])
    b = cluster.node("b").start_uplink(m, args=["--keys", files["k1"]])
    c = cluster.node("c").start_uplink(m, args=["--keys", files["k2"]])
    d = cluster.node("d").start_uplink(m)  # no key for "t"
    keys, payloads = pages(4, seed=11)
    opened = [index(a, "t", "tenant-one"), index(b, "t", "tenant-one"), index(c, "t", "tenant-two"),
              index(d, "t", "tenant-one")]
    (ta, ia), (tb, ib), (tc, ic), (td, idd) = opened
    try:
        ia.set(keys, payloads)
        wait_metric(a, "put_pages", 4)
        assert ib.exists(keys) == 4 and read_back(ib, keys) == payloads
        assert ic.exists(keys) == 0  # another tenant's index of the same name
        assert idd.exists(keys) == 0  # an uplink without the key serves nothing of it
        assert d.metrics()["denied_pages"] >= 4
        idd.set(keys[:1], payloads[:1])
        wait_metric(d, "denied_pages", 5)
        assert d.metrics()["put_pages"] == 0
    finally:
        for t, _ in opened:
            t.close()


def test_full_queue_drops_and_never_blocks(cluster):
    m = cluster.master()
    a = cluster.node("a").start_uplink(m, args=["--queue", "4"])
    keys = [cxltier.string_key(f"small-{i}") for i in range(1500)]
    t = cxltier.Tier(a.devices)
    ix = t.prefix("small", blocks=2048, block_bytes=4096)
    try:
        started = time.monotonic()
        assert set(ix.set(keys, [b"x" * 64] * len(keys))) == {"stored"}
        assert time.monotonic() - started < 2.0
        link = ix.stats()["uplink"]
        ch.wait_for(lambda: a.metrics()["dropped_pages"] + link["dropped"] > 0, 5, "drops counted")
        mm = ch.wait_for(lambda: (lambda x: x if x["put_pages"] + x["dropped_pages"] + link["dropped"] >= 1500 else None)(
            a.metrics()), 20, "every page put or dropped")
        assert mm["put_pages"] + mm["dropped_pages"] + link["dropped"] == 1500
    finally:
        t.close()


def _run_uplink(built, *args, python=sys.executable):
    env = dict(os.environ, CXLTIER_LIB=built["lib"], PYTHONPATH=os.path.join(ch.REPO, "python"))
    return subprocess.run([python, "-m", "cxltier.cluster.uplink", *args], capture_output=True, text=True, env=env, timeout=60)


def test_uplink_command_errors(built, device, tmp_path):
    """Bad input to the uplink's command line ends it with one line saying
    what is wrong (exit 2), never a traceback."""
    cases = [
        (["--tier", "shm:cxltier-no-such-tier-here"], "cxltier-no-such-tier-here"),
        (["--tier", device, "--admit", "some"], "--admit"),
        (["--tier", device, "--replicas", "0"], "--replicas"),
        (["--tier", device, "--keys", str(tmp_path / "missing")], "missing"),
        (["--tier", device, "--metrics", "127.0.0.1:notaport"], "--metrics"),
    ]
    for args, says in cases:
        r = _run_uplink(built, *args)
        assert r.returncode == 2, (args, r.returncode, r.stderr[-500:])
        assert says in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-500:])


def test_uplink_without_mooncake_says_so(built, device):
    """--master on a Python without Mooncake: the install line, not an
    ImportError."""
    import importlib.util

    if importlib.util.find_spec("mooncake") is not None:
        pytest.skip("this Python has Mooncake")
    r = _run_uplink(built, "--tier", device, "--master", "127.0.0.1:1")
    assert r.returncode == 2 and "pip install mooncake-transfer-engine" in r.stderr, r.stderr[-500:]


def test_uplink_stops_on_sigterm_to_any_thread(built, device):
    """The kernel hands a process-wide SIGTERM to any thread that does not
    block it, often one of the Go runtime's: the uplink stops all the same.
    Each try signals one thread other than the main one."""
    import ctypes
    import platform

    SYS_tgkill = {"x86_64": 234, "aarch64": 131}.get(platform.machine())
    if SYS_tgkill is None:
        pytest.skip(f"tgkill's number on {platform.machine()} is not listed here")
    libc = ctypes.CDLL(None, use_errno=True)
    env = dict(os.environ, CXLTIER_LIB=built["lib"], PYTHONPATH=os.path.join(ch.REPO, "python"))
    for attempt in range(3):
        up = subprocess.Popen([sys.executable, "-m", "cxltier.cluster.uplink", "--tier", device], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            assert "serving" in up.stdout.readline() + up.stdout.readline()
            time.sleep(0.5)  # the main thread is waiting by now
            others = sorted(int(t) for t in os.listdir(f"/proc/{up.pid}/task") if int(t) != up.pid)
            assert others, "the uplink runs more than one thread"
            tid = others[attempt % len(others)]
            assert libc.syscall(SYS_tgkill, up.pid, tid, signal.SIGTERM) == 0, ctypes.get_errno()
            assert up.wait(timeout=10) == 0
        finally:
            if up.poll() is None:
                up.kill()
                up.wait()


def test_second_uplink_for_a_node_is_refused(built, device):
    """Two uplinks for one node's tier would split its single flight: the
    second is refused, naming the reason."""
    env = dict(os.environ, CXLTIER_LIB=built["lib"], PYTHONPATH=os.path.join(ch.REPO, "python"))
    first = subprocess.Popen([sys.executable, "-m", "cxltier.cluster.uplink", "--tier", device], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert "serving" in first.stdout.readline() + first.stdout.readline()
        r = _run_uplink(built, "--tier", device)
        assert r.returncode == 2 and "another uplink" in r.stderr, r.stderr[-500:]
        # Without a cluster the uplink still answers fills, as misses.
        t = cxltier.Tier(device)
        ix = t.prefix("m", blocks=8, block_bytes=4096)
        assert ix.exists([cxltier.string_key("nothing")]) == 0
        assert ix.stats()["uplink"]["fills"] == 1
        t.close()
    finally:
        first.terminate()
        first.wait(timeout=10)


def _start_uplink(built, device, env=None):
    e = dict(os.environ, CXLTIER_LIB=built["lib"], PYTHONPATH=os.path.join(ch.REPO, "python"))
    e.update(env or {})
    proc = subprocess.Popen([sys.executable, "-m", "cxltier.cluster.uplink", "--tier", device], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    while True:
        line = proc.stdout.readline()
        lines.append(line)
        if not line or "serving" in line:
            break
    assert "serving" in lines[-1], "".join(lines)
    return proc, "".join(lines)


def _stop(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_dead_uplinks_socket_is_replaced(built, device):
    """An uplink killed without closing leaves its socket file; the next one
    starts all the same (and a live one is still refused)."""
    first, _ = _start_uplink(built, device)
    first.kill()
    first.wait()
    second, said = _start_uplink(built, device)
    try:
        path = re.search(r"serving \S+ at (/\S+\.sock)", said).group(1)
        assert os.path.exists(path), said
        r = _run_uplink(built, "--tier", device)
        assert r.returncode == 2 and "another uplink" in r.stderr, r.stderr[-500:]
    finally:
        second.terminate()
        assert second.wait(timeout=10) == 0
    assert not os.path.exists(path) and not os.path.exists(path + ".lock")


def _uplink_socket_path(built, device):
    """Where the tier's uplink binds its socket, learnt from one that
    started and stopped cleanly (no uplink runs after)."""
    first, said = _start_uplink(built, device)
    first.terminate()
    assert first.wait(timeout=10) == 0
    return re.search(r"serving \S+ at (/\S+\.sock)", said).group(1)


def test_an_untrusted_uplink_is_named_in_the_stats(built, device):
    """A process of another user (not root, not this user, no group named)
    at the uplink's socket gets no fill: each is a miss, as before, and the
    index's uplink stats now say why (a server missing
    CXLTIER_SHARED_GROUP beside a non-root uplink looked healthy)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    path = _uplink_socket_path(built, device)
    other = textwrap.dedent("""
        import os, socket, sys
        os.setgroups([]); os.setgid(65534); os.setuid(65534)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.bind(sys.argv[1]); s.listen(8)
        print("listening", flush=True)
        sys.stdin.read()
    """)
    listener = subprocess.Popen([sys.executable, "-c", other, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
    try:
        if listener.stdout.readline().strip() != "listening":
            pytest.skip("uid 65534 may not bind beside the tier here")
        t = cxltier.Tier(device)
        try:
            ix = t.prefix("m", blocks=8, block_bytes=4096)
            assert ix.exists([cxltier.string_key("nothing")]) == 0
            link = ix.stats()["uplink"]
            assert link["fills"] == 0 and link["fill_failures"] == 1, link
            assert "uid 65534" in link["last_error"] and "not trusted" in link["last_error"], link
        finally:
            t.close()
    finally:
        listener.kill()
        listener.wait()
        if os.path.exists(path):
            os.unlink(path)


def test_a_lock_file_another_user_holds_keeps_no_uplink_out(built, device):
    """Another user creates the uplink's lock file while no uplink runs and
    holds it (flock): every uplink then refused to start ("another uplink
    serves"). The uplink removes what another user put there, says so, and
    serves."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a process as another user")
    path = _uplink_socket_path(built, device)
    squat = textwrap.dedent("""
        import fcntl, os, sys
        os.setgid(65534); os.setuid(65534)
        fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("holding", flush=True)
        sys.stdin.read()
    """)
    holder = subprocess.Popen([sys.executable, "-c", squat, path + ".lock"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        if holder.stdout.readline().strip() != "holding":
            pytest.skip("uid 65534 may not create files beside the tier here")
        up_, said = _start_uplink(built, device)
        try:
            assert "uid 65534" in said and "in the way" in said, said
        finally:
            up_.terminate()
            assert up_.wait(timeout=10) == 0
    finally:
        holder.kill()
        holder.wait()


def test_uplink_survives_a_double_sigterm(built, device):
    """GNU timeout signals twice: the second SIGTERM lands while the first
    is handled. The handler only sets a flag, so the uplink stops, 10 of 10
    (it used to deadlock re-entering Event.set inside the handler)."""
    for _ in range(10):
        up_, _ = _start_uplink(built, device)
        try:
            up_.send_signal(signal.SIGTERM)
            up_.send_signal(signal.SIGTERM)
            assert up_.wait(timeout=10) == 0
        finally:
            _stop(up_)


def test_uplink_stops_when_its_tier_is_replaced(built, device):
    """Its tier destroyed and created again under the same name: the uplink
    says so and exits non-zero instead of serving a tier no one uses."""
    up_, _ = _start_uplink(built, device)
    try:
        subprocess.check_call([built["cli"], "destroy", "-force", device], stdout=subprocess.DEVNULL)
        subprocess.check_call([built["cli"], "format", "-device", device, "-size", "64MiB", "-chunk", "256KiB"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert up_.wait(timeout=15) == 3
        out = up_.stdout.read()
        assert "destroyed" in out or "another file" in out or "formatted again" in out, out[-800:]
    finally:
        _stop(up_)


def test_uplink_says_it_needs_the_daemon(built, device, daemon_bin):
    """Without cxltierd on the node, the uplink says what that costs; with
    one, it registers and says nothing of the kind."""
    up_, _ = _start_uplink(built, device)
    try:
        time.sleep(2.5)
        up_.send_signal(signal.SIGTERM)
        up_.wait(timeout=10)
        assert "does not know this uplink" in up_.stdout.read()
    finally:
        _stop(up_)
    port = ch.free_port()
    daemon = subprocess.Popen([daemon_bin, "-device", device, "-listen", f"127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ch.wait_for(lambda: ch.http_ok(f"http://127.0.0.1:{port}/healthz"), 20, "cxltierd")
        up_, _ = _start_uplink(built, device)
        try:
            time.sleep(2.5)
            up_.send_signal(signal.SIGTERM)
            up_.wait(timeout=10)
            assert "does not know this uplink" not in up_.stdout.read()
        finally:
            _stop(up_)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)


def test_a_reaped_uplink_stops_saying_why(built, device, daemon_bin):
    """An uplink stopped past its lease, reaped by a daemon that judges by
    heartbeat (-skip-pid-check), then resumed, with no fill traffic: it ran
    on, dropping every write-behind page while /healthz said ok. It sees
    its lease gone within its next check and exits 3, saying so."""
    dev, cli = device, built["cli"]
    subprocess.check_call([cli, "format", "-force", "-device", dev, "-size", "64MiB", "-chunk", "256KiB",
                           "-lease-timeout", "1s"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    port = ch.free_port()
    daemon = subprocess.Popen([daemon_bin, "-device", dev, "-listen", f"127.0.0.1:{port}", "-skip-pid-check",
                               "-prefix-blocks", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        ch.wait_for(lambda: ch.http_ok(f"http://127.0.0.1:{port}/healthz"), 20, "cxltierd")
        up_, _ = _start_uplink(built, dev)
        try:
            up_.send_signal(signal.SIGSTOP)
            time.sleep(4)  # four lease timeouts: the daemon reaps it
            up_.send_signal(signal.SIGCONT)
            assert up_.wait(timeout=20) == 3
            out = up_.stdout.read()
            assert "lease on the tier" in out and "was reaped" in out, out
        finally:
            up_.send_signal(signal.SIGCONT)
            _stop(up_)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=10)


NETNS_CLIENT = textwrap.dedent("""
    import sys
    import cxltier
    t = cxltier.Tier(sys.argv[1])
    ix = t.prefix("m", blocks=8, block_bytes=4096)
    ix.exists([cxltier.string_key("nothing")])
    link = ix.stats()["uplink"]
    print(link["fills"], link["fill_failures"], flush=True)
    t.close()
""")


def _in_own_network_namespace(built, *argv):
    """Runs argv in a network namespace of its own (unshare -n; root only)."""
    if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a network namespace here (unshare -n needs root)")
    env = dict(os.environ, CXLTIER_LIB=built["lib"], PYTHONPATH=os.path.join(ch.REPO, "python"))
    return subprocess.run(["unshare", "-n", *argv], capture_output=True, text=True, env=env, timeout=60)


def test_client_in_its_own_network_namespace_reaches_the_uplink(built, device):
    """A process in a network namespace of its own (a pod) that shares the
    tier's directory reaches its node's uplink: its fill is answered. With
    an abstract socket, which is per network namespace, it never was."""
    up_, _ = _start_uplink(built, device)
    try:
        r = _in_own_network_namespace(built, sys.executable, "-c", NETNS_CLIENT, device)
        assert r.returncode == 0, r.stderr[-800:]
        fills, failures = map(int, r.stdout.split())
        assert (fills, failures) == (1, 0), r.stdout
    finally:
        up_.terminate()
        up_.wait(timeout=10)


NETNS_READER = textwrap.dedent("""
    import sys
    import cxltier
    t = cxltier.Tier(sys.argv[1])
    ix = t.prefix("m")
    keys = [cxltier.string_key(f"page-5-{i}") for i in range(int(sys.argv[2]))]
    print(ix.exists(keys), ix.stats()["uplink"]["filled"], flush=True)
    t.close()
""")


def test_pod_in_its_own_network_namespace_gets_cluster_fills(cluster, built):
    """Node B's server runs in a network namespace of its own (a pod
    sharing the tier's directory with the node): pages node A stored are
    hits for it, filled by B's uplink. Before, every such page was a local
    miss."""
    m = cluster.master()
    a, b = cluster.node("a").start_uplink(m), cluster.node("b").start_uplink(m)
    keys, payloads = pages(8, seed=5)
    ta, ia = index(a)
    tb, _ = index(b)  # creates B's index
    try:
        assert ia.set(keys, payloads) == ["stored"] * 8
        wait_metric(a, "put_pages", 8)
        r = _in_own_network_namespace(built, sys.executable, "-c", NETNS_READER, b.devices, "8")
        assert r.returncode == 0, r.stderr[-800:]
        assert r.stdout.split() == ["8", "8"], r.stdout
        assert b.metrics()["fetched_pages"] == 8
    finally:
        ta.close()
        tb.close()


def test_uplink_on_a_tier_in_a_deep_directory(built, tmp_path):
    """A tier whose directory is deeper than a socket address holds: the
    uplink binds its socket there all the same and answers fills."""
    d = tmp_path
    while len(str(d)) < 150:
        d = d / "a-directory-of-some-depth"
    d.mkdir(parents=True)
    device = f"file:{d / 'tier'}"
    subprocess.check_call([built["cli"], "format", "-device", device, "-size", "64MiB", "-chunk", "256KiB"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    up_, said = _start_uplink(built, device)
    try:
        t = cxltier.Tier(device)
        ix = t.prefix("m", blocks=8, block_bytes=4096)
        assert ix.exists([cxltier.string_key("nothing")]) == 0
        assert ix.stats()["uplink"]["fills"] == 1, said
        t.close()
    finally:
        up_.terminate()
        assert up_.wait(timeout=10) == 0


WRITER = textwrap.dedent("""
    import sys, time
    import cxltier
    t = cxltier.Tier(sys.argv[1])
    ix = t.prefix("busy", blocks=512, block_bytes=65536)
    n = 0
    while True:  # stores pages, which the uplink writes behind, until killed
        keys = [cxltier.string_key(f"busy-{n}-{i}") for i in range(64)]
        ix.set(keys, [bytes([n % 251]) * 60000] * 64)
        n += 1
""")


def test_sigterm_under_write_behind_load_exits_cleanly(cluster, built):
    """SIGTERM while the write-behind moves pages out of the tier: the
    uplink stops its threads, unregisters the tier from the transfer engine
    and gives its holds back before it detaches, and exits 0, 20 of 20. (It
    detached under the transfer engine and died of SIGSEGV in 8 of 14.)"""
    m = cluster.master()
    node = cluster.node("a", size="128MiB")
    env = dict(os.environ, CXLTIER_LIB=built["lib"], PYTHONPATH=os.path.join(ch.REPO, "python"))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, node.devices], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        codes = []
        for _ in range(20):
            node.start_uplink(m)
            before = node.metrics().get("put_pages", 0)
            wait_metric(node, "put_pages", before + 64)  # busy now
            node.proc.send_signal(signal.SIGTERM)
            codes.append(node.proc.wait(timeout=30))
        assert codes == [0] * 20, (codes, node.tail())
        assert writer.poll() is None, writer.stderr.read()[-800:]
    finally:
        writer.kill()
        writer.wait()


def test_failure_mid_fill_leaves_nothing_reserved(cluster):
    """Anything that raises between a fill's reserve and its commit (here a
    failure injected right after the blocks were handed out) aborts the
    fill: no reservation and no trailer slot stays taken. (They leaked, and
    once the 65,536 slots were gone every two-piece page failed.)"""
    m = cluster.master()
    a = cluster.node("a").start_uplink(m)
    b = cluster.node("b").start_uplink(m, env={"CXLTIER_UPLINK_TEST_RAISE_IN_TRANSFER": "1"})
    keys, payloads = pages(4, seed=9)
    ta, ia = index(a)
    tb, ib = index(b)
    try:
        big = [p + b"x" * (BLOCK - len(p) - 4) for p in payloads]  # no room for the trailer: two pieces
        assert ia.set(keys, big) == ["stored"] * 4
        wait_metric(a, "put_pages", 4)
        assert ib.exists(keys) == 0
        assert "a failure injected by a test" in b.tail(40)
        st = ib.stats()
        assert st["reserved"] == 0 and st["ready"] == 0, st
        assert b.metrics()["trailer_slots_free"] == 1 << 16
    finally:
        ta.close()
        tb.close()


def test_a_fetch_in_parts_serves_every_page(cluster):
    """--fill-part: a fetch moves in parts, each checked and published
    while the next transfers; pages in one piece and in two (the trailer
    apart) are served as a fetch in one part serves them, and nothing stays
    reserved or taken."""
    m = cluster.master()
    a = cluster.node("a").start_uplink(m)
    b = cluster.node("b").start_uplink(m, args=["--fill-part", "80000", "--verbose"])
    keys, payloads = pages(16, seed=12)
    payloads[5:9] = [p + b"x" * (BLOCK - len(p) - 4) for p in payloads[5:9]]  # no room for the trailer
    ta, ia = index(a)
    tb, ib = index(b)
    try:
        store_on(a, ia, keys, payloads)
        assert_served(ib, keys, payloads)
        mb = b.metrics()
        assert mb["fetched_pages"] == 16 and mb["fetch_seconds_count"] == 1 and mb["trailer_slots_free"] == 1 << 16
        parts = [int(x) for x in re.findall(r"fetch of 16 pages in (\d+) part", b.tail(200))]
        assert parts and parts[0] >= 3, b.tail(20)
        st = ib.stats()
        assert st["ready"] == 16 and st["reserved"] == 0
    finally:
        ta.close()
        tb.close()


def test_a_fill_on_the_link_gives_way_between_parts(cluster, built, tmp_path):
    """Issue 67: an uplink whose tier joined the node's link (CXLTIER_LINK)
    moves a fetch in parts of about 32 MiB without --fill-part, a link turn
    before each part's transfer and one before each page its commit
    checks: the link's table counts every fetched byte twice (moved, then
    read by its check), and the pages are served as a fetch in one part
    serves them."""
    m = cluster.master()
    a = cluster.node("a", size="256MiB").start_uplink(m, segment="128MiB")
    b = cluster.node("b", size="256MiB").start_uplink(m, env={"CXLTIER_LINK": "fills"}, args=["--verbose"])
    n, size, block = 70, 1_000_000, 1 << 20  # 70 MB: two parts of 32 MiB or more
    keys = [cxltier.string_key(f"linked-{i}") for i in range(n)]
    ramp = bytes(range(251)) * (size // 251 + 2)
    payloads = [ramp[i % 251: i % 251 + size] for i in range(n)]
    ta, tb = cxltier.Tier(a.devices), cxltier.Tier(b.devices)
    ia, ib = ta.prefix("m", blocks=72, block_bytes=block), tb.prefix("m", blocks=72, block_bytes=block)
    try:
        before = tb.link_stats("fills")
        assert before["processes"] == 1 and before["bulk_bytes"] == 0, before  # the uplink, joined at attach
        store_on(a, ia, keys, payloads)
        # The miss is asked from a client that waits for the 70 MB as long
        # as a loaded machine may take (its wait is read at attach).
        go = tmp_path / "go"
        go.write_text("")
        env = dict(os.environ, CXLTIER_LIB=built["lib"], PYTHONPATH=os.path.join(ch.REPO, "python"),
                   CXLTIER_UPLINK_TIMEOUT="60s")
        r = subprocess.run([sys.executable, "-c", CLIENT.replace("page-0-", "linked-"), b.devices, str(go), str(n)],
                           capture_output=True, text=True, env=env, timeout=120)
        assert r.stdout.strip() == str(n), (r.stdout, r.stderr[-2000:], b.tail(20))
        bufs = [bytearray(block) for _ in keys]
        got, lens = ib.get(keys, bufs)
        assert got == n and all(bytes(bufs[i][: lens[i]]) == payloads[i] for i in range(n))
        parts = [int(x) for x in re.findall(r"fetch of 70 pages in (\d+) part", b.tail(200))]
        assert parts == [2], b.tail(20)
        st = tb.link_stats("fills")
        assert st["bulk_bytes"] == 2 * n * size, st
        assert b.metrics()["fetched_pages"] == n
    finally:
        ta.close()
        tb.close()


def test_the_fill_part_follows_the_link():
    """--fill-part as given wins (0: one part); without it a fetch is one
    part, or parts of LINK_FILL_PART on a tier that joined a link."""
    assert up._fill_part(None, False) == 0
    assert up._fill_part(None, True) == up.LINK_FILL_PART == 32 << 20
    assert up._fill_part(0, True) == 0 and up._fill_part(1 << 20, False) == 1 << 20
    with pytest.raises(up.UplinkError, match="want 0"):
        up._fill_part(-1, True)


def test_a_failure_in_a_later_part_keeps_the_parts_before_it(cluster):
    """A fetch in parts that fails in its second part's transfer has
    published its first part (the leading pages are hits), answers the
    reader with those pages, and left nothing reserved and no trailer slot
    taken."""
    m = cluster.master()
    a = cluster.node("a").start_uplink(m)
    b = cluster.node("b").start_uplink(m, args=["--fill-part", "80000"],
                                       env={"CXLTIER_UPLINK_TEST_RAISE_IN_TRANSFER": "2"})
    keys, payloads = pages(12, seed=13)
    payloads = [p + b"x" * (BLOCK - len(p) - 4) for p in payloads]  # two pieces each
    ta, ia = index(a)
    tb, ib = index(b)
    try:
        store_on(a, ia, keys, payloads)
        first = ib.exists(keys)  # the fill failed after its first part: the reader gets that part
        assert "a failure injected by a test" in b.tail(40)
        st = ib.stats()
        assert 0 < first < 12 and st["ready"] == first and st["reserved"] == 0, (first, st)
        assert ib.exists(keys[:first]) == first  # local hits: the uplink is not asked
        assert read_back(ib, keys[:first]) == payloads[:first]
        mb = b.metrics()
        assert mb["trailer_slots_free"] == 1 << 16 and mb["fill_requests"] == 1 and mb["fill_failures"] == 1, mb
    finally:
        ta.close()
        tb.close()


def test_a_dead_event_stream_is_unhealthy(cluster):
    """The KV event stream stops for good (here a failure injected into its
    loop, as its tier client's loss would): the uplink's /healthz says so
    (503) instead of ok, and the uplink stops (exit status 3), so that a
    supervisor starts a fresh one; a router would otherwise keep the node's
    last view forever."""
    import urllib.error
    import urllib.request

    node = cluster.node("a")
    node.start_uplink(args=["--events", f"tcp://127.0.0.1:{ch.free_port()}", "--events-interval", "0.05"],
                      env={"CXLTIER_KV_EVENTS_TEST_FAIL_AFTER": "1.5"})
    codes = []

    def health():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{node.metrics_port}/healthz", timeout=1) as r:
                codes.append(r.status)
        except urllib.error.HTTPError as e:
            codes.append((e.code, e.read()))
        except OSError:
            codes.append(None)  # gone
        return codes[-1] != 200

    ch.wait_for(health, 15, "the uplink's health after its stream stopped")
    assert node.proc.wait(timeout=15) == 3, node.tail()
    assert "event stream stopped" in node.tail(), node.tail()
    unhealthy = [c for c in codes if isinstance(c, tuple)]
    assert not unhealthy or (unhealthy[0][0] == 503 and b"event stream stopped" in unhealthy[0][1]), codes


def test_joiners_wait_as_long_as_the_fetch(cluster, built, tmp_path):
    """A fetch that takes longer than the fill timeout (here 1.5 s between
    its transfer and its publish, as a large one might): the processes that
    joined it wait as long as it takes and get the hit. (Joiners gave up
    after the fill timeout, 1 s, and reported a miss while the page came.)"""
    m = cluster.master()
    a = cluster.node("a").start_uplink(m)
    b = cluster.node("b").start_uplink(m, env={"CXLTIER_UPLINK_TEST_PAUSE_BEFORE_PUBLISH": "1.5"})
    keys, payloads = pages(6, seed=11)
    ta, ia = index(a)
    tb, ib = index(b)
    try:
        ia.set(keys, payloads)
        wait_metric(a, "put_pages", 6)
        go = tmp_path / "go"
        env = dict(os.environ, CXLTIER_LIB=built["lib"], PYTHONPATH=os.path.join(ch.REPO, "python"),
                   CXLTIER_UPLINK_TIMEOUT="10s")
        procs = [subprocess.Popen([sys.executable, "-c", CLIENT.replace("page-0-", "page-11-"), b.devices, str(go), "6"],
                                  stdout=subprocess.PIPE, text=True, env=env) for _ in range(4)]
        time.sleep(1.0)
        go.write_text("")
        results = [int(p.communicate(timeout=60)[0].strip() or -1) for p in procs]
        mb = b.metrics()
        assert results == [6] * 4, (results, mb)
        assert mb["fetched_pages"] == 6 and mb["joined_pages"] > 0
    finally:
        ta.close()
        tb.close()


def test_a_hung_write_behind_drops_and_counts(cluster):
    """A master that stops answering while the write-behind puts pages: the
    stalled call marks the cluster down, and the pages stored meanwhile are
    dropped and counted at once instead of queueing behind the call, which
    may not return for minutes; writers never wait."""
    m = cluster.master()
    a = cluster.node("a").start_uplink(m)
    t = cxltier.Tier(a.devices)
    ix = t.prefix("hung", blocks=4096, block_bytes=4096)
    try:
        first = [cxltier.string_key(f"hung-first-{i}") for i in range(8)]
        assert set(ix.set(first, [b"f" * 256] * 8)) == {"stored"}
        wait_metric(a, "put_pages", 8)
        os.kill(m.proc.pid, signal.SIGSTOP)
        try:
            # Pages until a put hangs and the watchdog notices.
            n = 0
            deadline = time.monotonic() + 20
            while a.metrics()["cluster_up"] == 1 and time.monotonic() < deadline:
                keys = [cxltier.string_key(f"hung-{n}-{i}") for i in range(32)]
                assert set(ix.set(keys, [b"x" * 256] * 32)) == {"stored"}
                n += 1
                time.sleep(0.05)
            assert a.metrics()["cluster_up"] == 0, "the stall was not noticed"
            before = a.metrics()
            later = [cxltier.string_key(f"hung-later-{i}") for i in range(500)]
            started = time.monotonic()
            assert set(ix.set(later, [b"y" * 256] * 500)) == {"stored"}
            assert time.monotonic() - started < 2.0
            after = ch.wait_for(lambda: (lambda x: x if x["dropped_pages"] - before["dropped_pages"]
                                          + ix.stats()["uplink"]["dropped"] >= 500 and x["queue_pages"] == 0
                                          else None)(a.metrics()), 5, "the pages stored while down dropped and counted")
            assert after["queue_pages"] == 0
        finally:
            os.kill(m.proc.pid, signal.SIGCONT)
    finally:
        t.close()


def _crc32c(data, crc=0):
    """CRC-32C (Castagnoli), as Go's hash/crc32 computes it."""
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def test_a_forged_page_is_refused_with_the_cluster_key(cluster, mooncake_py, tmp_path):
    """A process that reaches the master puts a page under a node's key with
    an attacker's payload and a correct CRC-32C of key and payload: without
    the cluster key, node B serves it (what the key is for); with the
    cluster key on every uplink, B refuses it and still takes the pages A
    signed."""
    key_file = tmp_path / "cluster.key"
    key_file.write_text("a cluster secret of some length\n")
    key_file.chmod(0o600)
    keys, payloads = pages(3, seed=21)
    forged = b"the attacker's KV" * 2000
    crc = _crc32c(forged, _crc32c(keys[2]))
    for signed in (False, True):
        m = cluster.master()
        args = ["--cluster-key", str(key_file)] if signed else []
        a = cluster.node(f"a{signed}").start_uplink(m, args=args)
        b = cluster.node(f"b{signed}").start_uplink(m, args=args)
        ta, ia = index(a)
        tb, ib = index(b)
        holder = put_raw(mooncake_py, m, f"cxltier/m/{keys[2].hex()}", forged + trailer(len(forged), crc))
        try:
            assert ia.set(keys[:2], payloads[:2]) == ["stored"] * 2
            wait_metric(a, "put_pages", 2)
            assert ib.exists(keys[:2]) == 2 and read_back(ib, keys[:2]) == payloads[:2]
            if signed:
                assert ib.exists(keys[2:]) == 0
                assert b.metrics()["rejected_pages"] == 1 and ib.stats()["reserved"] == 0
                assert "failed their check" in b.tail(400) and "--cluster-key" in b.tail(400)  # says why
            else:
                assert ib.exists(keys[2:]) == 1 and read_back(ib, keys[2:]) == [forged]
        finally:
            holder.kill()
            ta.close()
            tb.close()


def test_uplinks_of_different_cluster_keys_say_why_they_refuse(cluster, tmp_path):
    """Two uplinks given different cluster keys: every page A signs, B
    refuses, and B's log says why (it said nothing)."""
    files = []
    for name in ("one", "two"):
        f = tmp_path / f"{name}.key"
        f.write_text(f"cluster key {name} of some length\n")
        f.chmod(0o600)
        files.append(str(f))
    m = cluster.master()
    a = cluster.node("a").start_uplink(m, args=["--cluster-key", files[0]])
    b = cluster.node("b").start_uplink(m, args=["--cluster-key", files[1]])
    keys, payloads = pages(2, seed=41)
    ta, ia = index(a)
    tb, ib = index(b)
    try:
        assert ia.set(keys, payloads) == ["stored"] * 2
        wait_metric(a, "put_pages", 2)
        assert ib.exists(keys) == 0
        assert b.metrics()["rejected_pages"] >= 1
        assert "failed their check" in b.tail(400) and "same --cluster-key" in b.tail(400)
    finally:
        ta.close()
        tb.close()


def test_an_oversize_planted_page_is_one_miss(cluster, mooncake_py):
    """An object larger than any page of the index under a node's key (a
    damaged or planted one), after two good pages: the fill brings the two
    and stops there, a miss, not a failed fill with a traceback (the fill
    of the whole batch failed, the good pages too)."""
    m = cluster.master()
    a = cluster.node("a").start_uplink(m)
    b = cluster.node("b").start_uplink(m)
    keys, payloads = pages(3, seed=31)
    ta, ia = index(a)
    tb, ib = index(b)
    big = bytes(2 * BLOCK)
    holder = put_raw(mooncake_py, m, f"cxltier/m/{keys[2].hex()}", big + trailer(len(big), _crc32c(big, _crc32c(keys[2]))))
    try:
        assert ia.set(keys[:2], payloads[:2]) == ["stored"] * 2
        wait_metric(a, "put_pages", 2)
        assert ib.exists(keys) == 2 and read_back(ib, keys[:2]) == payloads[:2]
        mb = b.metrics()
        assert mb["rejected_pages"] == 1 and mb["fill_failures"] == 0, mb
        assert "Traceback" not in b.tail()
    finally:
        holder.kill()
        ta.close()
        tb.close()


# What the uplink says at start about a bad command line, before it joins
# anything (issue: "the uplink explains itself").

@pytest.mark.parametrize("argv,what", [
    (["--segment", "64MB"], "MB is ambiguous"),
    (["--segment", "1.5GiB"], "non-negative integer"),
    (["--master", "localhost"], "want HOST:PORT"),
    (["--master", "localhost:"], "want HOST:PORT"),
    (["--master", "localhost:70000"], "want HOST:PORT"),
])
def test_a_bad_flag_is_refused_at_once_naming_it(built, device, capsys, argv, what):
    started = time.monotonic()
    assert up.main(["--tier", device, *argv]) == 2
    assert what in capsys.readouterr().err
    assert time.monotonic() - started < 10


def test_a_missing_tier_is_reported_before_the_cluster_is_asked(built, capsys):
    # The master's port is checked after the tier: nothing listens at port 1.
    assert up.main(["--tier", "shm:cxltier-nosuch-tier", "--master", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "cxltier-nosuch-tier" in err and "mooncake_master" not in err


def test_no_master_is_reported_within_seconds(built, device):
    """Where Mooncake is installed, a master that is not there is said at
    once, not after Mooncake's client has retried for a minute and more."""
    import socket

    py = ch.require_mooncake()
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    r = _run_uplink(built, "--tier", device, "--master", f"127.0.0.1:{port}", python=py)
    assert r.returncode == 2, r.stderr[-500:]
    assert f"no mooncake_master answers at 127.0.0.1:{port}" in r.stderr, r.stderr[-500:]
    assert time.monotonic() - started < 20


def test_help_shows_the_defaults(capsys):
    with pytest.raises(SystemExit) as e:
        up.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for shown in ("(default: tcp)", "(default: 1GiB)", "(default: 65536)", "(default: all)", "(default: 0.5)"):
        assert shown in out
    assert "(default: None)" not in out and "(default: )" not in out and "(default: False)" not in out


def test_the_daemon_check_of_an_uplink_that_stopped_says_nothing(device):
    """An uplink stopped within its first 2 s (no daemon answering yet)
    printed 'Exception in thread uplink-daemon-check ... ClosedError'."""
    from types import SimpleNamespace

    t = cxltier.Tier(device)
    stopping = threading.Timer(0.3, t.close)
    stopping.start()
    up._warn_without_daemon(SimpleNamespace(tier=t))  # raised ClosedError: tier detached
    stopping.join()
