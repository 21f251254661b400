package cluster

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cxltier/cxltier/internal/errkind"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

// Address is the socket path of the uplink that serves node node of tier
// r, beside the tier's own sockets (tier.Region.SocketPathFor): a path in
// the directory the node's processes share, which a process in another
// network namespace (a pod) reaches as well as one of the host. (An
// abstract name is per network namespace: a pod never found its node's
// uplink, and every cluster page was silently a local miss.)
func Address(r *tier.Region, node int) (string, error) {
	return r.SocketPathFor(fmt.Sprintf("uplink-node%d", node))
}

// Options tune a Link; zero values take the defaults.
type Options struct {
	// Timeout bounds one fill, from dialing to the reply (default 1 s):
	// past it the keys stay local misses.
	Timeout time.Duration
	// Retry is how long an uplink that could not be reached counts as
	// absent before the next call tries again (default 250 ms), so that a
	// node without one pays a clock read per miss, not a dial.
	Retry time.Duration
}

func (o Options) withDefaults() Options {
	if o.Timeout <= 0 {
		o.Timeout = time.Second
	}
	if o.Retry <= 0 {
		o.Retry = 250 * time.Millisecond
	}
	return o
}

// Stats counts what a Link did, for this process.
type Stats struct {
	Fills        uint64 `json:"fills"`                // fill requests answered
	FillFailures uint64 `json:"fill_failures"`        // fills that failed or timed out (the keys stayed misses)
	Filled       uint64 `json:"filled"`               // keys the uplink brought in for this process
	Notices      uint64 `json:"notices"`              // keys handed to the uplink to write behind
	Dropped      uint64 `json:"dropped"`              // keys not handed over: the uplink's socket was full or gone
	LastError    string `json:"last_error,omitempty"` // why the last failed fill failed (an uplink not trusted, say)
}

// Link is one process's connection to its node's uplink. Its methods are
// safe for concurrent use and never block past Options.Timeout.
type Link struct {
	addr string
	opts Options

	absentUntil atomic.Int64 // unix nanoseconds: no dial before

	mu     sync.Mutex
	notice *net.UnixConn // the connection notices go on, opened on first use
	idle   []*net.UnixConn

	fills, fillFailures, filled, notices, dropped atomic.Uint64

	lastError atomic.Pointer[string]
}

// NewLink is a link to the uplink at addr (Address), which need not be
// running yet: each call finds it or not.
func NewLink(addr string, opts Options) *Link {
	return &Link{addr: addr, opts: opts.withDefaults()}
}

// Stats is what the link did so far.
func (l *Link) Stats() Stats {
	st := Stats{Fills: l.fills.Load(), FillFailures: l.fillFailures.Load(), Filled: l.filled.Load(),
		Notices: l.notices.Load(), Dropped: l.dropped.Load()}
	if e := l.lastError.Load(); e != nil {
		st.LastError = *e
	}
	return st
}

// Close drops the link's connections.
func (l *Link) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	var err error
	if l.notice != nil {
		err = l.notice.Close()
		l.notice = nil
	}
	for _, c := range l.idle {
		err = errors.Join(err, c.Close())
	}
	l.idle = nil
	return err
}

// absent reports whether the uplink was missing a moment ago.
func (l *Link) absent() bool { return time.Now().UnixNano() < l.absentUntil.Load() }

func (l *Link) markAbsent() { l.absentUntil.Store(time.Now().Add(l.opts.Retry).UnixNano()) }

// dial connects to the uplink and checks that it runs as this user (or
// root): whoever may write the socket directory can bind the path while no
// uplink holds it.
func (l *Link) dial(deadline time.Time) (*net.UnixConn, error) {
	uc, err := tier.DialUnix("unixpacket", l.addr, time.Until(deadline))
	if err != nil {
		return nil, err
	}
	if err := checkPeer(uc); err != nil {
		uc.Close()
		return nil, err
	}
	return uc, nil
}

func checkPeer(c *net.UnixConn) error {
	return tier.CheckPeerUID(c, fmt.Sprintf("cluster: uplink socket %s", c.RemoteAddr()))
}

// take is an idle fill connection, or a new one.
func (l *Link) take(deadline time.Time) (*net.UnixConn, error) {
	l.mu.Lock()
	if n := len(l.idle); n > 0 {
		c := l.idle[n-1]
		l.idle = l.idle[:n-1]
		l.mu.Unlock()
		return c, nil
	}
	l.mu.Unlock()
	return l.dial(deadline)
}

// keep returns a fill connection that finished its exchange cleanly.
func (l *Link) keep(c *net.UnixConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.idle) < 4 {
		l.idle = append(l.idle, c)
		return
	}
	c.Close()
}

// ErrFillFailed is an uplink's answer that its fill failed (the cluster
// did not answer, a transfer broke). The pages it published before the
// failure are in the local index all the same, and Fill counts them.
var ErrFillFailed = errkind.New(errkind.Other, "the uplink could not fill")

