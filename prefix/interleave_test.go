package prefix

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/cxltier/cxltier/tier"
)

// interleaver runs simulated hosts one at a time, handing the turn on at
// publish and refresh points (cacheSim.yield) to a host a seeded generator
// draws: a schedule of two hosts' steps, reproducible from its seed, in
// which each host sees the other's metadata only as the protocol writes it
// back. Turns pass through channels, so the race detector sees each
// hand-over as a synchronisation.
type interleaver struct {
	rng      *rand.Rand
	wake     []chan struct{}
	finished []bool
	switches int

	// A host may die: at its dieAt-th sync point (0: never) die runs in
	// its stead (the process is gone: its client closes, which releases
	// its locks as a reaper would, and its unpublished lines are lost
	// with its caches) and its goroutine never runs again.
	dieAt  []int
	die    func(h int)
	synced []int
	died   []bool
	all    chan struct{}
}

func newInterleaver(hosts int, seed uint64) *interleaver {
	iv := &interleaver{rng: rand.New(rand.NewPCG(seed, 0x1e4)), finished: make([]bool, hosts),
		dieAt: make([]int, hosts), synced: make([]int, hosts), died: make([]bool, hosts), all: make(chan struct{})}
	for range hosts {
		iv.wake = append(iv.wake, make(chan struct{}))
	}
	return iv
}

// next draws the host to run after h: any unfinished one, or, if
// mustSwitch, any but h (h itself when no other is left).
func (iv *interleaver) next(h int, mustSwitch bool) int {
	var can []int
	for i, done := range iv.finished {
		if !done && !(mustSwitch && i == h) {
			can = append(can, i)
		}
	}
	if len(can) == 0 {
		return h
	}
	return can[iv.rng.IntN(len(can))]
}

// yield is host h's turn ending at a sync point; it returns when h runs again.
func (iv *interleaver) yield(h int, mustSwitch bool) {
	if iv.died[h] {
		return // a dead host's unwinding runs in one piece (run)
	}
	if iv.synced[h]++; iv.synced[h] == iv.dieAt[h] {
		iv.die(h)
		iv.died[h] = true
		// The process is gone. Its goroutine unwinds, so that its holds
		// end, before the turn passes on (run): what its deferred calls
		// still try is a reaped client's, which the fences refuse.
		runtime.Goexit()
	}
	if n := iv.next(h, mustSwitch); n != h {
		iv.switches++
		iv.wake[n] <- struct{}{}
		<-iv.wake[h]
	}
}

// run runs each host's body in its own goroutine, one at a time, and
// returns their errors.
func (iv *interleaver) run(bodies []func() error) []error {
	errs := make([]error, len(bodies))
	for h, body := range bodies {
		go func() {
			defer iv.handOn(h) // on return, and on death's Goexit
			<-iv.wake[h]
			errs[h] = body()
		}()
	}
	iv.wake[0] <- struct{}{}
	<-iv.all
	return errs
}

// handOn ends host h's part: the turn goes to another, or the run ends.
func (iv *interleaver) handOn(h int) {
	iv.finished[h] = true
	if n := iv.next(h, true); n != h {
		iv.wake[n] <- struct{}{}
	} else {
		close(iv.all)
	}
}

// TestInterleavedHostsWithoutSharedCaches is TestHostsWithoutSharedCaches
// with the hosts' steps interleaved at every publish and refresh point:
// one host may stop between any two write-backs or reloads while the other
// inserts, evicts, deletes, looks up and pins. Every payload read must be
// its key's, a pinned payload must not change until released, and the index
// must check clean from the tier's bytes.
func TestInterleavedHostsWithoutSharedCaches(t *testing.T) { runInterleaved(t, false) }

// TestInterleavedHostDies is the interleaved simulation with host 1
// dying at a sync point drawn from the seed (inside a mutation or
// between): its client goes, which releases its locks as a reaper would,
// and what it had not written back is lost with its caches. The other
// host repairs what it left and goes on; the checks are the same.
func TestInterleavedHostDies(t *testing.T) { runInterleaved(t, true) }

// runInterleaved runs the simulation for 16 seeds (2 in -short) at 1 and 2
// shards.
func runInterleaved(t *testing.T, dies bool) {
	seeds := uint64(16)
	if testing.Short() {
		seeds = 2
	}
	for _, shards := range []int{1, 2} {
		for seed := range seeds {
			t.Run(fmt.Sprintf("shards%d/seed%d", shards, seed), func(t *testing.T) {
				testInterleavedHosts(t, shards, seed, dies)
			})
		}
	}
}

