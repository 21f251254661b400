package tier

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAudit: a sound region has no findings; each kind of damage a reader
// survives silently — an object's chunk marked free, an owner word naming
// no slot, a bitmap disagreeing with its owner word, two entries of one
// name, overlapping objects, an orphaned lock, a live lease without
// heartbeats, two daemons on one node — is reported.
func TestAudit(t *testing.T) {
	setup := func(t *testing.T) (*Region, *Client, DirEntry) {
		r := formatTest(t, testGeometry(), fileBacking(t))
		c := attachTest(t, r, 0)
		off, err := c.AllocChunks(2)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.ShareChunks(off, 2); err != nil {
			t.Fatal(err)
		}
		e := DirEntry{Name: "obj", Kind: 7, Offset: off, Size: 2 * r.ChunkSize()}
		if err := c.DirPut(e); err != nil {
			t.Fatal(err)
		}
		if _, err := c.AllocChunks(1); err != nil { // a private chunk
			t.Fatal(err)
		}
		return r, c, e
	}
	r, _, _ := setup(t)
	if f := r.Audit(); len(f) != 0 {
		t.Fatalf("a sound region: %q", f)
	}
	for _, tc := range []struct {
		name, want string
		kind       FindingKind
		damage     func(r *Region, c *Client, e DirEntry)
	}{
		{"leaked chunk", "whose lease is free (leaked)", FindLeak, func(r *Region, c *Client, e DirEntry) {
			i, _ := r.chunkIndex(e.Offset)
			free := c.Slot() + 1                                 // no client attached there
			atomic.StoreUint32(r.ownerWord(i+2), uint32(free+1)) // the private chunk
		}},
		{"object chunk freed", "not the shared owner", FindDirectory, func(r *Region, c *Client, e DirEntry) {
			i, _ := r.chunkIndex(e.Offset)
			atomic.StoreUint32(r.ownerWord(i), 0)
		}},
		{"owner beyond the slots", "names no lease slot", FindAllocator, func(r *Region, c *Client, e DirEntry) {
			i, _ := r.chunkIndex(e.Offset)
			atomic.StoreUint32(r.ownerWord(i+2), 5000)
		}},
		{"bitmap disagrees", "bitmap says", FindAllocator, func(r *Region, c *Client, e DirEntry) {
			i, _ := r.chunkIndex(e.Offset)
			atomic.StoreUint32(r.ownerWord(i+5), uint32(c.Slot()+1))
		}},
		{"duplicate name", "both name", FindDirectory, func(r *Region, c *Client, e DirEntry) {
			copy(r.dirLine(3), r.dirLine(0))
		}},
		{"overlapping objects", "overlap", FindDirectory, func(r *Region, c *Client, e DirEntry) {
			e.Name = "p" + e.Name[1:] // another name ("pbj"), same span
			encodeDirEntry(r.dirLine(3), e)
		}},
		{"orphaned lock", "no live client", FindOrphanLock, func(r *Region, c *Client, e DirEntry) {
			_, local := r.lockLines(FirstUserLock, 0)
			atomic.StoreUint64(u64At(local, 0), 0x0101010101010101)
		}},
		{"silent live lease", "has not heartbeated", FindDeadLease, func(r *Region, c *Client, e DirEntry) {
			c.abandon() // stops the heartbeat (and marks the lease dead: put it back live)
			atomic.StoreUint32(u32At(r.leaseLine(c.Slot()), 0), leaseLive)
			atomic.StoreUint64(u64At(r.leaseLine(c.Slot()), 24), 1)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, c, e := setup(t)
			tc.damage(r, c, e)
			found := false
			for _, f := range r.AuditFindings() {
				found = found || (f.Kind == tc.kind && strings.Contains(f.Msg, tc.want))
			}
			if !found {
				t.Fatalf("findings %+v, want one of kind %s saying %q", r.AuditFindings(), tc.kind, tc.want)
			}
		})
	}
}

