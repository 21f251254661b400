package tier

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func attachWait(t testing.TB, r *Region, wait time.Duration) *Client {
	t.Helper()
	c, err := r.Attach(ClientOptions{Name: "hold", CloseWait: wait})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCloseWaitsForHolds: Client.Close turns new holds away at once but
// frees nothing until the hold in flight is done.
func TestCloseWaitsForHolds(t *testing.T) {
	r := formatTest(t, testGeometry(), shmBacking(t))
	c := attachWait(t, r, 10*time.Second)
	h, err := c.Hold()
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		h2, err := c.Hold()
		if errors.Is(err, ErrClosed) {
			break
		}
		if err == nil {
			h2.Done()
		}
		if time.Now().After(deadline) {
			t.Fatal("a hold is still granted while the client closes")
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) with a hold in flight", err)
	case <-time.After(50 * time.Millisecond):
	}
	if !r.LeaseLive(c.Token()) {
		t.Fatal("the lease was released with a hold in flight")
	}
	h.Done()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if r.LeaseLive(c.Token()) {
		t.Fatal("the lease is still live after Close")
	}
}

// TestCloseBusyLeavesClientUsable: holds that outlast CloseWait make Close
// report ErrHoldsInFlight and leave the client as it was.
func TestCloseBusyLeavesClientUsable(t *testing.T) {
	r := formatTest(t, testGeometry(), shmBacking(t))
	c := attachWait(t, r, 20*time.Millisecond)
	h, err := c.Hold()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); !errors.Is(err, ErrHoldsInFlight) {
		t.Fatalf("Close with a hold outstanding: %v", err)
	}
	if err := r.Close(); !errors.Is(err, ErrHoldsInFlight) {
		t.Fatalf("Region.Close with a hold outstanding: %v", err)
	}
	h2, err := c.Hold()
	if err != nil {
		t.Fatalf("hold after a refused close: %v", err)
	}
	if _, err := c.AllocChunks(1); err != nil {
		t.Fatalf("the region was unmapped or the client closed: %v", err)
	}
	h2.Done()
	h.Done()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRegionCloseWaitsForHolds: the mapping stays until every client's
// holds are done, and no hold is granted after.
func TestRegionCloseWaitsForHolds(t *testing.T) {
	r := formatTest(t, testGeometry(), shmBacking(t))
	c := attachWait(t, r, 10*time.Second)
	h, err := c.Hold()
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	time.Sleep(50 * time.Millisecond)
	// The hold keeps the mapping: reading it must not fault.
	if dev := r.devs; len(dev) == 0 || len(dev[0].data) == 0 {
		t.Fatal("the region was unmapped with a hold in flight")
	}
	_ = r.devs[0].data[len(r.devs[0].data)-1]
	h.Done()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if _, err := c.Hold(); !errors.Is(err, ErrClosed) {
		t.Fatalf("hold after Region.Close: %v", err)
	}
}

// TestClosersRunNewestFirst: Close runs what was registered with OnClose,
// newest first, lets them take release holds (not work holds), skips one
// that unregistered, and returns the first error.
func TestClosersRunNewestFirst(t *testing.T) {
	r := formatTest(t, testGeometry(), shmBacking(t))
	c := attachTest(t, r, 0)
	var order []int
	boom := errors.New("closer failed")
	for i := range 4 {
		unregister := c.OnClose(func() error {
			order = append(order, i)
			if _, err := c.Hold(); !errors.Is(err, ErrClosed) {
				t.Errorf("closer %d got a work hold: %v", i, err)
			}
			h, err := c.HoldToRelease()
			if err != nil {
				t.Errorf("closer %d: release hold: %v", i, err)
				return err
			}
			h.Done()
			if i == 1 {
				return boom
			}
			return nil
		})
		if i == 2 && !unregister() {
			t.Fatal("unregister of a registered closer said it was gone")
		}
	}
	if err := c.Close(); !errors.Is(err, boom) {
		t.Fatalf("Close: %v", err)
	}
	if want := []int{3, 1, 0}; !equalInts(order, want) {
		t.Fatalf("closers ran %v, want %v", order, want)
	}
	if _, err := c.HoldToRelease(); !errors.Is(err, ErrClosed) {
		t.Fatalf("release hold after Close: %v", err)
	}
}

