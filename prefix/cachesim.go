package prefix

import (
	"bytes"

	"github.com/cxltier/cxltier/tier"
)

// cacheSim stands in, for tests, for the caches of a host that does not
// share them with the tier's other hosts (CXL memory without coherence):
// the handle reads and writes index metadata in a private copy of the
// device, which only publishMeta writes back and only refreshMeta reloads,
// line by line. One host's x86 caches are coherent, so without it a missing
// refresh or publish would show on no machine here. Payloads stay in the
// tier, as DMA would move them. Nil outside tests.
//
// As a CPU's flush does, a refresh of a line this host changed and has not
// published writes the whole line back first (clflushopt: write back if
// dirty, then invalidate), other hosts' newer bytes in it included. It
// keeps every line until told to reload it, the strictest case for a
// missing refresh; a CPU may also write a dirty line back on its own,
// which it does not model (the index publishes each line it changes at
// once).
type cacheSim struct {
	private []byte // this host's view of device 0
	clean   []byte // the private view as of each line's last publish or refresh
	tier    []byte // device 0 itself

	// yield, when set, hands the turn to another simulated host (an
	// interleaving test runs its hosts one at a time): at every publish
	// and refresh, and, with mustSwitch, while a lock this host wants is
	// held by another.
	yield func(mustSwitch bool)
}

// awaitLock waits, under an interleaving test, until lock id is free,
// letting the other hosts run meanwhile (the lock's own wait would spin
// while the holder never got the turn back).
func (c *cacheSim) awaitLock(cl *tier.Client, id int) {
	for c.yield != nil && cl.LockBusy(id) {
		c.yield(true)
	}
}

func newCacheSim(tier []byte) *cacheSim {
	return &cacheSim{private: bytes.Clone(tier), clean: bytes.Clone(tier), tier: tier}
}

// publish writes back those of the lines covering n bytes at abs that this
// host changed since their last publish or refresh (clwb writes back a
// dirty line and leaves a clean one alone).
func (c *cacheSim) publish(abs, n int64) {
	if c.yield != nil {
		c.yield(false)
	}
	for at := abs &^ (lineSize - 1); at < abs+n && at < int64(len(c.tier)); at += lineSize {
		if line := c.private[at : at+lineSize]; !bytes.Equal(line, c.clean[at:at+lineSize]) {
			copy(c.tier[at:at+lineSize], line)
			copy(c.clean[at:at+lineSize], line)
		}
	}
}

// refresh reloads the lines covering n bytes at abs from the tier, writing
// back first those this host changed since their last publish or refresh.
func (c *cacheSim) refresh(abs, n int64) {
	if c.yield != nil {
		c.yield(false)
	}
	for at := abs &^ (lineSize - 1); at < abs+n && at < int64(len(c.tier)); at += lineSize {
		line := c.private[at : at+lineSize]
		if !bytes.Equal(line, c.clean[at:at+lineSize]) {
			copy(c.tier[at:at+lineSize], line)
		}
		copy(line, c.tier[at:at+lineSize])
		copy(c.clean[at:at+lineSize], line)
	}
}
