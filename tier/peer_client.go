package tier

import (
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// register proves this client to its node's daemon, if one listens: the
// heartbeat calls it until it succeeds (a daemon started after the client,
// or restarted, is registered with at its next beat). Without a daemon it
// costs one failed connect.
func (c *Client) register() {
	if c.registered.Load() || time.Now().Before(c.registerAfter) {
		return
	}
	path, err := c.r.SocketPath(c.node)
	if err != nil {
		return
	}
	uc, err := DialUnix("unix", path, peerDialWait)
	if err != nil {
		return // no daemon (or not yet): judged by heartbeat meanwhile
	}
	if err := CheckPeerUID(uc, "the daemon's socket "+path); err != nil {
		uc.Close() // never says who it is to a squatter, nor believes its answer
		c.registerAfter = time.Now().Add(peerRetry)
		c.registerErr.Store(err.Error())
		return
	}
	if err := c.hello(uc); err != nil {
		uc.Close()
		c.registerAfter = time.Now().Add(peerRetry)
		c.registerErr.Store(err.Error())
		return
	}
	c.peerMu.Lock()
	if c.peerClosed {
		c.peerMu.Unlock()
		uc.Close()
		return
	}
	c.peerConn = uc
	c.peerMu.Unlock()
	c.registerErr.Store("")
	c.registered.Store(true)
	c.done.Add(1)
	go func() {
		defer c.done.Done()
		// The daemon never writes again: this returns when it closes the
		// connection (it stopped or restarted) or the client does.
		io.Copy(io.Discard, io.LimitReader(uc, 1<<20))
		c.registered.Store(false)
	}()
}

func (c *Client) hello(conn *net.UnixConn) error {
	h := peerHello{UUID: c.r.l.UUID, Node: uint32(c.node), Slot: uint32(c.slot), Gen: c.gen,
		PID: uint32(os.Getpid()), PIDNS: c.r.pidns}
	conn.SetDeadline(time.Now().Add(peerReplyWait))
	if _, err := conn.Write(h.encode()); err != nil {
		return fmt.Errorf("tier: register with the daemon: %w", err)
	}
	head := make([]byte, 2)
	if _, err := io.ReadFull(conn, head); err != nil {
		return fmt.Errorf("tier: register with the daemon: no answer: %w", err)
	}
	if head[0] != 0 {
		msg := make([]byte, head[1])
		io.ReadFull(conn, msg)
		return fmt.Errorf("tier: the daemon refused this client's registration: %s", msg)
	}
	conn.SetDeadline(time.Time{})
	return nil
}

// beatPeer beats over the daemon's connection too, beside the lease: a
// beat there is the process's own, which no other tier writer can forge or
// stop, and the daemon ends a proven client only once both stopped. A
// daemon that does not read for a while costs a dropped beat, never a
// stalled heartbeat.
func (c *Client) beatPeer() {
	c.peerMu.Lock()
	defer c.peerMu.Unlock()
	if c.peerConn == nil || c.peerClosed || !c.registered.Load() {
		return
	}
	c.peerConn.SetWriteDeadline(time.Now().Add(peerBeatWait))
	c.peerConn.Write([]byte{peerBeat})
}

// closePeer ends the client's registration; the client is closing.
func (c *Client) closePeer() {
	c.peerMu.Lock()
	defer c.peerMu.Unlock()
	c.peerClosed = true
	if c.peerConn != nil {
		c.peerConn.Close()
	}
}

// Registered reports whether the client has proved itself to its node's
// daemon (which can then end it if it stalls, and learns at once when it
// exits); RegisterError says why the last try was refused.
func (c *Client) Registered() bool { return c.registered.Load() }

// RegisterError is the daemon's reason for refusing the last registration,
// "" if none was refused.
func (c *Client) RegisterError() string {
	s, _ := c.registerErr.Load().(string)
	return s
}