// reapForTest runs reaper passes judged by heartbeat alone until c's
// lease is reaped.
func reapForTest(t *testing.T, r *Region, c *Client) {
	t.Helper()
	m, err := NewManager(r, ManagerOptions{Node: c.Node(), SkipPIDCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Client().Close()
	deadline := time.Now().Add(10 * r.l.LeaseTimeout)
	for time.Now().Before(deadline) {
		for _, rp := range m.ReapOnce() {
			if rp.Slot == c.Slot() {
				return
			}
		}
		time.Sleep(r.l.LeaseTimeout / 4)
	}
	t.Fatalf("client slot %d was not reaped", c.Slot())
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestHoldFencedSeesReap: a hold taken before the client was reaped, and
// its slot attached again by another client, reports the lease lost (the
// generation compare), while the new client's hold is fine.
func TestHoldFencedSeesReap(t *testing.T) {
	g := testGeometry()
	g.LeaseTimeout = 300 * time.Millisecond
	r := formatTest(t, g, shmBacking(t))
	old, err := r.Attach(ClientOptions{Name: "zombie", Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	h, err := old.Hold()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Done()
	if err := h.Fenced(); err != nil {
		t.Fatal(err)
	}
	reapForTest(t, r, old)
	fresh := attachTest(t, r, 0)
	if fresh.Slot() != old.Slot() {
		t.Fatalf("the new client took slot %d, not the reaped slot %d", fresh.Slot(), old.Slot())
	}
	if err := h.Fenced(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a hold of a reaped client whose slot is live again: %v", err)
	}
	h2, err := fresh.Hold()
	if err != nil {
		t.Fatal(err)
	}
	defer h2.Done()
	if err := h2.Fenced(); err != nil {
		t.Fatalf("the new client's hold: %v", err)
	}
}

// TestHoldsDoNotRace: goroutines read the mapping under holds while the
// region closes. A close that unmapped under a hold would fault, and under
// -race the read of the mapping and its teardown would be reported.
func TestHoldsDoNotRace(t *testing.T) {
	r := formatTest(t, testGeometry(), shmBacking(t))
	c := attachWait(t, r, 10*time.Second)
	var wg sync.WaitGroup
	var reads atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				h, err := c.Hold()
				if err != nil {
					return
				}
				d := r.devs[0].data
				_ = d[len(d)-1]
				reads.Add(1)
				h.Done()
			}
		}()
	}
	for reads.Load() < 1000 {
		time.Sleep(time.Millisecond)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// BenchmarkHold is the gate's cost on one thread and, run with -cpu 1,2,4,
// on several threads working one client: sharded, it should not grow with
// the threads as one shared counter does.
func BenchmarkHold(b *testing.B) {
	r := formatTest(b, testGeometry(), shmBacking(b))
	c := attachTest(b, r, 0)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h, err := c.Hold()
			if err != nil {
				b.Error(err)
				return
			}
			h.Done()
		}
	})
}

// BenchmarkHoldOneCounter is the baseline BenchmarkHold is read against:
// the same enter and leave on one shared counter, as a gate without
// shards would do.
func BenchmarkHoldOneCounter(b *testing.B) {
	var n atomic.Int64
	var state atomic.Uint32
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n.Add(1)
			if state.Load() != 0 {
				b.Error("closed")
			}
			n.Add(-1)
		}
	})
}

