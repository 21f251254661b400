package tier

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Clients in containers: each in its own PID and mount namespaces (the
// child remounts /proc, as a container does), sharing only the tier's
// backing directory with a daemon of the host.

const envMountProc = "CXLTIER_TEST_MOUNTPROC"

// enterChildNamespaces mounts a /proc of the child's own PID namespace, in
// a mount namespace of its own, as a container runtime does.
func enterChildNamespaces() error {
	if os.Getenv(envMountProc) == "" {
		return nil
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount /proc: %w", err)
	}
	return nil
}

// spawnContained starts a child client in new PID and mount namespaces;
// the test is skipped where namespaces cannot be made (not root).
func spawnContained(t *testing.T, r *Region, role string, extra ...string) *child {
	t.Helper()
	probe := exec.Command("/bin/true")
	probe.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	if err := probe.Run(); err != nil {
		t.Skipf("cannot make PID and mount namespaces here (needs root): %v", err)
	}
	k := spawnWith(t, r, role, 0, func(cmd *exec.Cmd) {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS
		cmd.Env = append(cmd.Env, envMountProc+"=1")
	}, extra...)
	return k
}

// childKeeper holds a chunk of its own for envIters milliseconds, checking
// all the while that it holds its own pattern, then says "done".
func childKeeper(c *Client, ms int) error {
	r := c.Region()
	off, err := c.AllocChunks(1)
	if err != nil {
		return err
	}
	pattern := bytes.Repeat([]byte{0xAA}, int(r.ChunkSize()))
	if err := r.WriteAt(pattern, off); err != nil {
		return err
	}
	fmt.Printf("ready %d %d\n", off, os.Getpid())
	got := make([]byte, len(pattern))
	for end := time.Now().Add(time.Duration(ms) * time.Millisecond); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if err := r.ReadAt(got, off); err != nil {
			return err
		}
		if n := countDiff(got, pattern); n > 0 {
			return fmt.Errorf("FOREIGN BYTES in my chunk: %d (first %#x)", n, got[bytes.IndexFunc(got, func(r rune) bool { return r != 0xAA })])
		}
		if err := c.Err(); err != nil {
			return fmt.Errorf("my lease: %w", err)
		}
	}
	fmt.Println("done")
	return nil
}

// TestContainedClientKeepsItsMemory: a client in its own PID namespace
// (pid 1 there, as in a container) beside a daemon of the host keeps its
// lease and its chunk for its whole run while a client of the host takes
// every chunk it can; once it exits, the daemon learns it from the kernel
// and reaps it. The daemon used to read its own /proc/1, judge the client
// gone and hand its chunk to the host client at the first pass.
func TestContainedClientKeepsItsMemory(t *testing.T) {
	for _, socket := range []bool{true, false} {
		t.Run(fmt.Sprintf("socket=%v", socket), func(t *testing.T) { containedKeeper(t, socket) })
	}
}

