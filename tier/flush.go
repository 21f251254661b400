package tier

// Coherence says whether the hosts that map a region share caches.
type Coherence int

const (
	// Local: one coherent host. Flushes and invalidations are no-ops; atomics
	// alone order cross-process access.
	Local Coherence = iota
	// Shared: several hosts over non-coherent memory (CXL 2.0 shared memory).
	// A writer flushes exactly the lines it modified and fences; a reader
	// invalidates the lines before it reads them.
	Shared
)

func (c Coherence) String() string {
	if c == Shared {
		return "shared"
	}
	return "local"
}

// ParseCoherence parses "local" or "shared".
func ParseCoherence(s string) (Coherence, bool) {
	switch s {
	case "local":
		return Local, true
	case "shared":
		return Shared, true
	}
	return Local, false
}

// syncer applies the visibility rules for one coherence mode.
type syncer struct {
	shared bool
	sim    *CacheSim // tests only: this region's host keeps caches of its own
}

// publish makes the lines covering b visible to other hosts: write back each
// line, then fence so later stores (such as a flag) are not seen first.
func (s syncer) publish(b []byte) {
	if s.sim != nil {
		s.sim.publishSlice(b)
		return
	}
	if !s.shared || len(b) == 0 {
		return
	}
	flushLines(b)
	storeFence()
}

// refresh drops this host's cached copies of the lines covering b so the next
// loads read memory, then fences so those loads are not hoisted above it.
func (s syncer) refresh(b []byte) {
	if s.sim != nil {
		s.sim.refreshSlice(b)
		return
	}
	if !s.shared || len(b) == 0 {
		return
	}
	invalidateLines(b)
	fullFence()
}