// TestLockRechecksTheLeaseAfterWinning: a client reaped between winning a
// lock's local word and returning (a pause there) gets ErrLeaseLost, and
// the lock is free for others, not held by a client that lost its lease.
func TestLockRechecksTheLeaseAfterWinning(t *testing.T) {
	g := testGeometry()
	g.LeaseTimeout = 300 * time.Millisecond
	r := formatTest(t, g, shmBacking(t))
	z, err := r.Attach(ClientOptions{Name: "paused", Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	z.afterLocalAcquire = func() { reapForTest(t, r, z) }
	if err := z.Lock(FirstUserLock); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("lock by a client reaped after winning it: %v", err)
	}
	other := attachTest(t, r, 0)
	if !other.lockWithin(FirstUserLock, time.Second) {
		t.Fatal("the lock is still held for the reaped client")
	}
	other.Unlock(FirstUserLock)
}

// TestRegionCloseThatGivesUpChangesNothing: while Region.Close waits for
// a hold in flight, the region's own calls go on; when it gives up, the
// region and its client are as they were. (The region was marked closed
// before the wait, so its calls failed for as long as the wait lasted.)
func TestRegionCloseThatGivesUpChangesNothing(t *testing.T) {
	r := formatTest(t, testGeometry())
	c, err := r.Attach(ClientOptions{Name: "busy", CloseWait: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	held, err := c.Hold()
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	for c.gate.state.Load() != gateClosed {
		time.Sleep(time.Millisecond)
	}
	if err := r.live("a call during the close's wait"); err != nil {
		t.Errorf("during the wait: %v", err)
	}
	if len(r.Leases()) == 0 {
		t.Error("during the wait the region lists no lease")
	}
	if err := <-closed; !errors.Is(err, ErrHoldsInFlight) {
		t.Fatalf("close with a hold in flight: %v", err)
	}
	held.Done()
	if _, err := c.AllocChunks(1); err != nil {
		t.Fatalf("after the close gave up: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("close once the hold ended: %v", err)
	}
}

// TestHoldCountsBeforeItChecks: a Close that starts between a hold's count
// and its check of the gate waits for the hold, and the hold, seeing the
// gate closing, backs out: the Close then finishes and the hold fails.
// (Checked first and counted second, a hold could pass its check, let a
// whole Close run, unmap and all, and then proceed on a closed client.)
func TestHoldCountsBeforeItChecks(t *testing.T) {
	r := formatTest(t, testGeometry())
	c, err := r.Attach(ClientOptions{Name: "racer", CloseWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	c.betweenCountAndCheck = func() {
		c.betweenCountAndCheck = nil
		go func() { closed <- c.Close() }()
		deadline := time.Now().Add(5 * time.Second)
		for c.gate.state.Load() == gateOpen && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		select {
		case err := <-closed:
			closed <- err // the close finished while this hold was between its steps
		case <-time.After(50 * time.Millisecond):
		}
	}
	held, err := c.Hold()
	if err == nil {
		held.Done()
		t.Fatal("a hold went ahead while the client closed")
	}
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("the hold: %v, want ErrClosed", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("the close: %v", err)
	}
}

// TestACloseWaitsForAHoldPastItsCheck: a close that begins once a hold
// passed its check waits for that hold. With the check run before the
// count (a mutant TestHoldCountsBeforeItChecks let through, its hook
// coming before both), the close saw no hold, finished, and the hold went
// ahead on a closed client.
func TestACloseWaitsForAHoldPastItsCheck(t *testing.T) {
	r := formatTest(t, testGeometry())
	c, err := r.Attach(ClientOptions{Name: "racer", CloseWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	early := false
	c.afterHoldCheck = func() {
		c.afterHoldCheck = nil
		go func() { closed <- c.Close() }()
		select {
		case err := <-closed:
			early = true
			closed <- err
		case <-time.After(100 * time.Millisecond):
		}
	}
	held, err := c.Hold()
	if err != nil {
		t.Fatalf("a hold past its check: %v", err)
	}
	if early {
		held.Done()
		t.Fatal("the close finished while a hold that passed its check was out")
	}
	held.Done()
	if err := <-closed; err != nil {
		t.Fatalf("the close: %v", err)
	}
}

// Holds of many goroutines at once spread over the gate's shards (each
// goroutine's stack picks one), and every one is given back.
func TestHoldsSpreadOverShards(t *testing.T) {
	r := formatTest(t, testGeometry(), shmBacking(t))
	c := attachTest(t, r, 0)
	const goroutines = 64
	holds := make(chan Hold, goroutines)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := c.Hold()
			if err != nil {
				t.Error(err)
				return
			}
			holds <- h
			<-release
			h.Done()
		}()
	}
	shards := map[*atomic.Int64]bool{}
	for range goroutines {
		shards[(<-holds).shard] = true
	}
	if n := c.gate.inFlight(); n != goroutines {
		t.Errorf("%d holds counted, want %d", n, goroutines)
	}
	close(release)
	wg.Wait()
	// 64 picks over 32 shards: a spread pick leaves about 20 used; one
	// that clusters goroutines would leave a few.
	if len(shards) < holdShards/4 {
		t.Errorf("%d goroutines' holds fell in %d of %d shards", goroutines, len(shards), holdShards)
	}
	if n := c.gate.inFlight(); n != 0 {
		t.Errorf("%d holds still counted after every Done", n)
	}
}
