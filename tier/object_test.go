package tier

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// fillPattern writes a pattern that differs per byte and per object size.
func fillPattern(b []byte) {
	for i := range b {
		b[i] = byte(i*7 + i>>8 + len(b))
	}
}

func TestObjectLifecycle(t *testing.T) {
	r := formatTest(t, testGeometry())
	c := attachTest(t, r, 0)
	const size = 700 << 10 // not a whole number of chunks
	o, err := c.CreateObject("engram/test/layer1", size, ObjectOptions{Contiguous: true, Kind: 7})
	if err != nil {
		t.Fatal(err)
	}
	if o.State != ObjectUnsealed || o.Size != size || !o.Contiguous || o.Kind != 7 || int64(o.Offset)%r.ChunkSize() != 0 {
		t.Fatalf("new object: %+v", o)
	}
	b, err := r.ObjectBytes(o)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, make([]byte, size)) {
		t.Fatal("a new object is not zero-filled")
	}
	fillPattern(b)
	if _, err := c.CreateObject("engram/test/layer1", 10, ObjectOptions{}); !errors.Is(err, ErrExists) {
		t.Fatalf("second create of one name: %v", err)
	}
	sealed, err := c.SealObject(o.Name, "layers.1.engram.embed from model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	again, err := r.OpenObject(o.Name)
	if err != nil {
		t.Fatal(err)
	}
	if again.State != ObjectSealed || again.Sum != sealed.Sum || again.Label != sealed.Label || again.Seals != 1 || again.Offset != o.Offset {
		t.Fatalf("reopened %+v, sealed %+v", again, sealed)
	}
	if err := r.VerifyObject(again); err != nil {
		t.Fatal(err)
	}
	b[size/2] ^= 1
	if err := r.VerifyObject(again); !errors.Is(err, ErrPayload) || !strings.Contains(err.Error(), o.Name) {
		t.Fatalf("verify of a damaged payload: %v", err)
	}
	b[size/2] ^= 1
	if u, err := c.UnsealObject(o.Name); err != nil || u.State != ObjectUnsealed {
		t.Fatalf("unseal: %+v %v", u, err)
	}
	if err := r.VerifyObject(mustOpen(t, r, o.Name)); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("verify of an unsealed object: %v", err)
	}
	list, err := r.Objects()
	if err != nil || len(list) != 1 || list[0].Name != o.Name {
		t.Fatalf("list: %+v %v", list, err)
	}
	used := r.Usage().UsedChunks
	if err := c.RemoveObject(o.Name, false); err != nil {
		t.Fatal(err)
	}
	if now := r.Usage().UsedChunks; now != used-o.Chunks {
		t.Fatalf("remove freed %d chunks, the object had %d", used-now, o.Chunks)
	}
	if _, err := r.OpenObject(o.Name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("open after remove: %v", err)
	}
	if err := c.RemoveObject(o.Name, false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second remove: %v", err)
	}
	// The chunks come back to a new object zeroed, not with the old bytes.
	o2, err := c.CreateObject("other", size, ObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if b2, _ := r.ObjectBytes(o2); !bytes.Equal(b2, make([]byte, size)) {
		t.Fatal("reused chunks are not zeroed")
	}
	if f := r.Audit(); len(f) != 0 {
		t.Fatalf("audit: %v", f)
	}
}