// containedKeeper runs TestContainedClientKeepsItsMemory with the daemon's
// client socket, or without it (the socket's directory not shared with the
// container): then the client is judged by heartbeat alone, as a client of
// another host, and reaped a lease timeout after it exits.
func containedKeeper(t *testing.T, socket bool) {
	g := testGeometry()
	g.LeaseTimeout = 300 * time.Millisecond
	r := formatTest(t, g)
	m := runManager(t, r, ManagerOptions{Node: 0, GrantLocks: true, NoClientSocket: !socket})
	k := spawnContained(t, r, "keeper", envIters+"=2500")
	var off Offset
	var innerPID int
	if line, err := k.out.ReadString('\n'); err != nil {
		t.Fatalf("keeper: %v", err)
	} else if _, err := fmt.Sscanf(line, "ready %d %d", &off, &innerPID); err != nil {
		t.Fatalf("keeper said %q", line)
	}
	if innerPID != 1 {
		t.Fatalf("the keeper is pid %d in its namespace, want 1", innerPID)
	}
	if socket {
		waitProven(t, m, innerPID)
	}
	host := attachTest(t, r, 0)
	fill := bytes.Repeat([]byte{0x55}, int(r.ChunkSize()))
	lines := make(chan string, 1)
	go func() { l, _ := k.out.ReadString('\n'); lines <- l }()
	var taken []Offset
	for done := false; !done; {
		for {
			got, err := host.AllocChunks(1)
			if err != nil {
				break
			}
			if err := r.WriteAt(fill, got); err != nil {
				t.Fatal(err)
			}
			taken = append(taken, got)
		}
		select {
		case l := <-lines:
			if l != "done\n" {
				t.Fatalf("keeper said %q", l)
			}
			done = true
		case <-time.After(20 * time.Millisecond):
		}
	}
	for _, o := range taken {
		if o == off {
			t.Fatalf("the host client was given the contained client's chunk %v while it ran", off)
		}
	}
	if err := k.cmd.Wait(); err != nil {
		t.Fatalf("the contained client: %v", err)
	}
	slot := -1
	for deadline := time.Now().Add(20 * g.LeaseTimeout); slot < 0; time.Sleep(10 * time.Millisecond) {
		for _, rp := range m.Reaped() {
			if rp.PID == innerPID {
				slot = rp.Slot
				want := "no heartbeat" // another PID namespace, never proven
				if socket {
					want = "exited" // the daemon holds its pidfd
				}
				if !strings.Contains(rp.Reason, want) {
					t.Fatalf("reaped for %q, want %q", rp.Reason, want)
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the contained client exited without closing its tier and was not reaped in %v", 20*g.LeaseTimeout)
		}
	}
}

// TestContainedWriterStoppedIsEnded: a contained writer stopped past its
// lease is ended by the host daemon through the pidfd its registration
// gave, before its chunk moves; resumed, it writes nothing into the next
// owner's chunk.
func TestContainedWriterStoppedIsEnded(t *testing.T) {
	g := testGeometry()
	g.LeaseTimeout = 300 * time.Millisecond
	r := formatTest(t, g)
	m := runManager(t, r, ManagerOptions{Node: 0, GrantLocks: true})
	k := spawnContained(t, r, "rawwriter")
	var off Offset
	if line, err := k.out.ReadString('\n'); err != nil {
		t.Fatal(err)
	} else if _, err := fmt.Sscanf(line, "ready %d", &off); err != nil {
		t.Fatalf("writer said %q", line)
	}
	waitProven(t, m, 1)
	if err := k.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer k.cmd.Process.Signal(syscall.SIGCONT)
	exited := make(chan error, 1)
	go func() { exited <- k.cmd.Wait() }()
	var waitErr error
	select {
	case waitErr = <-exited:
	case <-time.After(30 * g.LeaseTimeout):
		t.Fatal("the stopped contained writer was not ended")
	}
	if waitErr == nil || !strings.Contains(waitErr.Error(), "killed") {
		t.Fatalf("the stopped writer: %v, want killed", waitErr)
	}
	waitReaped(t, r, 1, 30*g.LeaseTimeout)
	allocUntil(t, attachTest(t, r, 0), off)
}

// forgeLease writes a live lease into a free slot, as any process that can
// write the tier can: naming pid (started at start) in namespace ns, with
// a heartbeat that never moves.
func forgeLease(t *testing.T, r *Region, pid int, start uint64, ns uint32) int {
	t.Helper()
	for s := 0; s < r.l.ClientsPerNode; s++ {
		line := r.leaseLine(s)
		if !atomic.CompareAndSwapUint32(u32At(line, 0), leaseFree, leaseLive) {
			continue
		}
		atomic.AddUint32(u32At(line, 4), 1)
		atomic.StoreUint32(u32At(line, 8), uint32(pid))
		atomic.StoreUint64(u64At(line, 16), 1)
		atomic.StoreUint64(u64At(line, 24), uint64(time.Now().UnixNano()))
		atomic.StoreUint64(u64At(line, leaseStartAt), start)
		atomic.StoreUint32(u32At(line, leasePIDNSAt), ns)
		copy(line[leaseNameAt:leaseNameAt+leaseNameLen], "forged")
		return s
	}
	t.Fatal("no free slot to forge a lease in")
	return -1
}

func startOf(t *testing.T, pid int) uint64 {
	t.Helper()
	start, ok := procStartTime(strconv.Itoa(pid))
	if !ok {
		t.Fatalf("no start time for pid %d", pid)
	}
	return start
}

// TestForgedLeaseKillsNothing: leases written by hand, naming a process
// that does not map the tier, a real client of the tier (which holds a
// lease of its own), and a pid of another PID namespace, and never
// heartbeating, make the reaper signal nobody, pass after pass and when an
// operator asks for the reap. The reaper used to SIGKILL whatever a
// same-host lease named once its heartbeat was stale.
func TestForgedLeaseKillsNothing(t *testing.T) {
	g, r, m := reaperTest(t)
	bystander := exec.Command(os.Args[0], "-test.run=^$")
	bystander.Env = append(os.Environ(), envRole+"=idle")
	bystander.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bystander.Process.Kill(); bystander.Wait() })
	client, _ := provenWriter(t, r, m)
	victims := map[string]*exec.Cmd{"a process that does not map the tier": bystander, "a client of the tier": client.cmd}
	slots := map[int]string{}
	starts := map[int]uint64{}
	for what, cmd := range victims {
		pid := cmd.Process.Pid
		starts[pid] = startOf(t, pid)
		slots[forgeLease(t, r, pid, starts[pid], r.pidns)] = what
	}
	other := forgeLease(t, r, bystander.Process.Pid, startOf(t, bystander.Process.Pid), r.pidns+1)
	slots[other] = "a pid of another PID namespace"
	var reaped []Reaped
	for range 6 {
		reaped = append(reaped, m.ReapOnce()...)
		time.Sleep(g.LeaseTimeout / 2)
	}
	for slot, what := range slots {
		if inf := r.readLease(slot); inf.State == "live" && what != "a client of the tier" {
			t.Errorf("the forged lease naming %s (slot %d) was not reaped", what, slot)
		}
	}
	for slot, what := range slots {
		if what == "a client of the tier" {
			if _, err := m.Reap(slot, "an operator's POST /v1/reap"); err == nil {
				t.Errorf("an operator's reap of the forged lease naming %s went ahead", what)
			}
		}
	}
	for what, cmd := range victims {
		// Not Signal(0): a killed child not yet waited for is a zombie,
		// which takes signals.
		if pid := cmd.Process.Pid; !processAlive(pid, starts[pid]) {
			t.Errorf("%s named by a forged lease was killed", what)
		}
	}
	if m.Stats().Quarantined == 0 {
		t.Error("the forged lease naming a real client was not counted as quarantined")
	}
	found := false
	for _, rp := range reaped {
		if slots[rp.Slot] == "a process that does not map the tier" {
			found = strings.Contains(rp.Reason, "does not map the tier")
		}
	}
	if !found {
		t.Errorf("reaped %+v: want the non-client's forged lease reaped as not mapping the tier", reaped)
	}
}