// TestOneDaemonPerNode: a second manager for a node whose daemon runs is
// refused; it used to start silently and race the first.
func TestOneDaemonPerNode(t *testing.T) {
	r := formatTest(t, testGeometry(), fileBacking(t))
	m, err := NewManager(r, ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Client().Close()
	if _, err := NewManager(r, ManagerOptions{}); !errors.Is(err, ErrExists) {
		t.Fatalf("a second daemon for node 0: %v", err)
	}
}

// TestDaemonRestartAfterKill: a daemon whose process is gone does not
// block its successor, however fresh its lease (the soak kills and
// restarts daemons at once).
func TestDaemonRestartAfterKill(t *testing.T) {
	r := formatTest(t, testGeometry(), fileBacking(t))
	m, err := NewManager(r, ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m.Client().abandon() // as if killed: the lease stays live and fresh,
	m.peers.close()      // and nothing answers at its socket
	line := r.leaseLine(m.Client().Slot())
	atomic.StoreUint32(u32At(line, 8), 0x7ffffff0) // a pid that does not run
	m2, err := NewManager(r, ManagerOptions{})
	if err != nil {
		t.Fatalf("restart after the daemon died: %v", err)
	}
	m2.Client().Close()
}

// TestOneDaemonPerNodeWhileRunning: two daemons that both passed the
// start check (started at one moment) find each other while they run:
// the later one stops, the first goes on. A daemon whose lease was reaped
// (paused past the lease timeout) stops too. Both used to run on beside
// each other.
func TestOneDaemonPerNodeWhileRunning(t *testing.T) {
	g := testGeometry()
	g.LeaseTimeout = 200 * time.Millisecond
	r := formatTest(t, g, fileBacking(t))
	first, err := NewManager(r, ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	// The second as if it had passed NewManager's check at the same moment.
	self, err := r.Attach(ClientOptions{Node: 0, Name: "cxltierd", Daemon: true})
	if err != nil {
		t.Fatal(err)
	}
	second := &Manager{r: r, self: self, opts: first.opts, beats: map[int]beatSeen{}, lastGrant: make([]int, r.l.LockSlots)}
	ctx, cancel := context.WithCancel(context.Background())
	results := make(chan error, 2)
	for _, m := range []*Manager{first, second} {
		go func() { results <- m.Run(ctx) }()
	}
	select {
	case err := <-results:
		if !errors.Is(err, ErrExists) || !strings.Contains(err.Error(), fmt.Sprintf("daemon slot %d", first.self.slot)) {
			t.Fatalf("the second daemon stopped with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("two daemons of one node ran on beside each other")
	}
	// The first runs on, until its lease is taken from it.
	line := r.leaseLine(first.self.slot)
	atomic.StoreUint32(u32At(line, 0), leaseFree)
	select {
	case err := <-results:
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("the reaped daemon stopped with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a daemon whose lease was reaped ran on")
	}
	cancel()
}

// TestForgedDaemonLease: a lease that claims to be a running daemon with
// a heartbeat time far in the future (forged, or damaged) does not block
// a daemon's start, nor stop it once it runs. It used to block every
// daemon start and repair, since its heartbeat never aged.
func TestForgedDaemonLease(t *testing.T) {
	g := testGeometry()
	g.LeaseTimeout = 200 * time.Millisecond
	r := formatTest(t, g, fileBacking(t))
	forger, err := r.Attach(ClientOptions{Node: 0, Name: "cxltierd", Daemon: true})
	if err != nil {
		t.Fatal(err)
	}
	forger.abandon() // no heartbeat of its own: the forged word stays
	line := r.leaseLine(forger.Slot())
	atomic.StoreUint64(u64At(line, 24), uint64(time.Now().Add(24*time.Hour).UnixNano()))
	m, err := NewManager(r, ManagerOptions{})
	if err != nil {
		t.Fatalf("a daemon behind a forged lease: %v", err)
	}
	if err := m.stillTheDaemon(); err != nil {
		t.Fatalf("the running daemon yields to a forged lease: %v", err)
	}
	m.Client().Close()
}

// TestFreeSpaceIgnoresBitmapPadding: bits past the last chunk in the
// allocator bitmap (damage: no chunk is there) do not count as used; they
// made free space negative.
func TestFreeSpaceIgnoresBitmapPadding(t *testing.T) {
	g := testGeometry()
	g.DeviceSize = 20 << 20 // 80 chunks: not a multiple of 64
	r := formatTest(t, g, fileBacking(t))
	if r.l.ChunkCount%64 == 0 {
		t.Skipf("%d chunks: no padding to damage", r.l.ChunkCount)
	}
	before := r.freeChunks()
	last := (r.l.ChunkCount+63)/64 - 1
	atomic.StoreUint64(r.bitmapWord(last), atomic.LoadUint64(r.bitmapWord(last))|^uint64(0)<<(r.l.ChunkCount%64))
	if after := r.freeChunks(); after != before || after < 0 {
		t.Fatalf("free chunks %d with padding bits set, %d before", after, before)
	}
}

// TestDamagedDirectoryEntry: one bad byte in one directory entry leaves
// the tier openable, for inspect (read-only) and for clients: the entry is
// passed over, the others serve, and the audit names it. The tier used to
// be refused whole, by inspect and repair too.
func TestDamagedDirectoryEntry(t *testing.T) {
	b := fileBacking(t)
	r := formatTest(t, testGeometry(), b)
	c := attachTest(t, r, 0)
	for i, name := range []string{"first", "second"} {
		off, err := c.AllocChunks(1)
		if err == nil {
			err = c.ShareChunks(off, 1)
		}
		if err == nil {
			err = c.DirPut(DirEntry{Name: name, Kind: 7, Offset: off, Size: r.ChunkSize()})
		}
		if err != nil {
			t.Fatalf("entry %d: %v", i, err)
		}
	}
	c.Close()
	r.dirLine(0)[33] = 0x7f // the first entry's name length
	r.Close()
	for _, readOnly := range []bool{true, false} {
		r2, err := Open(Options{Devices: []Backing{b}, ReadOnly: readOnly})
		if err != nil {
			t.Fatalf("open (read-only %v) with one damaged entry: %v", readOnly, err)
		}
		if _, err := r2.DirLookup("second"); err != nil {
			t.Errorf("the sound entry: %v", err)
		}
		found := false
		for _, f := range r2.AuditFindings() {
			found = found || (f.Kind == FindDirectory && strings.Contains(f.Msg, "directory entry 0"))
		}
		if !found {
			t.Errorf("the audit does not name the damaged entry: %+v", r2.AuditFindings())
		}
		r2.Close()
	}
}

// TestObjectRunsAreGuarded: a directory object's second run (a prefix
// index's payload blocks) is audited like its first, and a chunk of either
// whose owner word was damaged to name a client is not freed when that
// client is reaped: it goes back to the shared owner. Such a chunk used to
// be freed and handed to the next allocation under the live object.
func TestObjectRunsAreGuarded(t *testing.T) {
	r := formatTest(t, testGeometry(), fileBacking(t))
	c := attachTest(t, r, 0)
	first, err := c.AllocChunks(1)
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.AllocChunks(2)
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []struct {
		off Offset
		n   int64
	}{{first, 1}, {second, 2}} {
		if err := c.ShareChunks(run.off, run.n); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DirPut(DirEntry{Name: "idx", Kind: 9, Offset: first, Size: r.ChunkSize(), Run2: second, Run2Size: 2 * r.ChunkSize()}); err != nil {
		t.Fatal(err)
	}
	if e, err := r.DirLookup("idx"); err != nil || e.Run2 != second || e.Run2Size != 2*r.ChunkSize() {
		t.Fatalf("entry read back: %+v, %v", e, err)
	}
	if f := r.Audit(); len(f) != 0 {
		t.Fatalf("a sound region: %q", f)
	}
	victim := attachTest(t, r, 0)
	i, _ := r.chunkIndex(second)
	atomic.StoreUint32(r.ownerWord(i+1), uint32(victim.Slot()+1))
	found := false
	for _, f := range r.AuditFindings() {
		found = found || (f.Kind == FindDirectory && strings.Contains(f.Msg, `"idx (second run)"`))
	}
	if !found {
		t.Fatalf("the damaged owner word of the second run: findings %+v", r.AuditFindings())
	}
	if _, err := r.freeOwnedBy(c, victim.Slot()); err != nil {
		t.Fatal(err)
	}
	if !r.chunkUsed(i+1) || atomic.LoadUint32(r.ownerWord(i+1)) != ownerShared {
		t.Fatalf("chunk %d after reaping: used %v, owner %#x", i+1, r.chunkUsed(i+1), atomic.LoadUint32(r.ownerWord(i+1)))
	}
	if f := r.Audit(); len(f) != 0 {
		t.Fatalf("after reaping: %q", f)
	}
	if err := c.DirSetRun2("idx", 9, first, r.ChunkSize()); err != nil {
		t.Fatal(err)
	}
	if e, _ := r.DirLookup("idx"); e.Run2 != second {
		t.Fatalf("DirSetRun2 replaced a second run: %+v", e)
	}
}

// TestDamagedRunKeepsNoChunks: a stray write gives a directory entry a
// second run over another client's private chunks. The entry's checksum
// no longer matches, so the entry names nothing (the audit reports it)
// and the reaper of that client frees its chunks; before entries had a
// checksum, the reaper kept them for the object as shared, and they were
// lost to everyone.
func TestDamagedRunKeepsNoChunks(t *testing.T) {
	r := formatTest(t, testGeometry(), fileBacking(t))
	c := attachTest(t, r, 0)
	off, err := c.AllocChunks(1)
	if err == nil {
		err = c.ShareChunks(off, 1)
	}
	if err == nil {
		err = c.DirPut(DirEntry{Name: "idx", Kind: 9, Offset: off, Size: r.ChunkSize()})
	}
	if err != nil {
		t.Fatal(err)
	}
	victim := attachTest(t, r, 0)
	theirs, err := victim.AllocChunks(2)
	if err != nil {
		t.Fatal(err)
	}
	line := r.dirLine(0)
	if e, err := decodeDirEntry(line, r.l.size()); err != nil || e.Name != "idx" {
		t.Fatalf("entry 0: %+v, %v", e, err)
	}
	binary.LittleEndian.PutUint64(line[40:], uint64(theirs))
	binary.LittleEndian.PutUint64(line[48:], uint64(2*r.ChunkSize()))
	found := false
	for _, f := range r.AuditFindings() {
		found = found || (f.Kind == FindDirectory && strings.Contains(f.Msg, "directory entry 0") && strings.Contains(f.Msg, "checksum"))
	}
	if !found {
		t.Errorf("the damaged entry: findings %+v", r.AuditFindings())
	}
	if _, err := r.freeOwnedBy(c, victim.Slot()); err != nil {
		t.Fatal(err)
	}
	i, _ := r.chunkIndex(theirs)
	for k := i; k < i+2; k++ {
		if r.chunkUsed(k) {
			t.Errorf("chunk %d after reaping its owner: used, owner %#x (kept for the damaged entry)", k, atomic.LoadUint32(r.ownerWord(k)))
		}
	}
}
