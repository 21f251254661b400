package tier

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestChunkAllocExhaustionAndReuse(t *testing.T) {
	r := formatTest(t, testGeometry())
	c := attachTest(t, r, 0)
	total := r.Info().ChunkCount
	var offs []Offset
	for {
		off, err := c.AllocChunks(1)
		if errors.Is(err, ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, off)
	}
	if int64(len(offs)) != total {
		t.Fatalf("allocated %d of %d chunks before exhaustion", len(offs), total)
	}
	seen := map[Offset]bool{}
	for _, o := range offs {
		if seen[o] {
			t.Fatalf("chunk %v handed out twice", o)
		}
		seen[o] = true
	}
	if err := c.FreeChunks(offs[3], 1); err != nil {
		t.Fatal(err)
	}
	if err := c.FreeChunks(offs[3], 1); !errors.Is(err, ErrInvalidFree) {
		t.Errorf("double free: %v, want ErrInvalidFree", err)
	}
	if _, err := c.AllocChunks(2); !errors.Is(err, ErrExhausted) {
		t.Errorf("2 contiguous with 1 free: %v, want ErrExhausted", err)
	}
	off, err := c.AllocChunks(1)
	if err != nil || off != offs[3] {
		t.Errorf("realloc got %v, %v; want %v", off, err, offs[3])
	}
	if _, err := c.AllocChunks(0); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("alloc 0: %v", err)
	}
	if err := c.FreeChunks(offs[0]+1, 1); !errors.Is(err, ErrOutOfBounds) {
		t.Errorf("free misaligned: %v", err)
	}
	other := attachTest(t, r, 0)
	if err := other.FreeChunks(offs[1], 1); !errors.Is(err, ErrNotOwner) {
		t.Errorf("free another client's chunk: %v, want ErrNotOwner", err)
	}
	c.Close()
	if u := r.Usage(); u.UsedChunks != 0 {
		t.Errorf("after close %d chunks still used", u.UsedChunks)
	}
}

func TestPrivateChunksByOwner(t *testing.T) {
	r := formatTest(t, testGeometry())
	a, b := attachTest(t, r, 0), attachTest(t, r, 0)
	if _, err := a.AllocChunks(2); err != nil {
		t.Fatal(err)
	}
	off, err := b.AllocChunks(3)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.ShareChunks(off, 1); err != nil {
		t.Fatal(err)
	}
	want := map[int]int64{a.Slot(): 2, b.Slot(): 2}
	if got := r.PrivateChunks(); !maps.Equal(got, want) {
		t.Errorf("private chunks %v, want %v (the shared chunk counted for no one)", got, want)
	}
	a.Close()
	delete(want, a.Slot())
	if got := r.PrivateChunks(); !maps.Equal(got, want) {
		t.Errorf("after a closed: %v, want %v", got, want)
	}
}

func TestChunkRunsSpanDevices(t *testing.T) {
	g := testGeometry()
	r := formatTest(t, g, shmBacking(t), shmBacking(t))
	c := attachTest(t, r, 0)
	per := g.Stripe / g.ChunkSize
	off, err := c.AllocChunks(2 * per)
	if err != nil {
		t.Fatal(err)
	}
	d0, _, _, _ := r.Locate(off)
	d1, _, _, _ := r.Locate(off + Offset(g.Stripe))
	if d0 == d1 {
		t.Errorf("a two-stripe run stayed on device %d", d0)
	}
}