func mustOpen(t *testing.T, r *Region, name string) Object {
	t.Helper()
	o, err := r.OpenObject(name)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

func TestObjectBadInput(t *testing.T) {
	r := formatTest(t, testGeometry())
	c := attachTest(t, r, 0)
	for _, tc := range []struct {
		name string
		size int64
		want error
	}{
		{"", 10, ErrInvalidConfig},
		{strings.Repeat("x", dirNameMax+1), 10, ErrInvalidConfig},
		{"bad\x01name", 10, ErrInvalidConfig},
		{"zero", 0, ErrInvalidConfig},
		{"negative", -1, ErrInvalidConfig},
		{"huge", 1 << 40, ErrExhausted},
		{"almost-all", r.Size(), ErrExhausted},
	} {
		if _, err := c.CreateObject(tc.name, tc.size, ObjectOptions{}); !errors.Is(err, tc.want) {
			t.Errorf("create %q of %d: %v, want %v", tc.name, tc.size, err, tc.want)
		}
	}
	if err := c.DirPut(DirEntry{Name: "not-an-object", Kind: 99, Offset: r.DataStart(), Size: r.ChunkSize()}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.OpenObject("not-an-object"); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("open of another kind's entry: %v", err)
	}
	if r.Usage().UsedChunks != 0 {
		t.Fatalf("failed creates left %d chunks allocated", r.Usage().UsedChunks)
	}
}

// The header is untrusted: every damaged field reads as an error naming the
// object, never as a size or state taken on trust.
func TestObjectHeaderDamage(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   int64
		want error
	}{
		{"magic", 0, ErrCorrupt},
		{"size", 16, ErrChecksum},
		{"seal state", objectSealAt, ErrChecksum},
		{"label length", objectSealAt + 20, ErrChecksum},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := formatTest(t, testGeometry())
			c := attachTest(t, r, 0)
			o, err := c.CreateObject("victim", 1000, ObjectOptions{})
			if err != nil {
				t.Fatal(err)
			}
			hdr, err := r.Slice(o.header, objectHeader)
			if err != nil {
				t.Fatal(err)
			}
			hdr[tc.at] ^= 0x40
			_, err = r.OpenObject("victim")
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), "victim") {
				t.Fatalf("damaged %s: %v, want %v naming the object", tc.name, err, tc.want)
			}
			if f := r.Audit(); len(f) != 1 || !strings.Contains(f[0], "victim") {
				t.Fatalf("audit of a damaged object header: %q", f)
			}
			// Listed as damaged beside the others, and removable only by force.
			if _, err := c.CreateObject("bystander", 1000, ObjectOptions{}); err != nil {
				t.Fatal(err)
			}
			list, err := r.Objects()
			if err != nil || len(list) != 2 {
				t.Fatalf("listing with a damaged object: %+v, %v", list, err)
			}
			for _, got := range list {
				if (got.Name == "victim") != (got.Damage != "") {
					t.Fatalf("listing: %q has damage %q", got.Name, got.Damage)
				}
			}
			free := r.Snapshot().Chunks.Free
			if err := c.RemoveObject("victim", false); !errors.Is(err, tc.want) {
				t.Fatalf("removing a damaged object without force: %v", err)
			}
			if err := c.RemoveObject("victim", true); err != nil {
				t.Fatalf("removing a damaged object with force: %v", err)
			}
			if _, err := r.OpenObject("victim"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("after the forced removal: %v", err)
			}
			if got := r.Snapshot().Chunks.Free; got != free+o.Chunks {
				t.Fatalf("%d free chunks after the removal, want %d", got, free+o.Chunks)
			}
			if f := r.Audit(); len(f) != 0 {
				t.Fatalf("audit after the forced removal: %q", f)
			}
		})
	}
}

func TestObjectContiguityOnStripedTier(t *testing.T) {
	g := testGeometry()
	g.Devices = 2
	r := formatTest(t, g, shmBacking(t), shmBacking(t))
	c := attachTest(t, r, 0)
	big := 3 * g.Stripe
	if _, err := c.CreateObject("host-table", big, ObjectOptions{Contiguous: true}); !errors.Is(err, ErrNotContiguous) {
		t.Fatalf("contiguous object over stripes: %v", err)
	}
	o, err := c.CreateObject("spread", big, ObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if o.Contiguous {
		t.Fatal("an object over several devices says it is contiguous")
	}
	if _, err := r.ObjectBytes(o); !errors.Is(err, ErrNotContiguous) {
		t.Fatalf("one slice over devices: %v", err)
	}
	pattern := make([]byte, big)
	fillPattern(pattern)
	if err := r.WriteAt(pattern, o.Offset); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SealObject(o.Name, "striped"); err != nil {
		t.Fatal(err)
	}
	if err := r.VerifyObject(mustOpen(t, r, o.Name)); err != nil {
		t.Fatal(err)
	}
	small, err := c.CreateObject("small", 1000, ObjectOptions{Contiguous: true})
	if err != nil || !small.Contiguous {
		t.Fatalf("a one-chunk contiguous object: %+v %v", small, err)
	}
}

// A writer process creates, fills, seals and holds an object, then dies:
// the object outlives it, another process maps it read-only, removal
// refuses while the writer lives and succeeds once it is reaped.
func TestObjectAcrossProcesses(t *testing.T) {
	g := testGeometry()
	g.LeaseTimeout = 400 * time.Millisecond
	r := formatTest(t, g)
	runManager(t, r, ManagerOptions{Node: 0, GrantLocks: true})
	const size = 3<<20 + 123
	k := spawn(t, r, "objwriter", 0, fmt.Sprintf("%s=%d", envIters, size))
	if line, err := k.out.ReadString('\n'); err != nil || line != "sealed\n" {
		t.Fatalf("writer said %q, %v", line, err)
	}
	c := attachTest(t, r, 0)
	o := mustOpen(t, r, "shared-table")
	if o.State != ObjectSealed || o.Holders != 1 || o.Size != size {
		t.Fatalf("object from the writer: %+v", o)
	}
	view, err := r.MapReadOnly(o.Offset, o.Size)
	if err != nil {
		t.Fatal(err)
	}
	defer view.Close()
	want := make([]byte, size)
	fillPattern(want)
	if !bytes.Equal(view.Data, want) {
		t.Fatal("the read-only view does not show the writer's bytes")
	}
	if err := c.RemoveObject(o.Name, false); !errors.Is(err, ErrObjectBusy) {
		t.Fatalf("remove while the writer holds it: %v", err)
	}
	k.cmd.Process.Signal(syscall.SIGKILL)
	k.cmd.Wait()
	deadline := time.Now().Add(20 * g.LeaseTimeout)
	for mustOpen(t, r, o.Name).Holders != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the dead writer still holds the object")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := r.VerifyObject(mustOpen(t, r, o.Name)); err != nil {
		t.Fatalf("the object after its writer died: %v", err)
	}
	if err := c.RemoveObject(o.Name, false); err != nil {
		t.Fatal(err)
	}
}

