package tier

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// simHost is one simulated host: its own mapping of the tier with caches
// of its own (hostSim) and a client on it.
type simHost struct {
	r      *Region
	c      *Client
	chunks map[int64]Offset // allocations it holds: first chunk → offset
	sizes  map[int64]int64
}

func openSimHost(t *testing.T, b Backing, node int) *simHost {
	t.Helper()
	r, err := Open(Options{Devices: []Backing{b}, Coherence: Shared})
	if err != nil {
		t.Fatal(err)
	}
	r.simulateHost()
	t.Cleanup(func() { r.Close() })
	// A heartbeat would write the private view from another goroutine;
	// these runs are far shorter than an hour.
	c, err := r.Attach(ClientOptions{Node: node, Name: fmt.Sprint("host", node), Heartbeat: time.Hour, LockWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &simHost{r: r, c: c, chunks: map[int64]Offset{}, sizes: map[int64]int64{}}
}

// TestHostsWithoutSharedCaches runs two hosts whose caches the tier does
// not keep coherent (hostSim) through the tier's shared structures in
// turn: chunk allocation and freeing, shared objects in the directory,
// clients attaching and closing (their chunks freed with them), user
// locks granted by node 0's lock manager. No chunk may be handed to
// both, each sees the other's objects, every lock is granted, and a third
// view of memory (what another host reads) holds exactly their chunks and
// objects. Without the refresh of the owner and bitmap lines before an
// allocation changes them, a host wrote back its stale copy of a line
// naming the other's chunks free: "chunk 0 owned by 0x0" at the free. A missing refresh or publish in the allocator, directory,
// lease or lock code shows here; on one coherent machine it cannot.
func TestHostsWithoutSharedCaches(t *testing.T) {
	for seed := range uint64(4) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel() // most of a run is waits for the lock manager's grants
			testHostsWithoutSharedCaches(t, seed)
		})
	}
}

func testHostsWithoutSharedCaches(t *testing.T, seed uint64) {
	g := testGeometry()
	g.Nodes = 2
	b := fileBacking(t)
	third, err := Format(Options{Devices: []Backing{b}, Geometry: g, Coherence: Shared})
	if err != nil {
		t.Fatal(err)
	}
	defer third.Close()
	// Node 0's daemon grants the global locks, from the tier's own memory.
	m, err := NewManager(third, ManagerOptions{Node: 0, GrantLocks: true, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- m.Run(ctx) }()
	defer func() { stop(); <-ran }()
	// The directory's objects all name one shared chunk, set aside here.
	objChunk, err := m.Client().AllocChunks(1)
	if err == nil {
		err = m.Client().ShareChunks(objChunk, 1)
	}
	if err != nil {
		t.Fatal(err)
	}
	hosts := [2]*simHost{openSimHost(t, b, 0), openSimHost(t, b, 1)}
	rng := rand.New(rand.NewPCG(seed, 7))
	first, _ := third.chunkIndex(objChunk)
	owner := map[int64]int{first: -1} // chunk → the host holding it (-1: the objects')
	objects := map[string]bool{}
	for step := range 400 {
		h := rng.IntN(2)
		s := hosts[h]
		switch op := rng.IntN(11); {
		case op < 4: // allocate
			n := 1 + rng.Int64N(3)
			off, err := s.c.AllocChunks(n)
			if err != nil {
				continue // full: frees come
			}
			first, _ := s.r.chunkIndex(off)
			for i := first; i < first+n; i++ {
				if o, taken := owner[i]; taken {
					t.Fatalf("step %d: host %d was given chunk %d, which host %d holds", step, h, i, o)
				}
				owner[i] = h
			}
			s.chunks[first], s.sizes[first] = off, n
		case op < 7: // free one of its own
			for first, off := range s.chunks {
				if err := s.c.FreeChunks(off, s.sizes[first]); err != nil {
					t.Fatalf("step %d: host %d frees chunks %d+%d: %v", step, h, first, s.sizes[first], err)
				}
				for i := first; i < first+s.sizes[first]; i++ {
					delete(owner, i)
				}
				delete(s.chunks, first)
				break
			}
		case op < 9: // a shared object in the directory, or one removed
			name := fmt.Sprint("obj", rng.IntN(6))
			if objects[name] {
				if err := s.c.DirDelete(name); err != nil {
					t.Fatalf("step %d: host %d deletes %q, which host %d's side put there: %v", step, h, name, 1-h, err)
				}
				delete(objects, name)
				continue
			}
			e := DirEntry{Name: name, Kind: 5, Offset: objChunk, Size: s.r.ChunkSize()}
			if err := s.c.DirPut(e); err != nil {
				t.Fatalf("step %d: host %d puts %q: %v", step, h, name, err)
			}
			objects[name] = true
		case op == 10: // a client comes and goes on this host, holding a chunk
			extra, err := s.r.Attach(ClientOptions{Node: h, Name: "extra", Heartbeat: time.Hour, LockWait: 5 * time.Second})
			if err != nil {
				t.Fatalf("step %d: attach on host %d: %v", step, h, err)
			}
			if _, err := extra.AllocChunks(1); err != nil {
				t.Fatalf("step %d: the extra client allocates: %v", step, err)
			}
			if live := liveLeases(third); live != 3 {
				t.Fatalf("step %d: the tier shows %d live leases with the extra client, want 3", step, live)
			}
			if err := extra.Close(); err != nil {
				t.Fatalf("step %d: the extra client closes: %v", step, err)
			}
		default: // a user lock, taken by one host and then by the other
			for _, k := range []int{h, 1 - h} {
				if err := hosts[k].c.Lock(FirstUserLock); err != nil {
					t.Fatalf("step %d: host %d locks: %v", step, k, err)
				}
				if err := hosts[k].c.Unlock(FirstUserLock); err != nil {
					t.Fatalf("step %d: host %d unlocks: %v", step, k, err)
				}
			}
		}
	}
	for h, s := range hosts {
		for _, name := range []string{"obj0", "obj1", "obj2", "obj3", "obj4", "obj5"} {
			_, err := s.r.DirLookup(name)
			if (err == nil) != objects[name] {
				t.Fatalf("host %d looks up %q: %v, want present %v", h, name, err, objects[name])
			}
		}
	}
	for i := range third.l.ChunkCount {
		if _, held := owner[i]; third.chunkUsed(i) != held {
			t.Fatalf("chunk %d: the tier's bitmap says used=%v, the hosts hold it: %v", i, third.chunkUsed(i), held)
		}
	}
	if live := liveLeases(third); live != 2 {
		t.Fatalf("the tier shows %d live leases at the end, want the 2 hosts' clients", live)
	}
	list, err := third.DirList()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != len(objects) {
		t.Fatalf("the tier's directory holds %d entries, the hosts put %d: %+v", len(list), len(objects), list)
	}
}

// liveLeases counts the live leases the tier's memory shows, the lock
// manager's own aside.
func liveLeases(r *Region) int {
	n := 0
	for _, inf := range r.Leases() {
		if inf.State == "live" && !inf.Daemon {
			n++
		}
	}
	return n
}
