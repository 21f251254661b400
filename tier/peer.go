package tier

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A lease is the client's say-so: any process that can write the tier can
// write one naming any pid. So the daemon acts on a process (a signal) only
// when the kernel, not the tier, has told it who that process is. Each
// client connects to its node daemon's Unix socket and says which lease it
// holds; the daemon takes the peer's identity from the socket (a pidfd, or
// the pid the kernel gives, translated into the daemon's PID namespace),
// checks that this process is the one the lease describes (its pid and PID
// namespace as it sees them, its mapping of the tier), and keeps the pidfd.
// That proof is what lets the reaper end a client alive past its lease, and
// learn at once when a client in another PID namespace exits.
//
// The socket lives beside the tier's first backing file (every process
// that maps a file tier shares that directory), in /run/cxltier for a DAX
// tier, or in $CXLTIER_SOCKET_DIR; its name carries the tier's UUID and the
// node, so every process finds it from the tier alone, in any mount or
// network namespace that shares the directory.

const (
	peerHelloLen  = 48
	peerVersion   = 1
	peerReplyMax  = 255
	peerDialWait  = time.Second
	peerReplyWait = 2 * time.Second
	// peerRetry is how long a client whose registration was refused waits
	// before it tries again (a daemon log line each time).
	peerRetry = 30 * time.Second
	// peerBeat is the byte a registered client sends with each heartbeat;
	// peerBeatWait bounds the write.
	peerBeat     = 'b'
	peerBeatWait = 100 * time.Millisecond
)

var peerMagic = [8]byte{'C', 'X', 'L', 'T', 'P', 'E', 'E', 'R'}

// peerHello is what a client says of itself: the tier, its node and lease,
// and its pid and PID namespace as it sees them.
type peerHello struct {
	UUID                        [16]byte
	Node, Slot, Gen, PID, PIDNS uint32
}

func (h peerHello) encode() []byte {
	b := make([]byte, peerHelloLen)
	le := binary.LittleEndian
	copy(b, peerMagic[:])
	le.PutUint32(b[8:], peerVersion)
	le.PutUint32(b[12:], h.Node)
	le.PutUint32(b[16:], h.Slot)
	le.PutUint32(b[20:], h.Gen)
	le.PutUint32(b[24:], h.PID)
	le.PutUint32(b[28:], h.PIDNS)
	copy(b[32:48], h.UUID[:])
	return b
}

// decodePeerHello parses a client's message; it crosses a process
// boundary, so every field is checked by the caller against the tier.
func decodePeerHello(b []byte) (peerHello, error) {
	if len(b) != peerHelloLen {
		return peerHello{}, fmt.Errorf("message of %d bytes, want %d", len(b), peerHelloLen)
	}
	if !bytes.Equal(b[:8], peerMagic[:]) {
		return peerHello{}, fmt.Errorf("not a cxltier client's message")
	}
	le := binary.LittleEndian
	if v := le.Uint32(b[8:]); v != peerVersion {
		return peerHello{}, fmt.Errorf("message version %d, this daemon speaks %d", v, peerVersion)
	}
	h := peerHello{Node: le.Uint32(b[12:]), Slot: le.Uint32(b[16:]), Gen: le.Uint32(b[20:]),
		PID: le.Uint32(b[24:]), PIDNS: le.Uint32(b[28:])}
	copy(h.UUID[:], b[32:48])
	return h, nil
}

// peer is a client whose identity the kernel gave: the process behind its
// connection, held by a pidfd, which names that process and no other even
// after its pid is reused.
type peer struct {
	slot int
	gen  uint32
	pid  int // in the daemon's PID namespace
	fd   int // pidfd
	once sync.Once
	// beat is when the client last beat over its connection (unix ns;
	// registration counts as one): the process's own word, which no tier
	// writer can forge, unlike its lease's heartbeat.
	beat atomic.Int64
}

// beatsSince reports whether the client beat over its connection after t.
func (p *peer) beatsSince(t time.Time) bool { return p.beat.Load() > t.UnixNano() }

// exited reports whether the process has exited (its pidfd reads ready).
func (p *peer) exited() bool { return pidfdExited(p.fd) }