// A store through a read-only view faults in the storing process and
// leaves the object unchanged.
func TestReadOnlyViewFaults(t *testing.T) {
	r := formatTest(t, testGeometry())
	c := attachTest(t, r, 0)
	o, err := c.CreateObject("guarded", 1000, ObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SealObject(o.Name, "zeros"); err != nil {
		t.Fatal(err)
	}
	k := spawn(t, r, "objscribbler", 0, "GOTRACEBACK=none")
	err = k.cmd.Wait()
	var exit interface{ ExitCode() int }
	if !errors.As(err, &exit) || exit.ExitCode() != 2 { // the runtime's exit on a fault
		t.Fatalf("a store through the read-only view: %v", err)
	}
	if !strings.Contains(k.err.String(), "SIGSEGV") { // the fault, captured rather than printed
		t.Fatalf("the child's exit was not the fault: its stderr says %q", k.err)
	}
	if err := r.VerifyObject(mustOpen(t, r, o.Name)); err != nil {
		t.Fatal(err)
	}
}

func TestMapReadOnlyRefusesAnon(t *testing.T) {
	r := formatTest(t, testGeometry(), Backing{Kind: BackingAnon})
	c := attachTest(t, r, 0)
	o, err := c.CreateObject("anon", 1000, ObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.MapReadOnly(o.Offset, o.Size); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("read-only map of an anonymous tier: %v", err)
	}
}

func childObjectWriter(c *Client, size int64) error {
	o, err := c.CreateObject("shared-table", size, ObjectOptions{Contiguous: true})
	if err != nil {
		return err
	}
	b, err := c.Region().ObjectBytes(o)
	if err != nil {
		return err
	}
	fillPattern(b)
	if _, err := c.SealObject(o.Name, "pattern"); err != nil {
		return err
	}
	if err := c.HoldObject(o.Name); err != nil {
		return err
	}
	fmt.Println("sealed")
	select {}
}

func childObjectScribbler(c *Client) error {
	o, err := c.Region().OpenObject("guarded")
	if err != nil {
		return err
	}
	v, err := c.Region().MapReadOnly(o.Offset, o.Size)
	if err != nil {
		return err
	}
	v.Data[10] = 1 // must fault
	return fmt.Errorf("a store through a read-only view did not fault")
}

// Ranks and instances race to create one table: one wins, the others get
// ErrExists, and no losing run of chunks stays allocated.
func TestObjectCreateRace(t *testing.T) {
	r := formatTest(t, testGeometry())
	const racers = 6
	errs := make(chan error, racers)
	for k := 0; k < racers; k++ {
		c := attachTest(t, r, 0)
		go func() {
			_, err := c.CreateObject("raced", 3<<20, ObjectOptions{Contiguous: true})
			errs <- err
		}()
	}
	won := 0
	for k := 0; k < racers; k++ {
		switch err := <-errs; {
		case err == nil:
			won++
		case !errors.Is(err, ErrExists):
			t.Fatalf("a losing create: %v", err)
		}
	}
	o := mustOpen(t, r, "raced")
	if won != 1 || r.Usage().UsedChunks != o.Chunks {
		t.Fatalf("%d winners, %d chunks used for an object of %d", won, r.Usage().UsedChunks, o.Chunks)
	}
	if f := r.Audit(); len(f) != 0 {
		t.Fatalf("audit: %v", f)
	}
}

// A panic under the system lock gives the lock back: the next client's
// allocation does not wait out the lock timeout.
func TestPanicUnderSystemLockReleasesIt(t *testing.T) {
	r := formatTest(t, testGeometry())
	c := attachTest(t, r, 0)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		c.withLock(SystemLock, func() error { panic("a bug under the lock") })
	}()
	other := attachTest(t, r, 0)
	start := time.Now()
	if _, err := other.AllocChunks(1); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > LockWait/4 {
		t.Fatalf("the next allocation waited %v", took)
	}
}

