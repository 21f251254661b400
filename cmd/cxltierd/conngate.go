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
// token holder, whichever address they come from. Nor can slow ones: a
// connection that has sent part of a request and stalled (slow-loris) is
// treated as idle once it has been reading for slowAfter, which no
// well-behaved client of this API comes near. A connection is refused only
// when every one it would compete with is in a handler or has just begun a
// request.
type connGate struct {
	net.Listener
	perPeer, total int

	mu    sync.Mutex
	conns map[net.Conn]*gated
	peers map[string]int
}

type gated struct {
	peer         string
	idleSince    time.Time // zero while a request is in progress
	readingSince time.Time // when the request in progress began arriving
	handling     bool      // a handler is answering it
}

// slowAfter is how long a request may take to arrive before its
// connection may be closed to make room for others.
const slowAfter = 500 * time.Millisecond

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

// evictLocked closes the connection of peer (of anyone if peer is "")
// that has given way longest — idle, or stalled partway through a request
// for slowAfter — and reports whether there was one. Its slot is freed
// now; the server's closed-state callback finds it gone.
func (g *connGate) evictLocked(peer string) bool {
	var oldest net.Conn
	var at time.Time
	now := time.Now()
	for c, s := range g.conns {
		since := s.idleSince
		if since.IsZero() && !s.handling && !s.readingSince.IsZero() && now.Sub(s.readingSince) >= slowAfter {
			since = s.readingSince
		}
		if since.IsZero() || (peer != "" && s.peer != peer) {
			continue
		}
		if oldest == nil || since.Before(at) {
			oldest, at = c, since
		}
	}
	if oldest == nil {
		return false
	}
	g.forgetLocked(oldest)
	oldest.Close()
	return true
}

// wrap marks a connection as answering while h runs: a handler's time
// never counts as a slow request.
func (g *connGate) wrap(h fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		g.setHandling(ctx.Conn(), true)
		defer g.setHandling(ctx.Conn(), false)
		h(ctx)
	}
}

func (g *connGate) setHandling(c net.Conn, on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s, ok := g.conns[c]; ok {
		s.handling = on
	}
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
	case st == fasthttp.StateActive: // a request's first bytes are in
		s.idleSince, s.readingSince = time.Time{}, time.Now()
	case st == fasthttp.StateClosed || st == fasthttp.StateHijacked:
		g.forgetLocked(c)
	}
}