func (p *peer) close() { p.once.Do(func() { unix.Close(p.fd) }) }

// peerServer accepts clients' registrations for one node.
type peerServer struct {
	r    *Region
	node int
	path string
	ln   *net.UnixListener
	logf func(format string, args ...any)

	fresh chan struct{} // a token per connection not yet registered
	wg    sync.WaitGroup

	mu     sync.Mutex
	peers  map[int]*peer // by lease slot
	conns  map[*net.UnixConn]struct{}
	closed bool
}

// maxFreshPeers bounds the connections a daemon reads registrations from at
// once: a flood of connections that say nothing costs it no more.
const maxFreshPeers = 64

// listenPeers binds node's socket. A socket left by a daemon that died is
// replaced; one a daemon still serves, or anything that is not a socket,
// is refused.
func listenPeers(r *Region, node int, logf func(string, ...any)) (*peerServer, error) {
	path, err := r.SocketPath(node)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("tier: socket directory: %w", err)
	}
	if err := shareSocketDirectory(path); err != nil {
		return nil, err
	}
	squatter, err := clearStaleSocket(path)
	if err != nil {
		return nil, err
	}
	if squatter >= 0 {
		logf("removed a socket of uid %d at %s, neither root nor this daemon's user: a squatter's", squatter, path)
	}
	ln, err := listenUnix(path)
	if err != nil {
		return nil, fmt.Errorf("tier: listen for clients at %s: %w", path, err)
	}
	shareLikeTheTier(path, r.devs[0].backing)
	s := &peerServer{r: r, node: node, path: path, ln: ln, logf: logf,
		fresh: make(chan struct{}, maxFreshPeers), peers: map[int]*peer{}, conns: map[*net.UnixConn]struct{}{}}
	s.wg.Add(1)
	go s.serve()
	return s, nil
}

// clearStaleSocket makes way for the daemon's socket at path: a socket a
// dead daemon left is removed, and so is one another user put there (any
// user may bind a path in a shared directory such as /dev/shm while no
// daemon runs: a squatter, whose uid it returns, else -1). A daemon of a
// trusted user that answers there, or anything not a socket, is refused.
func clearStaleSocket(path string) (squatter int, err error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("tier: socket %s: %w", path, err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return -1, fmt.Errorf("tier: %s is in the way of the daemon's socket and is not a socket (%v): %w", path, fi.Mode().Type(), ErrExists)
	}
	squatter = -1
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && !TrustedUID(st.Uid) {
		squatter = int(st.Uid)
	} else if c, err := DialUnix("unix", path, peerDialWait); err == nil {
		c.Close()
		return -1, fmt.Errorf("tier: a daemon listens at %s already: %w", path, ErrExists)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		if squatter >= 0 {
			return squatter, fmt.Errorf("tier: a socket of uid %d (neither root nor this daemon's user) is in the way at %s and cannot be removed: %w", squatter, path, err)
		}
		return -1, fmt.Errorf("tier: remove the stale socket %s: %w", path, err)
	}
	return squatter, nil
}

// shareLikeTheTier gives the socket the tier file's group and read/write
// bits: whoever may open the tier may register with its daemon (connecting
// needs write permission on the socket). Best effort: a daemon that may not
// change them leaves its own.
func shareLikeTheTier(path string, b Backing) {
	var st unix.Stat_t
	if b.Path == "" || unix.Stat(b.Path, &st) != nil {
		return
	}
	_ = os.Chmod(path, os.FileMode(st.Mode&0o666))
	_ = os.Lchown(path, -1, int(st.Gid))
}

func (s *peerServer) serve() {
	defer s.wg.Done()
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.logf("client socket %s: accept: %v", s.path, err)
			time.Sleep(10 * time.Millisecond) // out of descriptors, say: not a spin
			continue
		}
		select {
		case s.fresh <- struct{}{}:
		default:
			conn.Close() // too many saying nothing yet
			continue
		}
		if !s.track(conn) {
			conn.Close()
			<-s.fresh
			return
		}
		s.wg.Add(1)
		go s.handle(conn)
	}
}

func (s *peerServer) track(conn *net.UnixConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[conn] = struct{}{}
	return true
}

