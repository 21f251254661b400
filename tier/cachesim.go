package tier

import (
	"bytes"
	"sync"
	"unsafe"
)

// CacheSim stands in, for tests, for the caches of a host that does not
// share them with the tier's other hosts (CXL memory without coherence):
// its user reads and writes a private copy of shared memory, which only
// Publish writes back and only Refresh reloads, a line at a time. One
// host's caches are coherent, so without it a missing refresh or publish
// would show on no machine here. The region's control area (simulateHost)
// and a prefix index's metadata (prefix's cacheSim, which wraps this one)
// use it; nil outside tests.
//
// As a CPU's flush does, a refresh of a line this host changed and has not
// published writes the whole line back first (clflushopt: write back if
// dirty, then invalidate), other hosts' newer bytes in it included. It
// keeps every line until told to reload it, the strictest case for a
// missing refresh; a CPU may also write a dirty line back on its own,
// which it does not model.
type CacheSim struct {
	mu      sync.Mutex
	private []byte // this host's view
	clean   []byte // the private view as of each line's last publish or refresh
	shared  []byte // the memory itself
}

// NewCacheSim gives shared a host of its own: Private is that host's view.
func NewCacheSim(shared []byte) *CacheSim {
	return &CacheSim{private: bytes.Clone(shared), clean: bytes.Clone(shared), shared: shared}
}

// Private is this host's view of the memory, what its user reads and writes.
func (h *CacheSim) Private() []byte { return h.private }

// Publish writes back those of the lines covering n bytes at off that this
// host changed since their last publish or refresh (clwb writes back a
// dirty line and leaves a clean one alone).
func (h *CacheSim) Publish(off, n int64) { h.sync(off, n, false) }

// Refresh reloads the lines covering n bytes at off, writing back first
// those this host changed.
func (h *CacheSim) Refresh(off, n int64) { h.sync(off, n, true) }

func (h *CacheSim) sync(off, n int64, reload bool) {
	lo := max(off, 0) &^ (LineSize - 1)
	hi := min((off+n+LineSize-1)&^(LineSize-1), int64(len(h.private)))
	h.mu.Lock()
	defer h.mu.Unlock()
	for at := lo; at < hi; at += LineSize {
		end := min(at+LineSize, hi)
		if !bytes.Equal(h.private[at:end], h.clean[at:end]) {
			copy(h.shared[at:end], h.private[at:end])
		}
		if reload {
			copy(h.private[at:end], h.shared[at:end])
		}
		copy(h.clean[at:end], h.private[at:end])
	}
}

// offsetOf is where b starts in the private view, or false when b is not
// part of it (data-area bytes, which stay shared).
func (h *CacheSim) offsetOf(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(h.private)))
	at := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if at < base || at-base+uintptr(len(b)) > uintptr(len(h.private)) {
		return 0, false
	}
	return int64(at - base), true
}

// publishSlice and refreshSlice are Publish and Refresh of the lines
// under b, a slice of the private view (the region's flush calls).
func (h *CacheSim) publishSlice(b []byte) {
	if off, ok := h.offsetOf(b); ok {
		h.Publish(off, int64(len(b)))
	}
}

func (h *CacheSim) refreshSlice(b []byte) {
	if off, ok := h.offsetOf(b); ok {
		h.Refresh(off, int64(len(b)))
	}
}

// simulateHost gives r a host of its own (tests only): its control area
// becomes a private copy, synchronised with the tier's only by publish and
// refresh.
func (r *Region) simulateHost() {
	r.sync.sim = NewCacheSim(r.ctl)
	r.ctl = r.sync.sim.Private()
}
