package tier

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// SocketDirEnv overrides the directory of the tier's sockets.
const SocketDirEnv = "CXLTIER_SOCKET_DIR"

// DefaultDaxSocketDir holds the sockets of a DAX tier, whose device node
// sits in a /dev that containers do not share as a directory.
const DefaultDaxSocketDir = "/run/cxltier"

// sunPathMax is the room for a socket's path in sockaddr_un.
const sunPathMax = 107

// SocketPath is the Unix socket where node's daemon hears its clients.
// An anonymous tier has none (it lives in one process).
func (r *Region) SocketPath(node int) (string, error) {
	return r.SocketPathFor(fmt.Sprintf("node%d", node))
}

// SocketPathFor names a socket of the tier's own (role tells them apart:
// the daemon's, a node uplink's), in the directory every process that
// maps the tier shares: a path, not an abstract name, so that processes in
// other network namespaces (pods) reach it too.
func (r *Region) SocketPathFor(role string) (string, error) {
	b := r.devs[0].backing
	dir := os.Getenv(SocketDirEnv)
	switch {
	case dir != "":
	case b.Kind == BackingAnon:
		return "", fmt.Errorf("tier: an anonymous tier has no socket: %w", ErrInvalidConfig)
	case b.Kind == BackingDax:
		dir = DefaultDaxSocketDir
	default:
		dir = filepath.Dir(b.Path)
	}
	return filepath.Join(dir, fmt.Sprintf("cxltier-%s-%s.sock", hex.EncodeToString(r.l.UUID[:8]), role)), nil
}

// A socket's path must fit sockaddr_un (107 bytes and a NUL); a tier's
// directory can be deeper than that. Such a path is reached through an
// O_PATH descriptor of its directory, as /proc/self/fd/N/NAME, which the
// kernel resolves like any path: the socket lives where its path says.

// shortSocketPath returns a name for the socket at path that fits
// sockaddr_un, and a function that closes what it opened for that; the
// name is valid until then.
func shortSocketPath(path string) (string, func(), error) {
	if len(path) <= sunPathMax {
		return path, func() {}, nil
	}
	dir, name := filepath.Split(path)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", nil, fmt.Errorf("tier: socket directory %s: %w", dir, err)
	}
	short := fmt.Sprintf("/proc/self/fd/%d/%s", fd, name)
	if len(short) > sunPathMax {
		unix.Close(fd)
		return "", nil, fmt.Errorf("tier: socket name %s is too long even beside its directory's descriptor: %w", name, ErrInvalidConfig)
	}
	return short, func() { unix.Close(fd) }, nil
}

// DialUnix connects to the Unix socket at path (network "unix" or
// "unixpacket"), however long its path, within timeout.
func DialUnix(network, path string, timeout time.Duration) (*net.UnixConn, error) {
	if timeout <= 0 {
		return nil, fmt.Errorf("tier: dial %s: %w", path, os.ErrDeadlineExceeded)
	}
	short, done, err := shortSocketPath(path)
	if err != nil {
		return nil, err
	}
	defer done()
	c, err := net.DialTimeout(network, short, timeout)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// listenUnix binds a Unix socket at path, however long; the caller removes
// the socket file when it closes the listener.
func listenUnix(path string) (*net.UnixListener, error) {
	short, done, err := shortSocketPath(path)
	if err != nil {
		return nil, err
	}
	defer done()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: short, Net: "unix"})
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false) // by its real path, in close
	return ln, nil
}

// SocketFiles lists the tier's socket files that exist, with their lock
// files: what a daemon or uplink killed without closing left behind (one
// that closes removes its own). Destroying the tier removes them.
func (r *Region) SocketFiles() []string {
	probe, err := r.SocketPathFor("x")
	if err != nil {
		return nil
	}
	prefix := strings.TrimSuffix(probe, "x.sock")
	var out []string
	for _, pat := range []string{"*.sock", "*.sock.lock"} {
		found, _ := filepath.Glob(prefix + pat)
		for _, p := range found {
			if fi, err := os.Lstat(p); err == nil && (fi.Mode()&fs.ModeSocket != 0 || fi.Mode().IsRegular()) {
				out = append(out, p)
			}
		}
	}
	return out
}

// Anonymous reports whether the tier is private anonymous memory of this
// process: no other process maps it, and it has no sockets.
func (r *Region) Anonymous() bool { return r.devs[0].backing.Kind == BackingAnon }

// Replaced says why the tier this region maps is no longer the tier its
// backing paths name, "" while it still is: a backing file removed
// (destroyed), another file at its path (destroyed and formatted again),
// or another tier's header in the mapping itself (formatted again over the
// same file or device). A long-running process (the node's uplink) checks
// it, so that it does not serve a tier no other process uses.
func (r *Region) Replaced() string {
	if r.closed.Load() {
		return ""
	}
	for i, m := range r.devs {
		if m.backing.Kind == BackingAnon {
			continue
		}
		r.sync.refresh(m.data[:headerLen])
		l, err := decodeHeader(m.data)
		if err != nil {
			return fmt.Sprintf("the header of %s (device %d) no longer decodes: %v", m.backing, i, err)
		}
		if l.UUID != r.l.UUID {
			return fmt.Sprintf("%s (device %d) was formatted again (tier %x, was %x)", m.backing, i, l.UUID[:8], r.l.UUID[:8])
		}
		var st unix.Stat_t
		if err := unix.Stat(m.backing.Path, &st); errors.Is(err, unix.ENOENT) {
			return fmt.Sprintf("%s (device %d) was removed (the tier was destroyed)", m.backing, i)
		} else if err == nil && m.file.ino != 0 && !m.file.char && (st.Dev != m.file.dev || st.Ino != m.file.ino) {
			return fmt.Sprintf("%s (device %d) is another file now (the tier was destroyed and created again)", m.backing, i)
		}
	}
	return ""
}

// TrustedUID says whether a process of uid may serve this process's
// sockets (the daemon's, an uplink's): root, or this process's own user,
// who owns any tier it writes. Another user's socket at a path a tier's
// process dials is a squatter's.
func TrustedUID(uid uint32) bool { return uid == 0 || int(uid) == os.Geteuid() }

// CheckPeerUID reports an error unless the process at the other end of c
// runs as a TrustedUID, or with CXLTIER_SHARED_GROUP's group as its own
// (a non-root uplink of a shared tier: that group may write the tier
// anyway): the kernel's word (SO_PEERCRED), not the peer's.
func CheckPeerUID(c *net.UnixConn, what string) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return err
	}
	if cerr != nil {
		return fmt.Errorf("%s: credentials of the peer: %w", what, cerr)
	}
	if TrustedUID(cred.Uid) {
		return nil
	}
	if gid, ok, _ := sharedGroupID(); ok && int(cred.Gid) == gid {
		return nil
	}
	return fmt.Errorf("%s is held by uid %d gid %d, neither root, this process's uid %d nor %s's group (a squatter?): not trusted: %w",
		what, cred.Uid, cred.Gid, os.Geteuid(), SharedGroupEnv, ErrPermission)
}