// handle reads one registration, answers it, and holds a registered
// connection open until the client closes it (or exits).
func (s *peerServer) handle(conn *net.UnixConn) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.conns, conn)
		s.mu.Unlock()
		conn.Close()
	}()
	p, err := s.register(conn)
	<-s.fresh
	reply := []byte{0, 0}
	if err != nil {
		msg := err.Error()
		if len(msg) > peerReplyMax {
			msg = msg[:peerReplyMax]
		}
		reply = append([]byte{1, byte(len(msg))}, msg...)
		s.logf("client socket %s: registration refused: %v", s.path, err)
	}
	conn.SetWriteDeadline(time.Now().Add(peerReplyWait))
	if _, werr := conn.Write(reply); werr != nil || err != nil {
		if p != nil {
			s.drop(p)
		}
		return
	}
	conn.SetDeadline(time.Time{})
	// A registered client keeps the connection for its life and beats over
	// it; its end (EOF) needs nothing: the pidfd says whether the process
	// exited.
	buf := make([]byte, 64)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			p.beat.Store(time.Now().UnixNano())
		}
		if err != nil {
			return
		}
	}
}

// register reads a client's hello and proves it.
func (s *peerServer) register(conn *net.UnixConn) (*peer, error) {
	conn.SetReadDeadline(time.Now().Add(peerReplyWait))
	buf := make([]byte, peerHelloLen)
	if _, err := io.ReadFull(conn, buf); err != nil {
		return nil, fmt.Errorf("read the client's message: %w", err)
	}
	h, err := decodePeerHello(buf)
	if err != nil {
		return nil, err
	}
	fd, pid, err := peerProcess(conn)
	if err != nil {
		return nil, err
	}
	p := &peer{slot: int(h.Slot), gen: h.Gen, pid: pid, fd: fd}
	p.beat.Store(time.Now().UnixNano())
	if err := s.prove(p, h); err != nil {
		p.close()
		return nil, err
	}
	s.mu.Lock()
	old := s.peers[p.slot]
	s.peers[p.slot] = p
	s.mu.Unlock()
	if old != nil {
		old.close()
	}
	return p, nil
}

// prove checks that the process behind the connection is the one the lease
// describes. Every /proc read comes between the pidfd's opening and a check
// that the process it names still runs, so all of them were about it.
func (s *peerServer) prove(p *peer, h peerHello) error {
	r := s.r
	if h.UUID != r.l.UUID {
		return fmt.Errorf("the client speaks of another tier")
	}
	first := s.node * r.l.ClientsPerNode
	if int(h.Node) != s.node || int(h.Slot) < first || int(h.Slot) >= first+r.l.ClientsPerNode {
		return fmt.Errorf("slot %d of node %d is not this daemon's (node %d)", h.Slot, h.Node, s.node)
	}
	pids, err := nsPIDs(p.pid)
	if err != nil {
		return fmt.Errorf("process %d: %w", p.pid, err)
	}
	if own := pids[len(pids)-1]; own != int(h.PID) {
		return fmt.Errorf("process %d is pid %d in its namespace, and says %d", p.pid, own, h.PID)
	}
	ns, err := pidNamespace(strconv.Itoa(p.pid))
	if err != nil {
		return fmt.Errorf("process %d: %w (the daemon may inspect only processes it may trace)", p.pid, err)
	}
	if ns != h.PIDNS {
		return fmt.Errorf("process %d is in PID namespace %d, and says %d", p.pid, ns, h.PIDNS)
	}
	inf := r.readLease(p.slot)
	if inf.State != "live" || inf.Gen != h.Gen || inf.PID != int(h.PID) || inf.PIDNS != h.PIDNS || inf.Node != s.node {
		return fmt.Errorf("lease slot %d (%s, gen %d, pid %d, namespace %d) is not the one process %d describes",
			p.slot, inf.State, inf.Gen, inf.PID, inf.PIDNS, p.pid)
	}
	maps, err := r.mappedBy(p.pid)
	if err != nil {
		return fmt.Errorf("process %d: %w", p.pid, err)
	}
	if !maps {
		return fmt.Errorf("process %d does not map the tier", p.pid)
	}
	if p.exited() {
		return fmt.Errorf("process %d exited while it registered", p.pid)
	}
	return nil
}

