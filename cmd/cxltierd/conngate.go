package main

import (
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// peerOf is the peer an address counts as for the admin API's limits:
// every loopback address is one peer (a local user can bind any of
// 127.0.0.0/8, so per-address limits would multiply by 16 million), an
// IPv6 address counts by its /64 (what one host is usually given), an
// IPv4 address by itself.
func peerOf(ip net.IP) string {
	switch {
	case ip == nil:
		return "unknown"
	case ip.IsLoopback():
		return "loopback"
	case ip.To4() == nil:
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return ip.String()
}

// connGate bounds the admin API's connections without letting anyone
// starve it: each peer may hold perPeer connections and all together
// total, and when a new connection would pass either bound, the oldest
// idle connection (of that peer, else of anyone) is closed to make room.
// Idle keep-alive connections therefore cannot lock out /healthz or the
// token holder, whichever address they come from; a connection is refused
// only when every one it would compete with is busy with a request (and
// those end within the server's read and write timeouts).
type connGate struct {
	net.Listener
	perPeer, total int

	mu    sync.Mutex
	conns map[net.Conn]*gated
	peers map[string]int
}

type gated struct {
	peer      string
	idleSince time.Time // zero while a request is in progress or before the first
}

func newConnGate(ln net.Listener, perPeer, total int) *connGate {
	return &connGate{Listener: ln, perPeer: perPeer, total: total, conns: map[net.Conn]*gated{}, peers: map[string]int{}}
}

// Accept admits the next connection, closing an idle one to make room if
// it must; a connection that finds no room is closed at once.
func (g *connGate) Accept() (net.Conn, error) {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			return nil, err
		}
		var ip net.IP
		if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
			ip = a.IP
		}
		if g.admit(c, peerOf(ip)) {
			return c, nil
		}
		c.Close()
	}
}

func (g *connGate) admit(c net.Conn, peer string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.peers[peer] >= g.perPeer && !g.evictLocked(peer) {
		return false
	}
	if len(g.conns) >= g.total && !g.evictLocked("") {
		return false
	}
	g.conns[c] = &gated{peer: peer}
	g.peers[peer]++
	return true
}

// evictLocked closes the oldest idle connection of peer (of anyone if
// peer is "") and reports whether there was one. Its slot is freed now;
// the server's closed-state callback finds it gone.
func (g *connGate) evictLocked(peer string) bool {
	var oldest net.Conn
	var at time.Time
	for c, s := range g.conns {
		if s.idleSince.IsZero() || (peer != "" && s.peer != peer) {
			continue
		}
		if oldest == nil || s.idleSince.Before(at) {
			oldest, at = c, s.idleSince
		}
	}
	if oldest == nil {
		return false
	}
	g.forgetLocked(oldest)
	oldest.Close()
	return true
}

func (g *connGate) forgetLocked(c net.Conn) {
	s, ok := g.conns[c]
	if !ok {
		return
	}
	delete(g.conns, c)
	if g.peers[s.peer]--; g.peers[s.peer] <= 0 {
		delete(g.peers, s.peer)
	}
}

// state is the server's ConnState hook: it tracks which connections are
// idle (and so may give way) and forgets closed ones. A connection is
// idle from its start until its first request, and between requests.
func (g *connGate) state(c net.Conn, st fasthttp.ConnState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.conns[c]
	switch {
	case !ok:
	case st == fasthttp.StateNew || st == fasthttp.StateIdle:
		s.idleSince = time.Now()
	case st == fasthttp.StateActive:
		s.idleSince = time.Time{}
	case st == fasthttp.StateClosed || st == fasthttp.StateHijacked:
		g.forgetLocked(c)
	}
}