// TestRegistrationNamesTheKernelsProcess: over the client socket, a
// process can prove only itself. Claiming a real client's lease, a lease
// of another tier, or a lease that is not there is refused.
func TestRegistrationNamesTheKernelsProcess(t *testing.T) {
	_, r, m := reaperTest(t)
	k, _ := provenWriter(t, r, m)
	var theirs LeaseInfo
	for _, l := range r.Leases() {
		if l.PID == k.cmd.Process.Pid {
			theirs = l
		}
	}
	claim := peerHello{UUID: r.l.UUID, Slot: uint32(theirs.Slot), Gen: theirs.Gen, PID: uint32(theirs.PID), PIDNS: theirs.PIDNS}
	otherTier := claim
	otherTier.UUID[0] ^= 1
	for name, tc := range map[string]struct {
		msg  []byte
		want string
	}{
		"another client's lease": {claim.encode(), "and says"},
		"another tier":           {otherTier.encode(), "another tier"},
		"a short message":        {claim.encode()[:20], "read the client's message"},
		"not a hello":            {bytes.Repeat([]byte{'x'}, peerHelloLen), "not a cxltier client's message"},
	} {
		t.Run(name, func(t *testing.T) {
			reply := sayToDaemon(t, m.SocketPath(), tc.msg)
			if !strings.Contains(reply, tc.want) {
				t.Fatalf("the daemon answered %q, want a refusal saying %q", reply, tc.want)
			}
		})
	}
	if p := m.peers.get(theirs.Slot, theirs.Gen); p == nil || p.pid != k.cmd.Process.Pid {
		t.Fatalf("the real client's proof was replaced: %+v", p)
	}
}

