package link

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/tier"
)

const (
	envRole    = "CXLTIER_LINK_ROLE"
	envDevices = "CXLTIER_LINK_DEVICES"
)

func TestMain(m *testing.M) {
	if os.Getenv(envRole) == "claimer" {
		if err := runClaimer(); err != nil {
			fmt.Fprintf(os.Stderr, "link claimer: %v\n", err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runClaimer is a process with a deadline transfer that never ends: it
// claims the link 5 s ahead, says so, and waits to be killed.
func runClaimer() error {
	c, err := tiertest.Attach(os.Getenv(envDevices), "claimer")
	if err != nil {
		return err
	}
	l, err := Open(c, patient)
	if err != nil {
		return err
	}
	l.Claim(time.Now().Add(5 * time.Second))
	fmt.Println("claimed")
	select {}
}

// patient obeys a claim until it ends: a horizon past the tests' claims
// and the whole window as each process's share.
var patient = Config{Name: "test", Horizon: 10 * time.Second, Window: time.Minute, Share: 1}

func open(t *testing.T, c *tier.Client, cfg Config) *Link {
	t.Helper()
	l, err := Open(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func attach(t testing.TB, r *tier.Region, name string) *tier.Client {
	t.Helper()
	c, err := r.Attach(tier.ClientOptions{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// sleepersReach looks at l's count of movers asleep on its slot until it
// is want, for up to 5 s, and returns the last it saw: a sleeper wakes to
// look again at least every livenessEvery, and is briefly not asleep.
func sleepersReach(l *Link, want uint32) uint32 {
	deadline := time.Now().Add(5 * time.Second)
	for {
		n := atomic.LoadUint32(word32(l.mine, offSleepers))
		if n == want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(time.Millisecond)
	}
}

// turnReturns runs Turn and reports whether it returned within d.
func turnReturns(l *Link, d time.Duration) (<-chan struct{}, bool) {
	done := make(chan struct{})
	go func() { l.Turn(1 << 20); close(done) }()
	select {
	case <-done:
		return done, true
	case <-time.After(d):
		return done, false
	}
}

// A bulk piece of one process waits while another process's deadline
// transfer is due, and goes on once it is done; the counters say so.
func TestBulkWaitsForADueClaim(t *testing.T) {
	r, c := tiertest.Format(t, 1, 16<<20, 64<<10)
	urgent, bulk := open(t, c, patient), open(t, attach(t, r, "bulk"), patient)
	urgent.Claim(time.Now().Add(5 * time.Second))
	done, returned := turnReturns(bulk, 100*time.Millisecond)
	if returned {
		t.Fatal("a bulk piece went ahead of a due claim")
	}
	if n := sleepersReach(urgent, 1); n != 1 {
		urgent.Done(false)
		<-done // the mover is out of the tier before the test unmaps it
		t.Fatalf("%d bulk movers asleep on the claim, want 1: it spins instead of giving the core up", n)
	}
	urgent.Done(false)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a bulk piece still waits after the claim was done")
	}
	st, err := ReadStats(r, "test")
	if err != nil {
		t.Fatal(err)
	}
	if st.Processes != 2 || st.Claims != 1 || st.Misses != 0 || st.BulkWaits != 1 || st.BulkBytes != 1<<20 || st.BulkWaited < 50*time.Millisecond {
		t.Fatalf("stats %+v", st)
	}
	urgent.Claim(time.Now().Add(time.Second))
	urgent.Done(true)
	if st, _ := ReadStats(r, "test"); st.Claims != 2 || st.Misses != 1 {
		t.Fatalf("a missed claim: %+v", st)
	}
}

// A mover yields through a claim due soon (its owner would wake it on
// the thread that waits for the claim's rows) and sleeps on one due later.
func TestAMoverYieldsThroughAClaimDueSoon(t *testing.T) {
	for _, tc := range []struct {
		try  int
		left time.Duration
		want bool
	}{
		{0, time.Second, true},
		{spinTries - 1, time.Second, true},
		{spinTries, time.Second, false},
		{spinTries, yieldWithin + time.Nanosecond, false},
		{spinTries, yieldWithin, true},
		{1000, 200 * time.Microsecond, true},
		{1000, 0, true},
	} {
		if got := yields(tc.try, tc.left); got != tc.want {
			t.Errorf("yields(try %d, due in %v) = %v, want %v", tc.try, tc.left, got, tc.want)
		}
	}
	// And a piece behind a claim due soon that is never ended goes on
	// at its deadline.
	r, c := tiertest.Format(t, 1, 16<<20, 64<<10)
	urgent, bulk := open(t, c, patient), open(t, attach(t, r, "bulk"), patient)
	urgent.Claim(time.Now().Add(yieldWithin))
	if _, ok := turnReturns(bulk, 5*time.Second); !ok {
		t.Fatal("a bulk piece still waits on a claim past its deadline")
	}
}

// Claims no one should wait for are ignored: one past its deadline, one
// beyond the horizon (a liar's, or a clock gone wrong), one of a client
// whose lease ended.
func TestClaimsNotDueAreIgnored(t *testing.T) {
	cases := []struct {
		name  string
		claim func(t *testing.T, r *tier.Region, c *tier.Client)
	}{
		{"past its deadline", func(t *testing.T, r *tier.Region, c *tier.Client) {
			open(t, c, patient).Claim(time.Now().Add(-time.Millisecond))
		}},
		{"beyond the horizon", func(t *testing.T, r *tier.Region, c *tier.Client) {
			open(t, c, patient).Claim(time.Now().Add(time.Hour))
		}},
		{"of a closed client", func(t *testing.T, r *tier.Region, c *tier.Client) {
			gone, err := r.Attach(tier.ClientOptions{Name: "gone"})
			if err != nil {
				t.Fatal(err)
			}
			l, err := Open(gone, patient)
			if err != nil {
				t.Fatal(err)
			}
			l.Claim(time.Now().Add(5 * time.Second))
			l.BeginFirst(time.Now().Add(5 * time.Second))
			gone.Close() // its slot still shows the claim; its lease is gone
		}},
		{"first-token, past its deadline", func(t *testing.T, r *tier.Region, c *tier.Client) {
			open(t, c, patient).BeginFirst(time.Now().Add(-time.Millisecond))
		}},
		{"first-token, beyond its horizon", func(t *testing.T, r *tier.Region, c *tier.Client) {
			open(t, c, patient).BeginFirst(time.Now().Add(time.Hour))
		}},
		{"first-token, ended", func(t *testing.T, r *tier.Region, c *tier.Client) {
			f := open(t, c, patient).BeginFirst(time.Now().Add(5 * time.Second))
			f.End()
			f.End() // again: nothing
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, c := tiertest.Format(t, 1, 16<<20, 64<<10)
			tc.claim(t, r, attach(t, r, "urgent"))
			bulk := open(t, c, patient)
			if _, ok := turnReturns(bulk, 5*time.Second); !ok {
				t.Fatal("a bulk piece waits for a claim it should ignore")
			}
			if st, _ := ReadStats(r, "test"); st.BulkWaits != 0 {
				t.Fatalf("a piece waited: %+v", st)
			}
		})
	}
}

// A process that claims the link all the time, or says it has a
// first-token transfer in flight all the time, or both, costs the others
// its share of each window and no more.
func TestAClaimThatNeverEndsCostsOnlyItsShare(t *testing.T) {
	for _, tc := range []struct {
		name         string
		claim, first bool
	}{{"claim", true, false}, {"first-token", false, true}, {"both", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			r, c := tiertest.Format(t, 1, 16<<20, 64<<10)
			liar := open(t, attach(t, r, "liar"), patient)
			if tc.claim {
				liar.Claim(time.Now().Add(8 * time.Second))
			}
			if tc.first {
				liar.BeginFirst(time.Now().Add(8 * time.Second))
			}
			// A window no slow machine outlasts: the share is spent once, 60 ms.
			bulk := open(t, c, Config{Name: "test", Horizon: 10 * time.Second, Window: time.Minute, Share: 0.001})
			start := time.Now()
			for range 3 {
				if _, ok := turnReturns(bulk, 5*time.Second); !ok {
					t.Fatal("a bulk piece waits past its share of the window")
				}
			}
			st, _ := ReadStats(r, "test")
			if st.BulkWaits != 1 || st.BulkWaited < 50*time.Millisecond || st.BulkWaited > time.Since(start) {
				t.Fatalf("three pieces behind a claim that never ends: %+v (the first waits out the share, the others none)", st)
			}
		})
	}
}

// A process killed while its claim is due does not hold the link: the
// others see its process gone and go on, and a new process takes its
// slot.
func TestAKilledClaimerDoesNotHoldTheLink(t *testing.T) {
	r, c := tiertest.Format(t, 1, 16<<20, 64<<10)
	cfg := patient
	cfg.Slots = 2
	bulk := open(t, c, cfg)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=claimer", envDevices+"="+strings.Join(r.Info().Devices, ","))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "claimed\n" {
		t.Fatalf("claimer: %q, %v", line, err)
	}
	done, returned := turnReturns(bulk, 100*time.Millisecond)
	if returned {
		t.Fatal("a bulk piece went ahead of another process's due claim")
	}
	cmd.Process.Kill()
	cmd.Wait()
	select {
	case <-done:
	case <-time.After(4 * time.Second):
		t.Fatal("a killed process's claim still holds the link")
	}
	if _, err := Open(attach(t, r, "next"), cfg); err != nil {
		t.Fatalf("a process after the killed one, on a table of 2: %v", err)
	}
}

func TestBadInputs(t *testing.T) {
	r, c := tiertest.Format(t, 1, 16<<20, 64<<10)
	for _, cfg := range []Config{{Slots: -1}, {Slots: maxSlots + 1}, {Share: 2}, {Share: -0.5}, {Horizon: -1}} {
		if _, err := Open(c, cfg); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%+v: %v, want ErrBadConfig", cfg, err)
		}
	}
	full := Config{Name: "small", Slots: 1}
	open(t, c, full)
	if _, err := Open(attach(t, r, "second"), full); !errors.Is(err, ErrFull) {
		t.Fatalf("a second process on a table of one: %v, want ErrFull", err)
	}
	if _, err := ReadStats(r, "none"); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("stats of a missing table: %v", err)
	}
	if names, err := Tables(r); err != nil || len(names) != 1 || names[0] != "small" {
		t.Fatalf("tables %v, %v", names, err)
	}
	// The default name is the node's.
	l := open(t, attach(t, r, "third"), Config{})
	if l.cfg.Name != "node0" {
		t.Fatalf("default name %q", l.cfg.Name)
	}
}

// A damaged header is named, never a panic or a table of another shape.
func TestDamageIsNamed(t *testing.T) {
	r, c := tiertest.Format(t, 1, 16<<20, 64<<10)
	l := open(t, c, Config{Name: "dmg", Slots: 4})
	for _, at := range []int{0, 9, 12, 60} {
		b, err := r.Slice(l.base+tier.Offset(at), 1)
		if err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0x40
		_, err = Open(attach(t, r, fmt.Sprint("reader", at)), Config{Name: "dmg"})
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), `"dmg"`) {
			t.Fatalf("header byte %d damaged: %v", at, err)
		}
		if _, err := ReadStats(r, "dmg"); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("stats, header byte %d damaged: %v", at, err)
		}
		b[0] ^= 0x40
	}
}

func FuzzDecodeHeader(f *testing.F) {
	f.Add(make([]byte, line), int64(4096))
	f.Add(encodeHeader(4), int64(5*line))
	f.Add(encodeHeader(4), int64(4*line))
	f.Fuzz(func(t *testing.T, h []byte, size int64) {
		slots, err := decodeHeader(h, size)
		if err == nil && (slots < 1 || slots > maxSlots || int64(slots+1)*line > size) {
			t.Fatalf("accepted %d slots in %d bytes", slots, size)
		}
	})
}

// A first-token transfer of one process holds up another's bulk pieces
// until it ends, and its own pieces wait for a deadline claim only: not
// for bulk, not for another first-token transfer.
func TestBulkWaitsForAFirstTokenTransfer(t *testing.T) {
	r, c := tiertest.Format(t, 1, 16<<20, 64<<10)
	loader, other := open(t, c, patient), open(t, attach(t, r, "other"), patient)
	bulk := open(t, attach(t, r, "bulk"), patient)
	f := loader.BeginFirst(time.Now().Add(5 * time.Second))
	g := other.BeginFirst(time.Now().Add(5 * time.Second))
	for _, x := range []*First{f, g} {
		if ok := pieceReturns(x.Turn, 5*time.Second); !ok {
			t.Fatal("a first-token piece waits for another first-token transfer")
		}
	}
	g.End()
	done, returned := turnReturns(bulk, 100*time.Millisecond)
	if returned {
		t.Fatal("a bulk piece went ahead of a first-token transfer in flight")
	}
	if n := sleepersReach(loader, 1); n != 1 {
		f.End()
		<-done
		t.Fatalf("%d bulk movers asleep on the transfer, want 1", n)
	}
	f.End()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a bulk piece still waits after the first-token transfer ended")
	}
	st, err := ReadStats(r, "test")
	if err != nil {
		t.Fatal(err)
	}
	if st.FirstTransfers != 2 || st.FirstMisses != 0 || st.FirstBytes != 2<<20 || st.FirstWaited != 0 ||
		st.BulkWaits != 1 || st.BulkBytes != 1<<20 || st.BulkWaited < 50*time.Millisecond {
		t.Fatalf("stats %+v", st)
	}
	late := loader.BeginFirst(time.Now().Add(time.Millisecond))
	time.Sleep(2 * time.Millisecond)
	late.End()
	if st, _ := ReadStats(r, "test"); st.FirstTransfers != 3 || st.FirstMisses != 1 {
		t.Fatalf("a late first-token transfer: %+v", st)
	}
}

// A first-token transfer's piece waits while a deadline claim is due.
func TestAFirstTokenPieceWaitsForAClaim(t *testing.T) {
	r, c := tiertest.Format(t, 1, 16<<20, 64<<10)
	urgent, loader := open(t, c, patient), open(t, attach(t, r, "loader"), patient)
	f := loader.BeginFirst(time.Now().Add(5 * time.Second))
	defer f.End()
	urgent.Claim(time.Now().Add(5 * time.Second))
	done := make(chan struct{})
	go func() { f.Turn(1 << 20); close(done) }()
	select {
	case <-done:
		t.Fatal("a first-token piece went ahead of a due claim")
	case <-time.After(100 * time.Millisecond):
	}
	urgent.Done(false)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a first-token piece still waits after the claim was done")
	}
	if st, _ := ReadStats(r, "test"); st.FirstBytes != 1<<20 || st.FirstWaited < 50*time.Millisecond || st.BulkWaits != 0 {
		t.Fatalf("stats %+v", st)
	}
}

// pieceReturns runs turn for a piece and reports whether it returned
// within d.
func pieceReturns(turn func(int64), d time.Duration) bool {
	done := make(chan struct{})
	go func() { turn(1 << 20); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}