func testInterleavedHosts(t *testing.T, shards int, seed uint64, dies bool) {
	const steps, size = 200, 128
	nc, hosts := simulatedHosts(t, Config{Name: "m", Blocks: 16, BlockBytes: size, PinsPerClient: 64, Shards: shards})
	iv := newInterleaver(len(hosts), seed<<8|uint64(shards))
	if dies {
		iv.dieAt[1] = 20 + rand.New(rand.NewPCG(seed, 0xdead)).IntN(3000)
		reaper, err := tier.NewManager(nc, tier.ManagerOptions{SkipPIDCheck: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { reaper.Client().Close() })
		iv.die = func(h int) {
			if _, err := reaper.Reap(hosts[h].c.Slot(), "host died"); err != nil {
				t.Errorf("reap host %d: %v", h, err)
			}
		}
	}
	for h, s := range hosts {
		s.sim.yield = func(mustSwitch bool) { iv.yield(h, mustSwitch) }
	}
	var stored []Key // shared: one host runs at a time
	bodies := make([]func() error, len(hosts))
	for h := range hosts {
		rng := rand.New(rand.NewPCG(seed, uint64(h)))
		bodies[h] = func() error { return interleavedHost(hosts[h], h, rng, steps, size, &stored) }
	}
	for h, err := range iv.run(bodies) {
		if err != nil {
			t.Fatalf("host %d (seed %d, %d switches): %v", h, seed, iv.switches, err)
		}
	}
	var live []*Store
	for h, s := range hosts {
		s.sim.yield = nil
		if !iv.died[h] {
			live = append(live, s)
		}
	}
	if held := checkFromEveryHost(t, nc, live).PinsHeld; held != 0 {
		t.Fatalf("the third host counts %d pins, with every pin released or left by a dead holder", held)
	}
	t.Logf("%d switches between hosts; host 1 died: %v (at sync point %d)", iv.switches, iv.died[1], iv.dieAt[1])
}

// interleavedInsert stores keys' payloads: under one hold of each shard's
// lock (Set of small payloads) or, twoHolds, as large payloads go:
// reserve, write outside the lock, publish.
func interleavedInsert(s *Store, keys []Key, size int64, twoHolds bool) error {
	payloads := payloadsFor(keys, int(size))
	if !twoHolds {
		_, err := s.Set(keys, payloads)
		return err
	}
	sizes := make([]int64, len(keys))
	for i := range sizes {
		sizes[i] = size
	}
	res, err := s.Reserve(keys, sizes)
	if err != nil {
		return fmt.Errorf("reserve: %w", err)
	}
	held, err := s.hold("test")
	if err != nil {
		return err
	}
	defer held.Done()
	crcs := make([]uint32, len(res))
	for i, r := range res {
		if r.Status == Reserved {
			if crcs[i], err = s.writePayload(held, &res[i].Key, r.Offset, size, [][]byte{payloads[i]}); err != nil {
				return err
			}
		}
	}
	if err := s.Publish(res, crcs); err != nil {
		return fmt.Errorf("publish: %w", err)
	}
	return nil
}

// retakePins is claimPins by the next holder of s's lease slot, whose
// previous holder died holding its pins: the table's token is another's
// (here: none) when the new holder claims it.
func retakePins(s *Store) error {
	off := s.g.PinsOff + int64(s.slot)*s.g.PinStride
	atomic.StoreUint64(u64At(s.myPins, pinHdrToken), 0)
	s.publishMeta(off, pinHeaderSize)
	return s.claimPins()
}

// recent draws one of the last keys stored, most of which the index
// (16 blocks) still holds: reads, pins and deletes meet live entries, and
// each other.
func recent(stored []Key, rng *rand.Rand) Key {
	return stored[len(stored)-1-rng.IntN(min(len(stored), 20))]
}

// interleavedHost is one host's steps: inserts, reads checked byte for
// byte, lookups whose pins it holds for a few steps (their payloads must
// stay put) and deletes.
func interleavedHost(s *Store, h int, rng *rand.Rand, steps int, size int64, stored *[]Key) error {
	var held []Hit
	heldUntil := 0
	release := func() error {
		defer func() { s.Release(held); held = nil }()
		for _, hit := range held {
			got := make([]byte, hit.Len)
			if err := s.r.ReadAt(got, hit.Offset); err != nil {
				return err
			}
			if !bytes.Equal(got, payloadFor(hit.Key, int(size))) {
				return fmt.Errorf("the payload of %v (block %d) changed while pinned", hit.Key, hit.Block)
			}
		}
		return nil
	}
	dst := [][]byte{make([]byte, size)}
	for step := range steps {
		if held != nil && step >= heldUntil {
			if err := release(); err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
		}
		switch op := rng.IntN(12); {
		case op < 4 || len(*stored) < 4:
			keys := make([]Key, 1+rng.IntN(3))
			for i := range keys {
				keys[i] = keyN(20000 + len(*stored))
				*stored = append(*stored, keys[i])
			}
			if err := interleavedInsert(s, keys, size, rng.IntN(2) == 0); err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
		case op < 6:
			k := recent(*stored, rng)
			dst[0] = dst[0][:size]
			n, err := s.Get([]Key{k}, dst)
			if err != nil {
				return fmt.Errorf("step %d: get %v: %w", step, k, err)
			}
			if n == 1 && !bytes.Equal(dst[0], payloadFor(k, int(size))) {
				return fmt.Errorf("step %d: got another key's payload for %v", step, k)
			}
		case op < 9:
			if held != nil {
				break
			}
			keys := make([]Key, 1+rng.IntN(3))
			for i := range keys {
				keys[i] = recent(*stored, rng)
			}
			hits, err := s.Lookup(keys)
			if err != nil {
				return fmt.Errorf("step %d: lookup: %w", step, err)
			}
			held, heldUntil = hits, step+1+rng.IntN(6)
		case op == 11 && rng.IntN(3) == 0:
			// The host's process dies with pins held and its lease slot's
			// next client takes the pin table over: the records left
			// behind must not count as the new holder's pins.
			if err := retakePins(s); err != nil {
				return fmt.Errorf("step %d: take the pin table over: %w", step, err)
			}
			held = nil
		default:
			k := recent(*stored, rng)
			if _, err := s.Delete([]Key{k}); err != nil && !errors.Is(err, ErrPinned) {
				return fmt.Errorf("step %d: delete: %w", step, err)
			}
		}
	}
	return release()
}