// sayToDaemon sends msg and returns the daemon's answer as text.
func sayToDaemon(t *testing.T, path string, msg []byte) string {
	t.Helper()
	conn, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write(msg); err != nil {
		t.Fatal(err)
	}
	if len(msg) < peerHelloLen {
		conn.(*net.UnixConn).CloseWrite()
	}
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	reply, err := io.ReadAll(conn)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	if len(reply) < 2 || reply[0] == 0 {
		return "accepted"
	}
	return string(reply[2:])
}

func TestParseNSpid(t *testing.T) {
	for _, tc := range []struct {
		status string
		want   []int
	}{
		{"Name:\tx\nNSpid:\t4242\t17\t1\nNSsid:\t1\n", []int{4242, 17, 1}},
		{"NSpid:\t9\n", []int{9}},
		{"NSpid:\t\n", nil},
		{"NSpid:\t9 x\n", nil},
		{"NSpid:\t-3\n", nil},
		{"Name:\tx\n", nil},
	} {
		got, err := parseNSpid([]byte(tc.status))
		if fmt.Sprint(got) != fmt.Sprint(tc.want) || (err == nil) != (tc.want != nil) {
			t.Errorf("%q: got %v, %v; want %v", tc.status, got, err, tc.want)
		}
	}
}

func FuzzPeerHello(f *testing.F) {
	f.Add(peerHello{Node: 1, Slot: 70, Gen: 3, PID: 1, PIDNS: 4026531836}.encode())
	f.Add([]byte("CXLTPEER"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodePeerHello(b)
		if err != nil {
			return
		}
		if !bytes.Equal(h.encode(), b) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", b, h, h.encode())
		}
	})
}

// TestSocketsInADeepDirectory: a tier whose directory is deeper than a
// socket address holds (107 bytes) still has its daemon's socket, and its
// clients register there; attach used to fail on such a tier.
func TestSocketsInADeepDirectory(t *testing.T) {
	dir := t.TempDir()
	for len(dir) < 150 {
		dir = filepath.Join(dir, "a-directory-of-some-depth")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, _ := ParseBacking("file:" + filepath.Join(dir, "tier"))
	r := formatTest(t, testGeometry(), b)
	m := runManager(t, r, ManagerOptions{Node: 0})
	path := m.SocketPath()
	if len(path) <= sunPathMax {
		t.Fatalf("socket path %s is short: the test tests nothing", path)
	}
	if fi, err := os.Lstat(path); err != nil || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("no socket at %s: %v", path, err)
	}
	c := attachTest(t, r, 0)
	for deadline := time.Now().Add(10 * time.Second); !c.Registered(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the client did not register at %s: %s", path, c.RegisterError())
		}
	}
	m.Close()
	if _, err := os.Lstat(path); err == nil {
		t.Fatalf("the socket %s outlived its daemon", path)
	}
}

// TestAKillThatDoesNotEndInTimeQuarantines: a proven client whose process
// has not exited within the wait after its SIGKILL (here a wait too short
// for any exit) keeps its lease and its memory for that pass, counted as
// quarantined; the next pass finds it gone and reaps it. (Every other
// test stubs the stop: a stop that took the timeout for an end would hand
// on the memory of a process that may still run.)
func TestAKillThatDoesNotEndInTimeQuarantines(t *testing.T) {
	g, r, m := reaperTest(t)
	m.stop = func(p *peer, _ time.Duration) error { return stopPeer(p, time.Nanosecond) }
	k, _ := stalledWriter(t, r, m)
	used := r.Usage().UsedChunks
	var reaped []Reaped
	for deadline := time.Now().Add(20 * g.LeaseTimeout); m.Stats().Quarantined == 0; time.Sleep(g.LeaseTimeout / 4) {
		if time.Now().After(deadline) {
			t.Fatal("the stalled client was never judged")
		}
		reaped = append(reaped, m.ReapOnce()...)
	}
	if len(reaped) != 0 || r.Usage().UsedChunks != used {
		t.Fatalf("reaped %+v and chunks %d -> %d in the pass whose kill had not ended the process", reaped, used, r.Usage().UsedChunks)
	}
	k.cmd.Wait() // the SIGKILL went out: the process ends
	if reaped := m.ReapOnce(); len(reaped) != 1 || !strings.Contains(reaped[0].Reason, "exited") {
		t.Fatalf("the next pass: %+v, want it reaped as exited", reaped)
	}
}

