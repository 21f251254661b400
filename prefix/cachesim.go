package prefix

import (
	"github.com/cxltier/cxltier/tier"
)

// cacheSim is tier.CacheSim over a handle's device (tests only: nil
// outside them): the handle reads and writes index metadata in a private
// copy, which only publishMeta writes back and only refreshMeta reloads.
// Payloads stay in the tier, as DMA would move them. It adds the turn
// taking of the interleaving tests.
type cacheSim struct {
	*tier.CacheSim

	// yield, when set, hands the turn to another simulated host (an
	// interleaving test runs its hosts one at a time): at every publish
	// and refresh, and, with mustSwitch, while a lock this host wants is
	// held by another.
	yield func(mustSwitch bool)
}

func newCacheSim(device []byte) *cacheSim { return &cacheSim{CacheSim: tier.NewCacheSim(device)} }

// awaitLock waits, under an interleaving test, until lock id is free,
// letting the other hosts run meanwhile (the lock's own wait would spin
// while the holder never got the turn back).
func (c *cacheSim) awaitLock(cl *tier.Client, id int) {
	for c.yield != nil && cl.LockBusy(id) {
		c.yield(true)
	}
}

func (c *cacheSim) publish(abs, n int64) {
	if c.yield != nil {
		c.yield(false)
	}
	c.Publish(abs, n)
}

func (c *cacheSim) refresh(abs, n int64) {
	if c.yield != nil {
		c.yield(false)
	}
	c.Refresh(abs, n)
}
