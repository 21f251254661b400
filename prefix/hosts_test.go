package prefix

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/cxltier/cxltier/tier"
)

// TestHostsWithoutSharedCaches runs two handles on one index as two hosts
// whose caches the tier does not keep coherent (cacheSim): each sees the
// other's metadata only through refresh and publish. They insert (with
// eviction), look up, read and delete in turn; every payload read must be
// the one stored under its key, and the index must check clean from the
// tier's own bytes, as a third host would read them.
func TestHostsWithoutSharedCaches(t *testing.T) {
	for _, shards := range []int{1, 2} {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("shards%d/seed%d", shards, seed), func(t *testing.T) { testHostsWithoutSharedCaches(t, shards, seed) })
		}
	}
}

func testHostsWithoutSharedCaches(t *testing.T, shards int, seed uint64) {
	nc, hosts := simulatedHosts(t, Config{Name: "m", Blocks: 24, BlockBytes: 128, PinsPerClient: 256, Shards: shards})
	rng := rand.New(rand.NewPCG(uint64(shards), seed))
	var stored []Key
	dst := make([][]byte, 4)
	for i := range dst {
		dst[i] = make([]byte, 128)
	}
	// Each host holds the pins of one lookup for a few steps, while the
	// other inserts, evicts and deletes; the payloads must stay put.
	var held [2][]Hit
	var heldUntil [2]int
	release := func(h int) {
		for _, hit := range held[h] {
			got := make([]byte, hit.Len)
			if err := hosts[h].r.ReadAt(got, hit.Offset); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, payloadFor(hit.Key, 128)) {
				t.Fatalf("host %d: the payload of %v (block %d) changed while pinned", h, hit.Key, hit.Block)
			}
		}
		hosts[h].Release(held[h])
		held[h] = nil
	}
	for step := range 600 {
		h := step % 2
		s := hosts[h]
		if held[h] != nil && step >= heldUntil[h] {
			release(h)
		}
		switch op := rng.IntN(10); {
		case op < 5 || len(stored) < 4: // insert one to three new keys
			keys := make([]Key, 1+rng.IntN(3))
			for i := range keys {
				keys[i] = keyN(10000 + len(stored))
				stored = append(stored, keys[i])
			}
			if _, err := s.Set(keys, payloadsFor(keys, 128)); err != nil {
				t.Fatalf("step %d: set: %v", step, err)
			}
		case op < 8: // read back a few keys stored by either host
			keys := make([]Key, 4)
			for i := range keys {
				keys[i] = stored[rng.IntN(len(stored))]
			}
			for i := range keys { // one at a time: Get serves a prefix
				n, err := s.Get(keys[i:i+1], dst[i:i+1])
				if err != nil {
					t.Fatalf("step %d: get %v: %v", step, keys[i], err)
				}
				if n == 1 && !bytes.Equal(dst[i], payloadFor(keys[i], 128)) {
					t.Fatalf("step %d: host %d got another key's payload for %v", step, h, keys[i])
				}
			}
			if held[h] != nil {
				break
			}
			hits, err := s.Lookup(keys[:1+rng.IntN(len(keys))])
			if err != nil {
				t.Fatalf("step %d: lookup: %v", step, err)
			}
			held[h], heldUntil[h] = hits, step+2+rng.IntN(8)
		default:
			if _, err := s.Delete([]Key{stored[rng.IntN(len(stored))]}); err != nil && !errors.Is(err, ErrPinned) {
				t.Fatalf("step %d: delete: %v", step, err)
			}
		}
		if got, want := hosts[1-h].Stats().PinsHeld, len(held[0])+len(held[1]); got != int64(want) {
			t.Fatalf("step %d: the other host counts %d pins held, want %d", step, got, want)
		}
	}
	for h := range hosts {
		release(h)
	}
	checkFromEveryHost(t, nc, hosts[:])
}

