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
// starve it. A connection is fresh until its first request arrives, then
// proven:
//
//   - Fresh connections share a pool of their own (fresh), oldest closed
//     first when it is full. Nothing is known of a connection before its
//     first request, so an operator's new connection and a flood's look
//     alike; what saves the operator's is time: a pool this large lasts a
//     flood of thousands of connections a second for a good part of a
//     second, and a real client's request arrives within a millisecond.
//     (Bounding fresh connections by peer closed the operator's /healthz
//     before its bytes were read whenever a local user reopened
//     connections as fast as the gate closed them: one peer, loopback.)
//   - Proven connections are kept alive within perPeer a peer and total in
//     all; past either, the one of that peer (else of anyone) idle longest
//     is closed, and a connection that finds none idle is closed after its
//     response instead of kept. A request is always answered once it
//     arrives.
//
// Slow connections give way too: one that has sent part of a request and
// stalled (slow-loris), or sent nothing, for slowAfter counts as idle,
// which no well-behaved client of this API comes near.
type connGate struct {
	net.Listener
	perPeer, total, fresh int

	mu       sync.Mutex
	conns    map[net.Conn]*gated
	peers    map[string]int // proven connections of each peer
	proven   int
	freshNow int
}

type gated struct {
	peer         string
	opened       time.Time
	idleSince    time.Time // zero while a request is in progress
	readingSince time.Time // when the request in progress began arriving
	handling     bool      // a handler is answering it
	proven       bool      // a request has arrived on it
	over         bool      // proven past the bounds: closed after its response
}

// slowAfter is how long a request may take to arrive before its
// connection may be closed to make room for others.
const slowAfter = 500 * time.Millisecond

func newConnGate(ln net.Listener, perPeer, total, fresh int) *connGate {
	return &connGate{Listener: ln, perPeer: perPeer, total: total, fresh: fresh, conns: map[net.Conn]*gated{}, peers: map[string]int{}}
}

// Accept admits the next connection, closing the oldest fresh one to make
// room if it must.
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
	if g.freshNow >= g.fresh && !g.evictLocked(func(s *gated) bool { return !s.proven }) {
		return false
	}
	now := time.Now()
	g.conns[c] = &gated{peer: peer, opened: now, idleSince: now}
	g.freshNow++
	return true
}

// proveLocked moves c from the fresh pool to its peer's proven ones as its
// first request arrives, making room by closing an idle proven connection
// (of its peer if the peer's share is the bound) or, with none, marking c
// to be closed after its response.
func (g *connGate) proveLocked(c net.Conn, s *gated) {
	s.proven = true
	g.freshNow--
	if g.peers[s.peer] >= g.perPeer && !g.evictLocked(func(o *gated) bool { return o.proven && o.peer == s.peer }) {
		s.over = true
	}
	if !s.over && g.proven >= g.total && !g.evictLocked(func(o *gated) bool { return o.proven }) {
		s.over = true
	}
	g.peers[s.peer]++
	g.proven++
}

// evictLocked closes the connection among those which that has given way
// longest — idle, or stalled partway through a request for slowAfter —
// and reports whether there was one. Its slot is freed now; the server's
// closed-state callback finds it gone.
func (g *connGate) evictLocked(which func(*gated) bool) bool {
	var oldest net.Conn
	var at time.Time
	now := time.Now()
	for c, s := range g.conns {
		if !which(s) {
			continue
		}
		since := s.idleSince
		if since.IsZero() && !s.handling && !s.readingSince.IsZero() && now.Sub(s.readingSince) >= slowAfter {
			since = s.readingSince
		}
		if since.IsZero() {
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

// wrap marks a connection as answering while h runs (a handler's time
// never counts as a slow request), and closes after its response one that
// is past the bounds.
func (g *connGate) wrap(h fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if g.setHandling(ctx.Conn(), true) {
			ctx.SetConnectionClose()
		}
		defer g.setHandling(ctx.Conn(), false)
		h(ctx)
	}
}

// setHandling records whether c's handler runs, and reports whether c is
// to be closed after this response.
func (g *connGate) setHandling(c net.Conn, on bool) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.conns[c]
	if !ok {
		return false
	}
	s.handling = on
	return s.over
}

func (g *connGate) forgetLocked(c net.Conn) {
	s, ok := g.conns[c]
	if !ok {
		return
	}
	delete(g.conns, c)
	if !s.proven {
		g.freshNow--
		return
	}
	g.proven--
	if g.peers[s.peer]--; g.peers[s.peer] <= 0 {
		delete(g.peers, s.peer)
	}
}

// state is the server's ConnState hook: it tracks which connections are
// idle (and so may give way), proves a connection as its first request
// arrives, and forgets closed ones.
func (g *connGate) state(c net.Conn, st fasthttp.ConnState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.conns[c]
	switch {
	case !ok:
	case st == fasthttp.StateNew:
	case st == fasthttp.StateIdle:
		s.idleSince = time.Now()
	case st == fasthttp.StateActive: // a request's first bytes are in
		s.idleSince, s.readingSince = time.Time{}, time.Now()
		if !s.proven {
			g.proveLocked(c, s)
		}
	case st == fasthttp.StateClosed || st == fasthttp.StateHijacked:
		g.forgetLocked(c)
	}
}