// TestContainedClientStoppedAcrossADaemonRestart (issue 64, defect 1): a
// client in its own PID namespace, proven to one daemon, stopped while the
// daemon restarts. The new daemon never saw it prove itself and its
// heartbeat has stopped: it used to reap it on that alone and hand its
// chunk to a host client (foreign bytes in both). Now it finds the process
// through its namespace, alive and mapping the tier, and quarantines it;
// resumed, it keeps its chunk and lease to the end. Killed instead, it is
// proven gone the same way and reaped. A daemon that cannot see the
// client's namespace (a container without hostPID) never frees it on a
// heartbeat: only an operator's reap does.
func TestContainedClientStoppedAcrossADaemonRestart(t *testing.T) {
	for _, tc := range []struct {
		name    string
		then    string // "resume" or "kill"
		seesAll bool
	}{{"resumed", "resume", true}, {"killed", "kill", true}, {"killed, namespace not visible", "kill", false}} {
		t.Run(tc.name, func(t *testing.T) {
			g := testGeometry()
			g.LeaseTimeout = 300 * time.Millisecond
			r := formatTest(t, g)
			first, err := NewManager(r, ManagerOptions{Node: 0})
			if err != nil {
				t.Fatal(err)
			}
			k := spawnContained(t, r, "keeper", envIters+"=6000")
			var off Offset
			var innerPID int
			if line, err := k.out.ReadString('\n'); err != nil {
				t.Fatalf("keeper: %v", err)
			} else if _, err := fmt.Sscanf(line, "ready %d %d", &off, &innerPID); err != nil {
				t.Fatalf("keeper said %q", line)
			}
			waitProven(t, first, innerPID)
			if err := k.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			defer k.cmd.Process.Signal(syscall.SIGCONT)
			if err := first.Close(); err != nil {
				t.Fatal(err)
			}
			if tc.then == "kill" && !tc.seesAll {
				k.cmd.Process.Kill() // gone before the new daemon looks: it cannot prove so
				k.cmd.Wait()
			}
			m, err := NewManager(r, ManagerOptions{Node: 0})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { m.Close() })
			m.seesAllPIDs = tc.seesAll
			reapFor := func(d time.Duration) []Reaped {
				var got []Reaped
				for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(g.LeaseTimeout / 4) {
					got = append(got, m.ReapOnce()...)
				}
				return got
			}
			if got := reapFor(5 * g.LeaseTimeout); len(got) != 0 {
				t.Fatalf("reaped %+v: the stopped client is alive (or not provably gone)", got)
			}
			if m.Stats().Quarantined == 0 {
				t.Fatal("the stopped client's lease ran out and it was not quarantined")
			}
			host := attachTest(t, r, 0)
			for {
				got, err := host.AllocChunks(1)
				if err != nil {
					break
				}
				if got == off {
					t.Fatalf("the host client was given the stopped client's chunk %v", off)
				}
			}
			slot := -1
			for _, l := range r.Leases() {
				if l.PID == innerPID && l.State == "live" {
					slot = l.Slot
				}
			}
			if slot < 0 {
				t.Fatal("the stopped client's lease is gone")
			}
			switch {
			case tc.then == "resume":
				k.cmd.Process.Signal(syscall.SIGCONT)
				if line, err := k.out.ReadString('\n'); err != nil || line != "done\n" {
					t.Fatalf("the resumed client said %q (%v): %s", line, err, k.err)
				}
				if err := k.cmd.Wait(); err != nil {
					t.Fatalf("the resumed client: %v: %s", err, k.err)
				}
			case tc.seesAll:
				k.cmd.Process.Kill()
				k.cmd.Wait()
				got := reapFor(2 * g.LeaseTimeout)
				if len(got) != 1 || got[0].Slot != slot || !strings.Contains(got[0].Reason, "no process is pid 1 of PID namespace") {
					t.Fatalf("reaped %+v, want slot %d as no process of its namespace", got, slot)
				}
			default:
				if _, err := m.Reap(slot, "operator"); err != nil {
					t.Fatalf("an operator's reap of a client this daemon cannot look up: %v", err)
				}
			}
		})
	}
}