// simulatedHosts gives two hosts of one non-coherent tier a handle each on
// index cfg (host 0 creates it), each with caches of its own (cacheSim).
func simulatedHosts(t *testing.T, cfg Config) (*tier.Region, [2]*Store) {
	r, _ := testTier(t, 1)
	nc := openNonCoherent(t, r)
	var hosts [2]*Store
	for h := range hosts {
		c, err := nc.Attach(tier.ClientOptions{Name: fmt.Sprint("host ", h)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if h == 0 {
			hosts[h], err = Create(c, cfg)
		} else {
			hosts[h], err = Open(c, cfg.Name)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { hosts[h].Close() })
		hosts[h].simulateHost(t)
	}
	return nc, hosts
}

// checkFromEveryHost checks the index from each host's handle and from a
// third host's, which reads the tier's bytes as they are, and returns what
// the third host counts.
func checkFromEveryHost(t *testing.T, nc *tier.Region, hosts []*Store) Stats {
	t.Helper()
	for h, s := range hosts {
		if bad, err := s.Check(true); err != nil || len(bad) != 0 {
			t.Fatalf("check by host %d: %v %v", h, bad, err)
		}
	}
	c, err := nc.Attach(tier.ClientOptions{Name: "third host"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	third, err := Open(c, hosts[0].name)
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	mustCheck(t, third)
	return third.Stats()
}

// openNonCoherent opens r's devices again as a non-coherent tier, closed
// at the end of the test after the cleanups registered later (an index
// handle must not outlive its mapping).
func openNonCoherent(t *testing.T, r *tier.Region) *tier.Region {
	t.Helper()
	var devs []tier.Backing
	for _, d := range r.Info().Devices {
		b, err := tier.ParseBacking(d)
		if err != nil {
			t.Fatal(err)
		}
		devs = append(devs, b)
	}
	nc, err := tier.Open(tier.Options{Devices: devs, Coherence: tier.Shared})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// A version-3 index on a tier shared without coherence: serving it is
// refused with the way out, and the way out (a snapshot) still opens it.
func TestOldLayoutRefusedWithoutCoherence(t *testing.T) {
	r, c := testTier(t, 1)
	old, err := create(c, Config{Name: "v3", Blocks: 16, BlockBytes: 64, PinsPerClient: 16}, 3)
	if err != nil {
		t.Fatal(err)
	}
	keys := keysN(4)
	if _, err := old.Set(keys, payloadsFor(keys, 64)); err != nil {
		t.Fatal(err)
	}
	old.Close()
	nc := openNonCoherent(t, r)
	cn, err := nc.Attach(tier.ClientOptions{Name: "host-b"})
	if err != nil {
		t.Fatal(err)
	}
	defer cn.Close()
	if _, err := Open(cn, "v3"); !errors.Is(err, ErrBadIndex) || !strings.Contains(err.Error(), "version 3") || !strings.Contains(err.Error(), "snapshot") {
		t.Fatalf("open of a version-3 index without coherence: %v", err)
	}
	mv, err := OpenToMove(cn, "v3", "")
	if err != nil {
		t.Fatal(err)
	}
	defer mv.Close()
	var file bytes.Buffer
	if info, err := mv.Snapshot(&file, nil); err != nil || info.Entries != 4 {
		t.Fatalf("snapshot to move it: %+v, %v", info, err)
	}
	// On the coherent mapping it still opens as before.
	if s, err := Open(c, "v3"); err != nil {
		t.Fatalf("open on the coherent tier: %v", err)
	} else {
		s.Close()
	}
}

// TestAFillAndASlackOnHostsWithoutSharedCaches (issue 64: the fill's and
// the slack trailer's flushes were untested on a tier several hosts
// share): host 0 fills three blocks in place (one damaged in transit) and
// writes a trailer into a pinned block's slack; every byte it wrote for
// another host to read is flushed (the good blocks whole, the damaged one
// not at all, the slack's bytes), and host 1 finds and reads the two good
// pages through its own caches.
func TestAFillAndASlackOnHostsWithoutSharedCaches(t *testing.T) {
	nc, hosts := simulatedHosts(t, Config{Name: "m", Blocks: 16, BlockBytes: 4096, PinsPerClient: 64})
	type flushed struct {
		off tier.Offset
		n   int64
	}
	var flushes []flushed
	hosts[0].flushedData = func(off tier.Offset, n int64) { flushes = append(flushes, flushed{off, n}) }
	keys := keysN(3)
	sizes := []int64{4000, 1000, 300}
	f, blocks, want := filledAsTransferred(t, hosts[0], keys, sizes)
	blocks[1][10] ^= 1 // damaged in transit
	res := f.res
	ok, err := f.Commit([]bool{true, true, true}, WantChecksums(func(i int) Key { return keys[i] }, want))
	if err != nil || !ok[0] || ok[1] || !ok[2] {
		t.Fatalf("commit: %v, %v", ok, err)
	}
	if len(flushes) != 2 || flushes[0] != (flushed{res[0].Offset, sizes[0]}) || flushes[1] != (flushed{res[2].Offset, sizes[2]}) {
		t.Fatalf("flushed %+v, want the two good blocks whole, %v+%d and %v+%d", flushes, res[0].Offset, sizes[0], res[2].Offset, sizes[2])
	}
	dst := [][]byte{make([]byte, 4096)}
	for _, i := range []int{0, 2} {
		if n, err := hosts[1].Get(keys[i:i+1], dst); err != nil || n != 1 || !bytes.Equal(dst[0][:sizes[i]], payloadFor(keys[i], int(sizes[i]))) {
			t.Fatalf("host 1 reads key %d: %d, %v", i, n, err)
		}
	}
	if n, _ := hosts[1].Get(keys[1:2], dst); n != 0 {
		t.Fatal("host 1 finds the damaged page")
	}
	flushes = nil
	hits, err := hosts[0].Lookup(keys[2:3])
	if err != nil || len(hits) != 1 {
		t.Fatalf("lookup: %v, %v", hits, err)
	}
	defer hosts[0].Release(hits)
	trailer := bytes.Repeat([]byte{0x7e}, 32)
	if wrote, err := hosts[0].WriteSlack(hits[0], trailer); err != nil || !wrote {
		t.Fatalf("write slack: %v, %v", wrote, err)
	}
	at := hits[0].Offset + tier.Offset(hits[0].Len)
	if len(flushes) != 1 || flushes[0] != (flushed{at, 32}) {
		t.Fatalf("the slack's flush: %+v, want %v+32", flushes, at)
	}
	checkFromEveryHost(t, nc, hosts[:])
}
