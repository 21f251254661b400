package tier

import (
	"bytes"
	"sync"
	"unsafe"
)

// hostSim stands in, for tests, for the caches of a host that does not
// share them with the tier's other hosts (CXL memory without coherence):
// the region reads and writes its control area in a private copy, which
// only publish writes back and only refresh reloads, a line at a time.
// One host's caches are coherent, so without it a missing refresh or
// publish in the allocator, directory, leases or locks would show on no
// machine here. Nil outside tests.
//
// As a CPU's flush does, a refresh of a line this host changed and has not
// published writes the line back first. It keeps every line until told to
// reload it, the strictest case for a missing refresh.
type hostSim struct {
	mu      sync.Mutex
	private []byte // this host's view of the control area
	clean   []byte // the private view as of each line's last publish or refresh
	shared  []byte // the control area itself
}

// simulateHost gives r a host of its own (tests only): its control area
// becomes a private copy, synchronised with the tier's only by publish and
// refresh.
func (r *Region) simulateHost() {
	r.sync.sim = &hostSim{private: bytes.Clone(r.ctl), clean: bytes.Clone(r.ctl), shared: r.ctl}
	r.ctl = r.sync.sim.private
}

// lines is the span of whole lines covering b in the private view, or
// false when b is not part of it (data-area bytes, which stay shared).
func (h *hostSim) lines(b []byte) (lo, hi int64, ok bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	base := uintptr(unsafe.Pointer(unsafe.SliceData(h.private)))
	at := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if at < base || at-base+uintptr(len(b)) > uintptr(len(h.private)) {
		return 0, 0, false
	}
	lo = int64(at-base) &^ (LineSize - 1)
	hi = min((int64(at-base)+int64(len(b))+LineSize-1)&^(LineSize-1), int64(len(h.private)))
	return lo, hi, true
}

// publish writes back the lines covering b that this host changed.
func (h *hostSim) publish(b []byte) { h.sync(b, false) }

// refresh reloads the lines covering b, writing back first those this host
// changed.
func (h *hostSim) refresh(b []byte) { h.sync(b, true) }

// sync writes back the changed lines covering b and, if reload, loads
// them anew; either way they are clean after.
func (h *hostSim) sync(b []byte, reload bool) {
	lo, hi, ok := h.lines(b)
	if !ok {
		return
	}
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