func TestHeapRandomized(t *testing.T) {
	r := formatTest(t, testGeometry())
	c := attachTest(t, r, 0)
	h := NewHeap(c)
	rng := rand.New(rand.NewPCG(1, 2))
	type block struct {
		off  Offset
		size int64
		fill byte
	}
	var live []block
	check := func(b block) {
		got := make([]byte, b.size)
		if err := r.ReadAt(got, b.off); err != nil {
			t.Fatal(err)
		}
		for i, v := range got {
			if v != b.fill {
				t.Fatalf("block %v+%d byte %d = %d, want %d (overlap)", b.off, b.size, i, v, b.fill)
			}
		}
	}
	for step := 0; step < 5000; step++ {
		if len(live) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(live))
			b := live[i]
			check(b)
			if err := h.Free(b.off); err != nil {
				t.Fatal(err)
			}
			live = append(live[:i], live[i+1:]...)
			continue
		}
		size := int64(1 + rng.IntN(4096))
		if rng.IntN(50) == 0 {
			size = int64(200<<10 + rng.IntN(400<<10)) // beyond half a chunk: whole chunks
		}
		off, err := h.Alloc(size)
		if errors.Is(err, ErrExhausted) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if off%LineSize != 0 {
			t.Fatalf("alloc %d at %v not line-aligned", size, off)
		}
		if bs, err := h.BlockSize(off); err != nil || bs < size {
			t.Fatalf("block size %d, %v for a %d-byte alloc", bs, err, size)
		}
		b := block{off, size, byte(step)}
		fill := make([]byte, size)
		for i := range fill {
			fill[i] = b.fill
		}
		if err := r.WriteAt(fill, off); err != nil {
			t.Fatal(err)
		}
		live = append(live, b)
	}
	for _, b := range live {
		check(b)
		if err := h.Free(b.off); err != nil {
			t.Fatal(err)
		}
	}
	// One empty slab per class may stay cached; nothing else.
	if used := r.Usage().UsedChunks; used > int64(len(h.classes)) {
		t.Errorf("%d chunks still used after freeing everything", used)
	}
	if err := h.Free(live[0].off); !errors.Is(err, ErrInvalidFree) {
		t.Errorf("double free: %v, want ErrInvalidFree", err)
	}
	if _, err := h.Alloc(0); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("alloc 0: %v", err)
	}
	if err := h.Free(1); !errors.Is(err, ErrInvalidFree) {
		t.Errorf("free of header offset: %v", err)
	}
}