// TestFindInNamespace: a contained process is found by its pid in its own
// namespace, and once it exited it is not, nor is a pid its namespace
// never had, nor one started at another time.
func TestFindInNamespace(t *testing.T) {
	g := testGeometry()
	r := formatTest(t, g)
	k := spawnContained(t, r, "keeper", envIters+"=30000")
	if _, err := k.out.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	host := k.cmd.Process.Pid
	ns, err := pidNamespace(strconv.Itoa(host))
	if err != nil {
		t.Fatal(err)
	}
	start := startOf(t, host)
	for _, tc := range []struct {
		pid      int
		start    uint64
		wantHost int
	}{{1, start, host}, {1, 0, host}, {1, start + 1, 0}, {2, start, 0}} {
		got, seen, err := findInNamespace(ns, tc.pid, tc.start)
		if err != nil || got != tc.wantHost || !seen {
			t.Errorf("pid %d started at %d: host %d, seen %v, %v; want %d, seen", tc.pid, tc.start, got, seen, err, tc.wantHost)
		}
	}
	k.cmd.Process.Kill()
	k.cmd.Wait()
	if got, seen, err := findInNamespace(ns, 1, start); err != nil || got != 0 || seen {
		t.Errorf("after it exited: host %d, seen %v, %v; want none", got, seen, err)
	}
}

// TestADaemonStartsOnATableOfGoneClients (issue 64, defect 6): every slot
// of the node held by clients that are gone (one killed holding a chunk,
// a lease naming pid 0, a lease of a process that exited): the daemon
// could not start ("all slots taken"), nor could repair, which needs a
// slot too. Now the daemon takes over the first gone client's slot,
// reclaiming its chunk first, and its passes reap the others; the pid 0
// lease is reaped as forged, not quarantined. A table of live
// clients still refuses it, saying so.
func TestADaemonStartsOnATableOfGoneClients(t *testing.T) {
	g := testGeometry()
	g.ClientsPerNode = 3
	g.LeaseTimeout = 300 * time.Millisecond
	r := formatTest(t, g)
	k := spawn(t, r, "keeper", 0, envIters+"=60000")
	if line, err := k.out.ReadString('\n'); err != nil || !strings.HasPrefix(line, "ready ") {
		t.Fatalf("keeper said %q: %v", line, err)
	}
	k.cmd.Process.Kill()
	k.cmd.Wait()
	zero := forgeLease(t, r, 0, 0, r.pidns)
	atomic.StoreUint64(u64At(r.leaseLine(zero), 24), uint64(time.Now().Add(-time.Hour).UnixNano())) // long silent
	gone := exec.Command("sleep", "30")
	if err := gone.Start(); err != nil {
		t.Fatal(err)
	}
	start := startOf(t, gone.Process.Pid)
	gone.Process.Kill()
	gone.Wait()
	forgeLease(t, r, gone.Process.Pid, start, r.pidns)
	used := r.Usage().UsedChunks
	if _, err := r.Attach(ClientOptions{}); !errors.Is(err, ErrLeaseTable) {
		t.Fatalf("attach on a full table: %v", err)
	}
	m, err := NewManager(r, ManagerOptions{Node: 0})
	if err != nil {
		t.Fatalf("a daemon on a table of gone clients: %v", err)
	}
	defer m.Close()
	if rs := m.Reaped(); len(rs) != 1 || rs[0].PID != k.cmd.Process.Pid || rs[0].Chunks != 1 || r.Usage().UsedChunks != used-1 {
		t.Fatalf("taking over the killed client's slot reaped %+v (chunks used %d, were %d)", rs, r.Usage().UsedChunks, used)
	}
	got := map[int]string{}
	for end := time.Now().Add(20 * g.LeaseTimeout); len(got) < 2 && time.Now().Before(end); time.Sleep(g.LeaseTimeout / 4) {
		for _, rp := range m.ReapOnce() {
			got[rp.PID] = rp.Reason
		}
	}
	if !strings.Contains(got[0], "pid 0") || !strings.Contains(got[gone.Process.Pid], "exited") || len(got) != 2 {
		t.Fatalf("the passes reaped %v, want the pid 0 lease and the exited process's", got)
	}
	if ls := r.Leases(); len(ls) != 1 || !ls[0].Daemon {
		t.Fatalf("leases after the pass: %+v", ls)
	}
	m.Close()

	live := formatTest(t, func() Geometry { g := testGeometry(); g.ClientsPerNode = 2; return g }())
	attachTest(t, live, 0)
	attachTest(t, live, 0)
	if _, err := NewManager(live, ManagerOptions{Node: 0}); err == nil || !strings.Contains(err.Error(), "no slot's client is proven gone") {
		t.Fatalf("a daemon on a table of live clients: %v", err)
	}
}

