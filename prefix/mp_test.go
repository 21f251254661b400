package prefix

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/tier"
)

// The stress test re-executes this test binary as worker processes; the
// environment tells a child its role, tier and run time.
const (
	envRole    = "CXLTIER_PREFIX_ROLE"
	envDevices = "CXLTIER_PREFIX_DEVICES"
	envRun     = "CXLTIER_PREFIX_RUN"
	envSeed    = "CXLTIER_PREFIX_SEED"
)

var soak = flag.Duration("prefix.soak", 0, "run the multi-process stress test this long instead of 8s")

func TestMain(m *testing.M) {
	if os.Getenv(envRole) == "reserver" {
		if err := runReserver(); err != nil {
			fmt.Fprintf(os.Stderr, "prefix reserver %d: %v\n", os.Getpid(), err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	if os.Getenv(envRole) == "pinner" {
		if err := runPinner(); err != nil {
			fmt.Fprintf(os.Stderr, "prefix pinner %d: %v\n", os.Getpid(), err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	if os.Getenv(envRole) == "forger" {
		if err := runForger(); err != nil {
			fmt.Fprintf(os.Stderr, "prefix forger %d: %v\n", os.Getpid(), err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	if os.Getenv(envRole) == "worker" {
		if err := runWorker(); err != nil {
			fmt.Fprintf(os.Stderr, "prefix worker %d: %v\n", os.Getpid(), err)
			os.Exit(3)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const (
	stressKeys   = 600
	stressBlocks = 96
	stressBlock  = 4096
)

func stressSize(k Key) int { return 64 + int(k[0])*15 } // 64 B to 3889 B

func runWorker() error {
	c, err := tiertest.Attach(os.Getenv(envDevices), "worker")
	if err != nil {
		return err
	}
	s, err := Open(c, "stress")
	if err != nil {
		return err
	}
	run, _ := time.ParseDuration(os.Getenv(envRun))
	var seed uint64
	fmt.Sscan(os.Getenv(envSeed), &seed)
	rng := rand.New(rand.NewPCG(seed, uint64(os.Getpid())))
	for end := time.Now().Add(run); time.Now().Before(end); {
		err := workerStep(s, rng)
		if errors.Is(err, tier.ErrLeaseLost) {
			// Starved past the lease timeout (a loaded machine, -race) and
			// reaped while alive: fenced, it stops, as a client of a
			// server would before attaching again. It must not go on.
			fmt.Fprintf(os.Stderr, "prefix worker %d: reaped while alive, stopping: %v\n", os.Getpid(), err)
			return nil
		}
		if err != nil {
			return err
		}
	}
	s.Close()
	return c.Close()
}

// workerStep does one random operation and checks every payload it reads
// against the payload the key must have: a torn, stale or misplaced block
// fails the run even if its checksum were to match.
func workerStep(s *Store, rng *rand.Rand) error {
	keys := make([]Key, 1+rng.IntN(6))
	base := rng.IntN(stressKeys)
	for i := range keys {
		keys[i] = keyN((base + i) % stressKeys)
	}
	switch rng.IntN(10) {
	case 0, 1, 2, 3:
		payloads := make([][]byte, len(keys))
		for i, k := range keys {
			payloads[i] = payloadFor(k, stressSize(k))
		}
		if _, err := s.Set(keys, payloads); err != nil && !isBenign(err) {
			return err
		}
	case 4, 5, 6, 7:
		hits, err := s.Lookup(keys)
		if err != nil {
			return err
		}
		defer s.Release(hits)
		for _, h := range hits {
			got := make([]byte, h.Len)
			if err := s.r.ReadAt(got, h.Offset); err != nil {
				return err
			}
			if !bytes.Equal(got, payloadFor(h.Key, stressSize(h.Key))) {
				return fmt.Errorf("key %v: pinned payload of %d bytes is not the key's", h.Key, h.Len)
			}
		}
		if rng.IntN(4) == 0 {
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond) // hold the pins a while
		}
	case 8:
		if _, err := s.Delete(keys[:1]); err != nil && !isBenign(err) {
			return err
		}
	case 9:
		s.Exists(keys)
	}
	return nil
}

func isBenign(err error) bool {
	return err == nil || errors.Is(err, ErrPinned) || errors.Is(err, ErrNoSpace)
}

// TestMultiProcessStressWithKills runs workers that insert, look up, pin,
// release, delete and evict at random while a killer SIGKILLs them at
// random points (mid-lock, mid-reservation, with pins held) and respawns
// them. A manager reaps the dead, as the daemon does. Afterwards every
// invariant must hold.
func TestMultiProcessStressWithKills(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process stress test")
	}
	run := 8 * time.Second
	if *soak > 0 {
		run = *soak
	}
	dir := t.TempDir()
	b, _ := tier.ParseBacking("file:" + dir + "/tier")
	g := tier.DefaultGeometry()
	g.DeviceSize, g.ChunkSize, g.Stripe, g.ClientsPerNode = 16<<20, 256<<10, 1<<20, 32
	g.LeaseTimeout = 2 * time.Second
	r, err := tier.Format(tier.Options{Devices: []tier.Backing{b}, Geometry: g})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m, err := tier.NewManager(r, tier.ManagerOptions{GrantLocks: true, Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var mwg sync.WaitGroup
	mwg.Add(1)
	go func() { defer mwg.Done(); m.Run(ctx) }()
	defer func() { cancel(); mwg.Wait() }()
	s, err := Create(m.Client(), Config{Name: "stress", Blocks: stressBlocks, BlockBytes: stressBlock, PinsPerClient: 64, Shards: 4})
	if err != nil {
		t.Fatal(err)
	}
	usageBefore := r.Usage()

	kills, failures := runKiller(t, r, 4, run)
	t.Logf("%v with 4 workers: %d SIGKILLs", run, kills)
	if failures > 0 {
		t.Fatalf("%d workers found a wrong payload or failed", failures)
	}
	waitReaped(t, r, m.Client().Token())
	if _, err := s.Reclaim(); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, s)
	st := s.Stats()
	t.Logf("stats: %+v (hit rate %.2f)", st, st.HitRate())
	if st.PinsHeld != 0 || st.Reserved != 0 || st.ChecksumFailures != 0 {
		t.Fatalf("after the run: %d pins, %d reservations, %d checksum failures", st.PinsHeld, st.Reserved, st.ChecksumFailures)
	}
	if st.Inserts == 0 || st.Hits == 0 || st.Evictions == 0 {
		t.Fatalf("the run did too little to mean anything: %+v", st)
	}
	if u := r.Usage(); u.UsedChunks != usageBefore.UsedChunks || u.SharedChunks != usageBefore.SharedChunks {
		t.Fatalf("tier chunks: %+v before, %+v after", usageBefore, u)
	}
}

// runKiller keeps n workers running for run, killing one at a random moment
// every 30–200 ms and starting a replacement. It returns the kills and the
// workers that exited with a failure of their own.
func runKiller(t *testing.T, r *tier.Region, n int, run time.Duration) (kills, failures int) {
	devs := strings.Join(r.Info().Devices, ",")
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(run)
	start := func(seed int) *exec.Cmd {
		left := time.Until(end)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envRole+"=worker", envDevices+"="+devs,
			envRun+"="+left.String(), fmt.Sprintf("%s=%d", envSeed, seed))
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := cmd.Wait()
			if ee, ok := err.(*exec.ExitError); ok && ee.Sys().(syscall.WaitStatus).Signaled() {
				return
			}
			if err != nil {
				mu.Lock()
				failures++
				mu.Unlock()
			}
		}()
		return cmd
	}
	workers := make([]*exec.Cmd, n)
	for i := range workers {
		workers[i] = start(i)
	}
	rng := rand.New(rand.NewPCG(7, 7))
	for seed := n; time.Now().Add(300 * time.Millisecond).Before(end); seed++ {
		time.Sleep(time.Duration(30+rng.IntN(170)) * time.Millisecond)
		i := rng.IntN(n)
		workers[i].Process.Signal(syscall.SIGKILL)
		kills++
		workers[i] = start(seed)
	}
	wg.Wait()
	return kills, failures
}

// waitReaped waits until every lease but keep's is gone.
func waitReaped(t *testing.T, r *tier.Region, keep uint64) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		live := 0
		for _, l := range r.Leases() {
			if l.Slot != r.TokenSlot(keep) {
				live++
			}
		}
		if live == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d leases not reaped: %+v", live, r.Leases())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runReserver reserves the blocks of takeoverKeys, as an uplink does
// before its transfer, says so, and waits to be killed.
func runReserver() error {
	c, err := tiertest.Attach(os.Getenv(envDevices), "reserver")
	if err != nil {
		return err
	}
	s, err := Open(c, "m")
	if err != nil {
		return err
	}
	res, err := s.Reserve(takeoverKeys(), []int64{100, 100, 100})
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.Status != Reserved {
			return fmt.Errorf("reserve: %v", r.Status)
		}
	}
	fmt.Println("reserved")
	select {}
}

func takeoverKeys() []Key { return []Key{StringKey("a"), StringKey("b"), StringKey("c")} }

// TestDeadReserversKeysAreTakenOver: a process that reserved keys and was
// killed before it published, with no daemon to reclaim what it held,
// leaves its lease live; the next insert of those keys, in a process that
// sees the reserver is gone, takes them over (an uplink killed mid-fill
// used to leave them reserved for good, and a fresh uplink filled none).
// A reserver that is only stopped keeps them: it may still write.
func TestDeadReserversKeysAreTakenOver(t *testing.T) {
	for _, kill := range []bool{true, false} {
		t.Run(fmt.Sprintf("killed=%v", kill), func(t *testing.T) {
			r, c := testTier(t, 1)
			s := testStore(t, c, 16, 4096)
			holdingChild(t, r, "reserver", "reserved", kill)
			res, err := s.Reserve(takeoverKeys(), []int64{100, 100, 100})
			if err != nil {
				t.Fatal(err)
			}
			want := Reserved
			if !kill {
				want = Exists
			}
			for i, got := range res {
				if got.Status != want {
					t.Fatalf("key %d: %v, want %v", i, got.Status, want)
				}
			}
			if kill {
				payload := bytes.Repeat([]byte{7}, 100)
				crcs := make([]uint32, len(res))
				for i := range res {
					if err := r.WriteAt(payload, res[i].Offset); err != nil {
						t.Fatal(err)
					}
					crcs[i] = s.Checksum(res[i].Key, payload)
				}
				if err := s.Publish(res, crcs); err != nil {
					t.Fatal(err)
				}
				if n := s.Exists(takeoverKeys()); n != 3 {
					t.Fatalf("%d of 3 keys after the takeover", n)
				}
			}
		})
	}
}

// runPinner pins every key of takeoverKeys (a reader between its lookup
// and its release, as a decode landing pages), says so, and waits.
func runPinner() error {
	c, err := tiertest.Attach(os.Getenv(envDevices), "pinner")
	if err != nil {
		return err
	}
	s, err := Open(c, "m")
	if err != nil {
		return err
	}
	hits, err := s.Lookup(takeoverKeys())
	if err != nil {
		return err
	}
	if len(hits) != len(takeoverKeys()) {
		return fmt.Errorf("pinned %d of %d keys", len(hits), len(takeoverKeys()))
	}
	fmt.Println("pinned")
	select {}
}

// TestADeadReadersPinsHoldNothing (issue 64, defect 7): a reader killed
// while it pinned entries, with no daemon to reap its lease, kept them
// pinned until a repair: they could be neither evicted nor deleted, and a
// full index refused inserts. Its pins count for nothing once this process
// sees it gone; a reader that is only stopped keeps them (it may resume
// and read).
func TestADeadReadersPinsHoldNothing(t *testing.T) {
	for _, kill := range []bool{true, false} {
		t.Run(fmt.Sprintf("killed=%v", kill), func(t *testing.T) {
			r, c := testTier(t, 1)
			s := testStore(t, c, 3, 64)
			keys := takeoverKeys()
			if st, err := s.Set(keys, payloadsFor(keys, 64)); err != nil || st[2] != Reserved {
				t.Fatalf("set: %v, %v", st, err)
			}
			holdingChild(t, r, "pinner", "pinned", kill)
			cold := []Key{keyN(42)}
			st, err := s.Set(cold, payloadsFor(cold, 64))
			want := Reserved
			if !kill {
				want = NoSpace
			}
			if err != nil || st[0] != want {
				t.Fatalf("an insert into the full index: %v, %v; want %v", st, err, want)
			}
			_, err = s.Delete(keys[1:2])
			if kill && err != nil || !kill && !errors.Is(err, ErrPinned) {
				t.Fatalf("delete of an entry the pinner pinned: %v", err)
			}
			mustCheck(t, s)
		})
	}
}

// holdingChild starts a child of role on r's tier, waits until it says
// said (it holds what its role takes), and then kills it (kill) or stops
// it (SIGSTOP, continued when the test ends).
func holdingChild(t *testing.T, r *tier.Region, role, said string, kill bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"="+role, envDevices+"="+strings.Join(r.Info().Devices, ","))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGCONT); cmd.Process.Kill(); cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != said+"\n" {
		t.Fatalf("%s said %q, %v", role, line, err)
	}
	if kill {
		cmd.Process.Kill()
		cmd.Wait()
	} else {
		cmd.Process.Signal(syscall.SIGSTOP)
	}
}