func TestDirectory(t *testing.T) {
	g := testGeometry()
	g.DirEntries = 3
	r := formatTest(t, g)
	c := attachTest(t, r, 0)
	for i, name := range []string{"a", "b", "c"} {
		if err := c.DirPut(DirEntry{Name: name, Kind: 1, Offset: r.DataStart(), Size: int64(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DirPut(DirEntry{Name: "d", Kind: 1}); !errors.Is(err, ErrDirFull) {
		t.Errorf("put into full directory: %v", err)
	}
	if err := c.DirPut(DirEntry{Name: "a", Kind: 1}); !errors.Is(err, ErrExists) {
		t.Errorf("duplicate: %v", err)
	}
	if err := c.DirDelete("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.DirLookup("b"); !errors.Is(err, ErrNotFound) {
		t.Errorf("lookup deleted: %v", err)
	}
	if err := c.DirPut(DirEntry{Name: "d", Kind: 2, Size: 5}); err != nil {
		t.Fatal(err)
	}
	list, err := r.DirList()
	if err != nil || len(list) != 3 {
		t.Fatalf("list %v %v", list, err)
	}
	for _, bad := range []DirEntry{
		{Name: "", Kind: 1},
		{Name: string(make([]byte, 65)), Kind: 1},
		{Name: "ctl\x01", Kind: 1},
		{Name: "zero-kind", Kind: 0},
		{Name: "huge", Kind: 1, Offset: 1, Size: r.Size()},
	} {
		if err := c.DirPut(bad); err == nil {
			t.Errorf("put %q accepted", bad.Name)
		}
	}
	// A writer that died mid-update leaves an odd sequence: readers skip it
	// and the next writer reuses the entry.
	e, _ := r.DirLookup("a")
	seq := u32At(r.dirLine(0), 0)
	*seq |= 1
	if _, err := r.DirLookup("a"); !errors.Is(err, ErrNotFound) {
		t.Errorf("torn entry visible: %v", err)
	}
	if err := c.DirPut(DirEntry{Name: "e", Kind: 1}); err != nil {
		t.Fatalf("put over torn entry: %v", err)
	}
	_ = e
}

func TestLockBasics(t *testing.T) {
	r := formatTest(t, testGeometry())
	a := attachTest(t, r, 0)
	b := attachTest(t, r, 0)
	if b.LockBusy(FirstUserLock) || b.LockBusy(-1) || b.LockBusy(r.Info().Geometry.LockSlots) {
		t.Error("a free lock, or an id out of range, reads as busy")
	}
	if err := a.Lock(FirstUserLock); err != nil {
		t.Fatal(err)
	}
	if !b.LockBusy(FirstUserLock) || !a.LockBusy(FirstUserLock) || b.LockBusy(FirstUserLock+1) {
		t.Error("LockBusy: held lock not busy, or a free one busy")
	}
	if err := b.Unlock(FirstUserLock); !errors.Is(err, ErrNotOwner) {
		t.Errorf("unlock by non-holder: %v", err)
	}
	if ls := r.Locks(); len(ls) != 1 || ls[0].Holder != a.Slot() {
		t.Errorf("locks %+v, want held by slot %d", ls, a.Slot())
	}
	// Locks do not nest: a second Lock by the holder is an error at once,
	// not a wait for itself (it used to spin until the lease was reaped).
	if err := a.Lock(FirstUserLock); !errors.Is(err, ErrLockHeld) {
		t.Errorf("lock held by the caller: %v", err)
	}
	if err := a.Unlock(FirstUserLock); err != nil {
		t.Fatal(err)
	}
	if b.LockBusy(FirstUserLock) {
		t.Error("lock let go still reads as busy")
	}
	if err := a.Lock(r.Info().Geometry.LockSlots); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("lock id out of range: %v", err)
	}
	if _, err := r.Attach(ClientOptions{Node: 1}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("attach to missing node: %v", err)
	}
}

func TestLeaseTableFull(t *testing.T) {
	g := testGeometry()
	g.ClientsPerNode = 2
	r := formatTest(t, g)
	attachTest(t, r, 0)
	attachTest(t, r, 0)
	if _, err := r.Attach(ClientOptions{}); !errors.Is(err, ErrLeaseTable) {
		t.Errorf("third client: %v, want ErrLeaseTable", err)
	}
}

// TestOrphanedLockIsReleased: a lock word naming no live lease (damage, or
// a client that died between reaper passes) is flagged by Locks and taken
// over by the next waiter, and by the reaper's pass when nobody waits. It
// used to hang every writer, forever.
func TestOrphanedLockIsReleased(t *testing.T) {
	r := formatTest(t, testGeometry())
	a := attachTest(t, r, 0)
	for _, garbage := range []uint64{0x0101010101010101, uint64(1)<<32 | 9999, ^uint64(0)} {
		_, local := r.lockLines(FirstUserLock, 0)
		atomic.StoreUint64(u64At(local, 0), garbage)
		if ls := r.Locks(); len(ls) != 1 || !ls[0].Orphan {
			t.Fatalf("holder %#x: locks %+v, want one orphan", garbage, ls)
		}
		done := make(chan error, 1)
		go func() { done <- a.Lock(FirstUserLock) }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("holder %#x: %v", garbage, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("holder %#x: the waiter still waits", garbage)
		}
		if err := a.Unlock(FirstUserLock); err != nil {
			t.Fatal(err)
		}
	}
	m, err := NewManager(r, ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Client().Close()
	_, local := r.lockLines(FirstUserLock+1, 0)
	atomic.StoreUint64(u64At(local, 0), 0x0101010101010101)
	m.ReapOnce()
	if ls := r.Locks(); len(ls) != 0 {
		t.Fatalf("after a reaper pass: %+v", ls)
	}
}

// TestLockWaitEnds: a live holder that never lets go makes a waiter's
// LockContext end with ErrLockTimeout naming the holder, not hang.
func TestLockWaitEnds(t *testing.T) {
	r := formatTest(t, testGeometry())
	a := attachTest(t, r, 0)
	b := attachTest(t, r, 0)
	if err := a.Lock(FirstUserLock); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err := b.LockContext(ctx, FirstUserLock)
	if !errors.Is(err, ErrLockTimeout) || !strings.Contains(err.Error(), fmt.Sprintf("client slot %d", a.Slot())) {
		t.Fatalf("wait on a held lock: %v", err)
	}
}

// TestTimedOutGrantIsResumed: on a tier of two nodes with no lock manager
// running, Lock times out awaiting the grant, its request left posted.
// Once a manager runs, the same client's next Lock gets the lock (it
// failed with ErrLockHeld on every try before: the client was wedged on
// that lock until it closed).
func TestTimedOutGrantIsResumed(t *testing.T) {
	g := testGeometry()
	g.Nodes = 2
	r := formatTest(t, g)
	c, err := r.Attach(ClientOptions{Node: 1, Name: "waiter", LockWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Lock(FirstUserLock); !errors.Is(err, ErrLockTimeout) {
		t.Fatalf("lock with no manager: %v, want ErrLockTimeout", err)
	}
	if err := c.Lock(FirstUserLock); !errors.Is(err, ErrLockTimeout) {
		t.Fatalf("again with no manager: %v, want ErrLockTimeout", err)
	}
	runManager(t, r, ManagerOptions{Node: 0, GrantLocks: true})
	if err := c.Lock(FirstUserLock); err != nil {
		t.Fatalf("lock once a manager grants: %v", err)
	}
	if err := c.Unlock(FirstUserLock); err != nil {
		t.Fatal(err)
	}
	if err := c.Lock(FirstUserLock); err != nil {
		t.Fatalf("a second lock after the resumed one: %v", err)
	}
	if err := c.Unlock(FirstUserLock); err != nil {
		t.Fatal(err)
	}
}