// childSquatter binds a socket at path, says so, and answers whatever
// connects with a daemon's "registered" bytes, saying how many bytes it
// heard first.
func childSquatter(path string) error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	fmt.Println("listening")
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		conn.SetReadDeadline(time.Now().Add(time.Second))
		buf := make([]byte, peerHelloLen)
		n, _ := io.ReadFull(conn, buf)
		conn.Write([]byte{0, 0})
		fmt.Printf("heard %d\n", n)
		conn.Close()
	}
}

// TestASquattersSocketIsNeitherTrustedNorKept (issue 64, defect 5):
// another user binds the daemon's socket path while no daemon runs. A
// client used to send it its hello and take its answer for a daemon's; it
// now checks the peer's credentials first and says nothing to it. The
// daemon used to refuse to start ("a daemon listens there"); it now
// removes the squatter's socket, says so, and serves its clients.
func TestASquattersSocketIsNeitherTrustedNorKept(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process as another user")
	}
	g := testGeometry()
	r := formatTest(t, g)
	path, err := r.SocketPath(0)
	if err != nil {
		t.Fatal(err)
	}
	exe := copyForAnyUser(t)
	sq := spawnWith(t, r, "squatter", 0, func(cmd *exec.Cmd) {
		cmd.Path, cmd.Args[0] = exe, exe
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 65534, Gid: 65534}
	}, envOffset+"="+path)
	if line, err := sq.out.ReadString('\n'); err != nil || line != "listening\n" {
		t.Skipf("the squatter (uid 65534) could not bind %s: %q %v %s", path, line, err, sq.err)
	}
	heard := make(chan string, 8)
	go func() {
		for {
			l, err := sq.out.ReadString('\n')
			if err != nil {
				return
			}
			heard <- l
		}
	}()
	c := attachTest(t, r, 0)
	deadline := time.Now().Add(5 * time.Second)
	for c.RegisterError() == "" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if c.Registered() || !strings.Contains(c.RegisterError(), "squatter") {
		t.Fatalf("a client of a squatted socket: registered %v, %q", c.Registered(), c.RegisterError())
	}
	select {
	case l := <-heard:
		if l != "heard 0\n" {
			t.Fatalf("the squatter %s of the client's hello", strings.TrimSpace(l))
		}
	case <-time.After(2 * time.Second):
	}
	var logged []string
	m, err := NewManager(r, ManagerOptions{Node: 0, Logf: func(f string, a ...any) { logged = append(logged, fmt.Sprintf(f, a...)) }})
	if err != nil {
		t.Fatalf("a daemon on a squatted socket path: %v", err)
	}
	defer m.Close()
	if !strings.Contains(strings.Join(logged, "\n"), "squatter") {
		t.Errorf("the daemon did not say it removed a squatter's socket: %q", logged)
	}
	k, _ := provenWriter(t, r, m) // a new client proves itself to the daemon
	k.cmd.Process.Kill()
}

// copyForAnyUser copies this test binary where any user may run it (the
// build directory is its builder's alone).
func copyForAnyUser(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cxltier-anyuser-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	exe := filepath.Join(dir, "tier.test")
	if err := os.WriteFile(exe, self, 0o755); err != nil {
		t.Fatal(err)
	}
	return exe
}