// Fill asks the uplink to bring keys of index into the local index from
// the cluster, in order, and waits at most Options.Timeout. It returns how
// many leading keys the uplink reports present now, also when the uplink
// reports that its fill failed part-way (ErrFillFailed: the pages before
// the failure were published); on any other failure 0 and the reason.
// Keys past MaxFillKeys are not asked for.
func (l *Link) Fill(index string, keys []prefix.Key) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	if l.absent() {
		return 0, errAbsent
	}
	keys = keys[:min(len(keys), MaxFillKeys)]
	msg, err := (&Request{Op: OpFill, Index: index, Keys: keys}).AppendBinary(nil)
	if err != nil {
		return 0, err
	}
	n, err := l.exchange(msg, len(keys))
	if err != nil {
		// A fill's caller sees only misses: the reason is kept for stats,
		// where a misconfiguration (an uplink of a group not named) shows.
		l.fillFailures.Add(1)
		why := err.Error()
		l.lastError.Store(&why)
	} else {
		l.fills.Add(1)
	}
	l.filled.Add(uint64(n))
	return n, err
}

var errAbsent = errors.New("cluster: no uplink serves this tier")

// exchange sends one fill and reads its reply within the timeout. A stale
// pooled connection (the uplink restarted) is retried once on a new one.
func (l *Link) exchange(msg []byte, asked int) (int, error) {
	deadline := time.Now().Add(l.opts.Timeout)
	for attempt := 0; ; attempt++ {
		c, err := l.take(deadline)
		if err != nil {
			if refused(err) {
				l.markAbsent()
				return 0, errAbsent
			}
			return 0, fmt.Errorf("cluster: dial uplink: %w", err)
		}
		n, err := roundTrip(c, msg, asked, deadline)
		if err == nil || errors.Is(err, ErrFillFailed) { // a reply: the connection is sound
			l.keep(c)
			return n, err
		}
		c.Close()
		if attempt > 0 || !staleConn(err) {
			return 0, err
		}
	}
}

func roundTrip(c *net.UnixConn, msg []byte, asked int, deadline time.Time) (int, error) {
	if err := c.SetDeadline(deadline); err != nil {
		return 0, err
	}
	if _, err := c.Write(msg); err != nil {
		return 0, fmt.Errorf("cluster: send fill: %w", err)
	}
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil {
		return 0, fmt.Errorf("cluster: fill reply: %w", err)
	}
	r, err := ParseReply(buf[:n], asked)
	if err != nil {
		return 0, err
	}
	if r.Failed {
		return int(r.Filled), fmt.Errorf("cluster: %w (%d of %d present)", ErrFillFailed, r.Filled, asked)
	}
	return int(r.Filled), nil
}

func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// staleConn: the peer of a pooled connection went away (an uplink that
// restarted), which a fresh connection may not see.
func staleConn(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, io.EOF)
}

// Stored hands keys of index, just stored in the local index, to the
// uplink to write behind. It never blocks: when the uplink's socket is
// full, or there is no uplink, the keys are dropped and counted.
func (l *Link) Stored(index string, keys []prefix.Key) {
	for len(keys) > 0 {
		part := keys[:min(len(keys), MaxNoticeKey)]
		keys = keys[len(part):]
		if !l.notify(index, part) {
			l.dropped.Add(uint64(len(part)))
			continue
		}
		l.notices.Add(uint64(len(part)))
	}
}

func (l *Link) notify(index string, keys []prefix.Key) bool {
	if l.absent() {
		return false
	}
	msg, err := (&Request{Op: OpStored, Index: index, Keys: keys}).AppendBinary(nil)
	if err != nil {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for attempt := 0; attempt < 2; attempt++ {
		if l.notice == nil {
			c, err := l.dial(time.Now().Add(l.opts.Timeout))
			if err != nil {
				if refused(err) {
					l.markAbsent()
				}
				return false
			}
			l.notice = c
		}
		switch err := sendNow(l.notice, msg); {
		case err == nil:
			return true
		case errors.Is(err, syscall.EAGAIN):
			return false // the uplink is behind: drop, never wait
		default: // the uplink went away: one try on a new connection
			l.notice.Close()
			l.notice = nil
		}
	}
	return false
}

// sendNow writes msg as one packet or fails with EAGAIN, never waiting.
func sendNow(c *net.UnixConn, msg []byte) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	err = raw.Write(func(fd uintptr) bool {
		// MSG_NOSIGNAL: a host program that does not ignore SIGPIPE is not
		// killed by an uplink that went away.
		_, werr = unix.SendmsgN(int(fd), msg, nil, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
		return true // done, whatever happened: no waiting for room
	})
	return errors.Join(err, werr)
}

// Reachable reports whether an uplink answers at addr now: a connection is
// accepted and its process runs as this user, root or the shared group. The daemon's status
// says so, because a node whose clients cannot reach its uplink turns
// every cluster page into a local miss without an error anywhere.
func Reachable(addr string, timeout time.Duration) error {
	l := &Link{addr: addr}
	c, err := l.dial(time.Now().Add(timeout))
	if err != nil {
		return err
	}
	return c.Close()
}