// get returns the proof for a lease, nil if its process never gave one.
func (s *peerServer) get(slot int, gen uint32) *peer {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if p := s.peers[slot]; p != nil && p.gen == gen {
		return p
	}
	return nil
}

func (s *peerServer) drop(p *peer) {
	s.mu.Lock()
	if s.peers[p.slot] == p {
		delete(s.peers, p.slot)
	}
	s.mu.Unlock()
	p.close()
}

// prune drops the proofs of leases that ended (freed, or taken again).
func (s *peerServer) prune() {
	if s == nil {
		return
	}
	var gone []*peer
	s.mu.Lock()
	for slot, p := range s.peers {
		if inf := s.r.readLease(slot); inf.State == "free" || inf.Gen != p.gen {
			gone = append(gone, p)
			delete(s.peers, slot)
		}
	}
	s.mu.Unlock()
	for _, p := range gone {
		p.close()
	}
}

// close stops listening, ends every connection and drops every proof.
func (s *peerServer) close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.ln.Close()
	os.Remove(s.path)
	for c := range s.conns {
		c.Close()
	}
	peers := s.peers
	s.peers = map[int]*peer{}
	s.mu.Unlock()
	s.wg.Wait()
	for _, p := range peers {
		p.close()
	}
}

// peerProcess is the process at the other end of conn, as the kernel names
// it: a pidfd and its pid in this PID namespace. SO_PEERPIDFD (Linux 6.5)
// names the very process that connected; before it, the pid the kernel
// recorded at connect is opened as a pidfd, and the connection must still
// be open, so the process holding it has not exited.
func peerProcess(conn *net.UnixConn) (int, int, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return -1, 0, err
	}
	var fd, pid int
	var cerr error
	err = raw.Control(func(sock uintptr) {
		cred, err := unix.GetsockoptUcred(int(sock), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			cerr = fmt.Errorf("peer credentials: %w", err)
			return
		}
		if cred.Pid <= 0 {
			cerr = fmt.Errorf("the client's process is not visible in the daemon's PID namespace")
			return
		}
		pid = int(cred.Pid)
		fd, err = unix.GetsockoptInt(int(sock), unix.SOL_SOCKET, soPeerPidfd)
		if err == nil {
			return
		}
		if fd, err = unix.PidfdOpen(pid, 0); err != nil {
			cerr = fmt.Errorf("pidfd of process %d: %w", pid, err)
		}
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		return -1, 0, err
	}
	if got, ok := pidfdPid(fd); !ok || got != pid {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("process %d exited while it connected", pid)
	}
	return fd, pid, nil
}

// soPeerPidfd is SO_PEERPIDFD (include/uapi/asm-generic/socket.h), which
// golang.org/x/sys does not name yet; the same number on amd64 and arm64.
const soPeerPidfd = 77

// pidfdPid is the pid in this namespace of the process a pidfd names, from
// /proc/self/fdinfo; false once it has exited.
func pidfdPid(fd int) (int, bool) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	if err != nil {
		return 0, false
	}
	for _, line := range bytes.Split(raw, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("Pid:")); ok {
			n, err := strconv.Atoi(string(bytes.TrimSpace(v)))
			return n, err == nil && n > 0
		}
	}
	return 0, false
}

// pidfdExited reports whether the process a pidfd names has exited: its
// pidfd polls readable then.
func pidfdExited(fd int) bool {
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return n > 0
	}
}

// Proof is a client that proved to its daemon who it is.
type Proof struct {
	Slot int    `json:"slot"`
	Gen  uint32 `json:"gen"`
	// PID is the client's pid in the daemon's PID namespace (its lease
	// holds the one it has in its own).
	PID int `json:"pid_here"`
}

// Proofs lists the clients that proved who they are, by slot.
func (m *Manager) Proofs() []Proof {
	s := m.peers
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Proof, 0, len(s.peers))
	for _, p := range s.peers {
		out = append(out, Proof{Slot: p.slot, Gen: p.gen, PID: p.pid})
	}
	slices.SortFunc(out, func(a, b Proof) int { return a.Slot - b.Slot })
	return out
}
