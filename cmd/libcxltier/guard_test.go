package main

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cxltier/cxltier/tier"
)

// attachTest formats a 16 MiB file tier and attaches the library to it.
func attachTest(t testing.TB) uint64 {
	t.Helper()
	return attachWaitingTest(t, 0)
}

// attachWaitingTest is attachTest with a detach that waits at most
// closeWait for calls in flight.
func attachWaitingTest(t testing.TB, closeWait time.Duration) uint64 {
	t.Helper()
	h, err := attachWaiting(formatTest(t), "test", closeWait)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// formatTest formats a 16 MiB file tier and returns its devices string,
// for tests that attach it more than once (as several processes do).
func formatTest(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "d0")
	b, err := tier.ParseBacking("file:" + path)
	if err != nil {
		t.Fatal(err)
	}
	geo := tier.DefaultGeometry()
	geo.DeviceSize, geo.ChunkSize, geo.Stripe = 16<<20, 256<<10, 256<<10
	r, err := tier.Format(tier.Options{Devices: []tier.Backing{b}, Geometry: geo})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	return "file:" + path
}

// readTier reads the whole mapping, as a call on the tier would.
func readTier(a *attached) (sum byte) {
	mem, err := a.r.Slice(0, a.r.Size())
	if err != nil {
		return 0
	}
	for i := 0; i < len(mem); i += 4096 {
		sum += mem[i]
	}
	return sum
}

// TestDetachWaitsForCalls: a detach waits for the call in flight, turns
// new calls away while it waits, and unmaps only after the last one is
// done. It used to unmap under the call, which then faulted.
func TestDetachWaitsForCalls(t *testing.T) {
	h := attachTest(t)
	a, done, err := use[*attached](h)
	if err != nil {
		t.Fatal(err)
	}
	detached := make(chan error, 1)
	go func() { detached <- detach(h) }()
	time.Sleep(50 * time.Millisecond)
	select {
	case err := <-detached:
		t.Fatalf("detach returned (%v) with a call in flight", err)
	default:
	}
	if _, _, err := use[*attached](h); !errors.Is(err, tier.ErrClosed) {
		t.Fatalf("a new call while detaching: %v", err)
	}
	readTier(a) // still mapped
	done.Done()
	select {
	case err := <-detached:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("detach did not return after the last call")
	}
	if _, _, err := use[*attached](h); !errors.Is(err, errBadHandle) {
		t.Fatalf("a call after detach: %v", err)
	}
}

// TestDetachDuringCalls: calls on a tier from many goroutines while
// another detaches it either finish on the mapped tier or are told the
// tier is going; none reads unmapped memory (which would end the test
// binary with SIGSEGV).
func TestDetachDuringCalls(t *testing.T) {
	for range 5 {
		h := attachTest(t)
		var wg sync.WaitGroup
		var served, refused int64
		var mu sync.Mutex
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					a, done, err := use[*attached](h)
					if err != nil {
						if !errors.Is(err, tier.ErrClosed) && !errors.Is(err, errBadHandle) {
							t.Errorf("call: %v", err)
						}
						mu.Lock()
						refused++
						mu.Unlock()
						return
					}
					readTier(a)
					done.Done()
					mu.Lock()
					served++
					mu.Unlock()
				}
			}()
		}
		time.Sleep(10 * time.Millisecond)
		if err := detach(h); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if served == 0 || refused != 4 {
			t.Fatalf("%d calls served, %d refused", served, refused)
		}
	}
}

// TestDetachGivesUpOnAStuckCall: calls that outlast the wait leave the
// tier attached and usable, with an error saying why.
func TestDetachGivesUpOnAStuckCall(t *testing.T) {
	h := attachWaitingTest(t, 20*time.Millisecond)
	_, done, err := use[*attached](h)
	if err != nil {
		t.Fatal(err)
	}
	if err := detach(h); !errors.Is(err, tier.ErrHoldsInFlight) {
		t.Fatalf("detach with a call stuck: %v", err)
	}
	a, done2, err := use[*attached](h)
	if err != nil {
		t.Fatalf("the tier was left turning calls away: %v", err)
	}
	readTier(a)
	done2.Done()
	done.Done()
	if err := detach(h); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkHandleLookup is the cost of the detach guard on every call:
// the plain lookup every call made before, and the guarded one now.
func BenchmarkHandleLookup(b *testing.B) {
	h := attachTest(b)
	defer detach(h)
	b.Run("lookup", func(b *testing.B) {
		for range b.N {
			if _, err := tierOf(h); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("guarded", func(b *testing.B) {
		for range b.N {
			_, done, err := use[*attached](h)
			if err != nil {
				b.Fatal(err)
			}
			done.Done()
		}
	})
	// Several threads calling on one tier, as SGLang's scheduler and cache
	// threads do: run with -cpu 1,2,4. A lookup under one lock and one
	// shared count of calls made each call ~110 ns with two threads.
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_, done, err := use[*attached](h)
				if err != nil {
					b.Error(err)
					return
				}
				done.Done()
			}
		})
	})
}

// TestUseUnknownHandle: a handle the table lacks, or one of another kind,
// is reported, never dereferenced.
func TestUseUnknownHandle(t *testing.T) {
	h := attachTest(t)
	defer detach(h)
	if _, _, err := use[*prefetcher](h + 1000); !errors.Is(err, errBadHandle) {
		t.Fatalf("unknown handle: %v", err)
	}
	if _, _, err := use[*prefetcher](h); !errors.Is(err, errBadHandle) {
		t.Fatalf("a tier's handle as a prefetcher: %v", err)
	}
}
