package cluster

import (
	"errors"
	"net"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The uplink's side of the wire, in Go, for the link's own behaviour
// (timeouts, an absent or stalled uplink, a full socket): a stand-in for
// python/cxltier/cluster/uplink.py, which the Python tests run for real against
// mooncake_master.
type standIn struct {
	ln      *net.UnixListener
	addr    string
	stall   atomic.Bool // answer nothing
	failed  atomic.Bool // answer that the fill failed (after all but one key)
	reads   atomic.Bool // read notices (false: let the socket fill)
	notices atomic.Int64
	fills   atomic.Int64

	mu    sync.Mutex
	conns []*net.UnixConn
}

func startStandIn(t *testing.T) *standIn {
	t.Helper()
	addr := filepath.Join(t.TempDir(), "uplink.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	s := &standIn{addr: addr}
	s.reads.Store(true)
	s.listen(ln)
	t.Cleanup(s.kill)
	return s
}

func (s *standIn) listen(ln *net.UnixListener) {
	s.ln = ln
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			go s.serve(c)
		}
	}()
}

// kill is the uplink process dying: its socket and connections go.
func (s *standIn) kill() {
	s.ln.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	s.conns = nil
}

func (s *standIn) serve(c *net.UnixConn) {
	defer c.Close()
	buf := make([]byte, 1<<20)
	for {
		if !s.reads.Load() {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		r, err := ParseRequest(buf[:n])
		if err != nil {
			return
		}
		if r.Op == OpStored {
			s.notices.Add(int64(len(r.Keys)))
			continue
		}
		s.fills.Add(1)
		if s.stall.Load() {
			continue
		}
		c.Write(Reply{Filled: uint32(len(r.Keys) - 1), Failed: s.failed.Load()}.AppendBinary(nil))
	}
}

func TestFillAsksTheUplink(t *testing.T) {
	s := startStandIn(t)
	l := NewLink(s.addr, Options{})
	defer l.Close()
	for range 3 { // the second and third reuse the pooled connection
		n, err := l.Fill("m", keys(5))
		if err != nil || n != 4 {
			t.Fatalf("fill: %d, %v; want 4", n, err)
		}
	}
	if st := l.Stats(); st.Fills != 3 || st.Filled != 12 || st.FillFailures != 0 {
		t.Errorf("stats %+v", st)
	}
	if n, err := l.Fill("m", keys(MaxFillKeys+10)); err != nil || n != MaxFillKeys-1 {
		t.Errorf("fill past the limit: %d, %v (asks for the first %d)", n, err, MaxFillKeys)
	}
}

// An uplink whose fill failed part-way answers with the pages it published
// before the failure: Fill counts them, reports ErrFillFailed, and keeps
// the connection (the answer was sound).
func TestFillFailedPartWayCountsWhatIsThere(t *testing.T) {
	s := startStandIn(t)
	s.failed.Store(true)
	l := NewLink(s.addr, Options{})
	defer l.Close()
	for range 2 {
		if n, err := l.Fill("m", keys(5)); n != 4 || !errors.Is(err, ErrFillFailed) {
			t.Fatalf("fill that failed part-way: %d, %v; want 4 and ErrFillFailed", n, err)
		}
	}
	if st := l.Stats(); st.Fills != 0 || st.FillFailures != 2 || st.Filled != 8 {
		t.Errorf("stats %+v", st)
	}
	s.mu.Lock()
	conns := len(s.conns)
	s.mu.Unlock()
	if conns != 1 {
		t.Errorf("%d connections for two fills: a failed fill's sound answer should keep its connection", conns)
	}
}

// No uplink: a fill gives up at once, and the next ones do not even dial
// until Retry has passed; an uplink that starts later is found.
func TestNoUplinkIsALocalMiss(t *testing.T) {
	addr := filepath.Join(t.TempDir(), "uplink.sock")
	l := NewLink(addr, Options{Retry: 100 * time.Millisecond})
	defer l.Close()
	start := time.Now()
	for range 1000 {
		if n, err := l.Fill("m", keys(3)); n != 0 || !errors.Is(err, errAbsent) {
			t.Fatalf("fill without uplink: %d, %v", n, err)
		}
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("1000 fills without an uplink took %v", d)
	}
	l.Stored("m", keys(3))
	if st := l.Stats(); st.Dropped != 3 || st.Notices != 0 {
		t.Errorf("notices without an uplink: %+v", st)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: addr, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.AcceptUnix()
		if err == nil {
			buf := make([]byte, 1<<20)
			c.Read(buf)
			c.Write(Reply{Filled: 3}.AppendBinary(nil))
		}
	}()
	time.Sleep(150 * time.Millisecond)
	if n, err := l.Fill("m", keys(3)); n != 3 || err != nil {
		t.Errorf("fill once the uplink is up: %d, %v", n, err)
	}
}

// A stalled uplink costs a fill its timeout, no more.
func TestStalledUplinkTimesOut(t *testing.T) {
	s := startStandIn(t)
	s.stall.Store(true)
	l := NewLink(s.addr, Options{Timeout: 150 * time.Millisecond})
	defer l.Close()
	start := time.Now()
	n, err := l.Fill("m", keys(2))
	if d := time.Since(start); n != 0 || err == nil || d > time.Second {
		t.Fatalf("stalled fill: %d, %v after %v", n, err, d)
	}
	if st := l.Stats(); st.FillFailures != 1 {
		t.Errorf("stats %+v", st)
	}
}

// An uplink that stops reading: notices fill its socket and are then
// dropped and counted; Stored never waits.
func TestNoticesNeverBlock(t *testing.T) {
	s := startStandIn(t)
	s.reads.Store(false)
	l := NewLink(s.addr, Options{})
	defer l.Close()
	// A notice that waited on the stuck uplink would wait for ever (or a
	// write timeout per call: 400 of them). The bound is many times the
	// work (milliseconds), so a loaded machine does not trip it.
	start := time.Now()
	for range 400 {
		l.Stored("m", keys(MaxNoticeKey))
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("400 notices to a stuck uplink took %v", d)
	}
	st := l.Stats()
	if st.Dropped == 0 || st.Notices+st.Dropped != 400*MaxNoticeKey {
		t.Errorf("stats %+v: want drops, and every key counted once", st)
	}
	s.reads.Store(true)
	deadline := time.Now().Add(30 * time.Second)
	for s.notices.Load() < int64(st.Notices) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := s.notices.Load(); got != int64(st.Notices) {
		t.Errorf("uplink read %d keys, link sent %d", got, st.Notices)
	}
}

// An uplink that restarts: the pooled connection is stale, and the link
// carries on with a new one within the same call.
func TestUplinkRestart(t *testing.T) {
	s := startStandIn(t)
	l := NewLink(s.addr, Options{})
	defer l.Close()
	if n, err := l.Fill("m", keys(2)); n != 1 || err != nil {
		t.Fatal(n, err)
	}
	l.Stored("m", keys(1))
	s.kill()
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: s.addr, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	s.listen(ln)
	if n, err := l.Fill("m", keys(2)); n != 1 || err != nil {
		t.Errorf("fill after restart: %d, %v", n, err)
	}
	l.Stored("m", keys(1))
	if st := l.Stats(); st.Notices != 2 || st.Dropped != 0 {
		t.Errorf("notices across the restart: %+v", st)
	}
}