// TestRemoveObjectRefusesAHolderArrivingLate: a client that starts
// holding an object while its removal runs either holds it before the
// check (and the removal refuses) or finds it gone: never holds an object
// removed under it. The check and the removal were separate, and a hold
// taken between them was lost with the object.
func TestRemoveObjectRefusesAHolderArrivingLate(t *testing.T) {
	r := formatTest(t, testGeometry(), shmBacking(t))
	c := attachTest(t, r, 0)
	other := attachTest(t, r, 0)
	if _, err := c.CreateObject("held-late", 4096, ObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	c.afterHolderCheck = func() {
		go func() { held <- other.HoldObject("held-late") }()
		time.Sleep(100 * time.Millisecond) // the holder has had its chance
	}
	if err := c.RemoveObject("held-late", false); err != nil {
		t.Fatal(err)
	}
	if err := <-held; !errors.Is(err, ErrNotFound) {
		t.Fatalf("a hold taken while the object was being removed: %v, want ErrNotFound", err)
	}
}

// TestUnsealRefusesWhileOthersHold: a sealed object held by another live
// client is not unsealed for a rewrite under it (engram load --force while
// a server reads the table); its own holder may, and so may anyone once
// the other lets go.
func TestUnsealRefusesWhileOthersHold(t *testing.T) {
	r := formatTest(t, testGeometry(), shmBacking(t))
	c := attachTest(t, r, 0)
	reader := attachTest(t, r, 0)
	if _, err := c.CreateObject("table", 4096, ObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SealObject("table", "v1"); err != nil {
		t.Fatal(err)
	}
	if err := reader.HoldObject("table"); err != nil {
		t.Fatal(err)
	}
	if err := c.HoldObject("table"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UnsealObject("table"); !errors.Is(err, ErrObjectBusy) {
		t.Fatalf("unseal while another client holds it: %v, want ErrObjectBusy", err)
	}
	if o, _ := r.OpenObject("table"); o.State != ObjectSealed {
		t.Fatalf("the refused unseal left the object %s", o.State)
	}
	if err := reader.ReleaseObject("table"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UnsealObject("table"); err != nil {
		t.Fatalf("unseal by its only holder: %v", err)
	}
}

// TestOneLoaderAtATime: the client that creates or unseals an object loads
// it, and until it seals it no other running client claims, unseals or
// seals it (two loaders once sealed a mixture of two checkpoints under one
// label); a loader that has ended holds nothing.
func TestOneLoaderAtATime(t *testing.T) {
	r := formatTest(t, testGeometry())
	a := attachTest(t, r, 0)
	b, err := r.Attach(ClientOptions{Name: "second-loader"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreateObject("table", 1000, ObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	busy := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrObjectBusy) || !strings.Contains(err.Error(), "is loading it") {
			t.Fatalf("%s while another client loads: %v", what, err)
		}
	}
	_, err = b.ClaimObjectLoad("table")
	busy("claim", err)
	_, err = b.UnsealObject("table")
	busy("unseal", err)
	_, err = b.SealObject("table", "b's checkpoint")
	busy("seal", err)
	if _, err := a.SealObject("table", "a's checkpoint"); err != nil {
		t.Fatal(err)
	}
	if o, err := b.ClaimObjectLoad("table"); err != nil || o.State != ObjectSealed {
		t.Fatalf("claim of a sealed object: %+v, %v", o, err)
	}
	if _, err := b.UnsealObject("table"); err != nil { // b loads it again now
		t.Fatal(err)
	}
	_, err = a.ClaimObjectLoad("table")
	busy("claim by the first loader", err)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.ClaimObjectLoad("table"); err != nil {
		t.Fatalf("claim after the loader's client ended: %v", err)
	}
}

// TestStoppedLoaderKeepsItsClaim: a loader stopped (SIGSTOP) long past
// its lease, with no daemon to end it, keeps its claim: it resumes and
// writes on, so another loader taking the table over would seal a mixture
// of both under its own label. (Its claim used to lapse with its
// heartbeat.) Once the process is gone, the claim is free.
func TestStoppedLoaderKeepsItsClaim(t *testing.T) {
	g := testGeometry()
	g.LeaseTimeout = 200 * time.Millisecond
	r := formatTest(t, g)
	k := spawn(t, r, "loader", 0)
	if line, err := k.out.ReadString('\n'); err != nil || line != "claimed\n" {
		t.Fatalf("loader said %q, %v", line, err)
	}
	if err := k.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer k.cmd.Process.Signal(syscall.SIGCONT)
	time.Sleep(5 * g.LeaseTimeout)
	b := attachTest(t, r, 0)
	if _, err := b.ClaimObjectLoad("table"); !errors.Is(err, ErrObjectBusy) {
		t.Fatalf("claim of a stopped loader's table: %v, want ErrObjectBusy", err)
	}
	k.cmd.Process.Kill()
	k.cmd.Wait()
	if _, err := b.ClaimObjectLoad("table"); err != nil {
		t.Fatalf("claim once the loader is gone: %v", err)
	}
}
