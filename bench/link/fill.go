package main

import (
	"fmt"

	"github.com/cxltier/cxltier/internal/lowprio"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/tier/link"
)

// fillPart is the part a fill party moves in by default: the uplink's
// on a node's link (LINK_FILL_PART in python/cxltier/cluster/uplink.py),
// a link turn before each part's transfer.
const fillPart = 32 << 20

// fillParty fills its index with all its pages and deletes them, in a
// loop, as the node's uplink fills a tier from the cluster: a fill a part
// at a time (reserve the part's blocks, a link turn for the part, the
// transfer writing them in place, then the commit, which checks every
// page against the checksum it came with and publishes it, a turn a page).
// The transfer is a memmove from a private buffer, what a transfer
// engine's TCP receive costs the host (the kernel copies each byte into
// the block); an RDMA NIC writes the same bytes into the same memory
// without the cores. The turns are the uplink's: a transfer engine's call
// cannot be paced from outside, so a fill gives way between its parts.
func fillParty(c *tier.Client, lk *link.Link, p partyOpts) (Party, error) {
	s, err := prefix.Open(c, p.index)
	if err != nil {
		return Party{}, err
	}
	defer s.Close()
	page := 2 * int64(p.layers) * p.chunk
	src := make([]byte, int64(p.pages)*page)
	for i := range src {
		src[i] = byte(i*17 + i>>11)
	}
	keys, sizes, want := make([]prefix.Key, p.pages), make([]int64, p.pages), make([]uint32, p.pages)
	for i := range keys {
		keys[i] = prefix.StringKey(fmt.Sprintf("%s/%d", p.index, i))
		sizes[i] = page
		want[i] = prefix.WireChecksum(keys[i], src[int64(i)*page:int64(i+1)*page])
	}
	parts := fillParts(p.pages, page, p.fillPart)
	// A lowered fill stands in for an uplink run at that priority
	// (nice -n 19 cxltier-uplink ...): its parts are written and checked
	// on a thread of it.
	onThread := func(fn func()) { fn() }
	if p.bulkPriority != lowprio.Normal {
		pool, err := lowprio.Start(1, p.bulkPriority)
		if err != nil {
			return Party{}, err
		}
		defer pool.Close()
		onThread = func(fn func()) { pool.Run(fn) }
	}
	round := func(int) error {
		for _, pt := range parts {
			var err error
			onThread(func() {
				err = fillOnePart(s, lk, keys[pt[0]:pt[1]], sizes[pt[0]:pt[1]], want[pt[0]:pt[1]], src[int64(pt[0])*page:int64(pt[1])*page])
			})
			if err != nil {
				return fmt.Errorf("pages %d..%d: %w", pt[0], pt[1], err)
			}
		}
		if n, err := s.Delete(keys); err != nil || n != len(keys) {
			return fmt.Errorf("delete: %d of %d, %v", n, len(keys), err)
		}
		return nil
	}
	rounds, took, err := roundsInPhase(p, round)
	if err != nil {
		return Party{}, err
	}
	res := Party{KVRounds: rounds, Bytes: int64(rounds) * int64(p.pages) * page}
	res.BytesPerSec = float64(res.Bytes) / took.Seconds()
	return res, nil
}

// fillOnePart reserves keys' blocks, writes src into them in place (a
// turn on the link first) and commits them, each page checked against
// want; every page must be published.
func fillOnePart(s *prefix.Store, lk *link.Link, keys []prefix.Key, sizes []int64, want []uint32, src []byte) error {
	f, err := s.BeginFill(keys, sizes)
	if err != nil {
		if f != nil {
			f.Close()
		}
		return err
	}
	defer f.Close() // after the commit, nothing
	for i, st := range f.Statuses() {
		if st != prefix.Reserved {
			return fmt.Errorf("page %d: %v, not reserved", i, st)
		}
	}
	blocks, err := f.Blocks()
	if err != nil {
		return err
	}
	if lk != nil {
		lk.Turn(int64(len(src)))
		f.Pace(lk)
	}
	off := 0
	for _, b := range blocks {
		off += copy(b, src[off:])
	}
	filled := make([]bool, len(keys))
	for i := range filled {
		filled[i] = true
	}
	ok, err := f.Commit(filled, prefix.WantChecksums(func(i int) prefix.Key { return keys[i] }, want))
	if err != nil {
		return err
	}
	for i, o := range ok {
		if !o {
			return fmt.Errorf("page %d failed its check", i)
		}
	}
	return nil
}

// fillParts splits n pages of page bytes into [lo, hi) parts of at least
// part bytes (one page at the least, a short tail joining the part
// before it), as the uplink splits a fetch; one part when part is 0 or
// the pages are fewer bytes than two parts.
func fillParts(n int, page, part int64) [][2]int {
	if part <= 0 || int64(n)*page < 2*part {
		return [][2]int{{0, n}}
	}
	per := int(max(1, (part+page-1)/page))
	var out [][2]int
	for lo := 0; lo < n; lo += per {
		out = append(out, [2]int{lo, min(n, lo+per)})
	}
	if last := out[len(out)-1]; len(out) > 1 && int64(last[1]-last[0])*page < part/2 {
		out = out[:len(out)-1]
		out[len(out)-1][1] = n
	}
	return out
}
