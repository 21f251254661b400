package main

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/tier/link"
)

// ttftIndex is the index the first-token party loads its request's pages
// from.
const ttftIndex = "link-ttft"

// ttftParty loads one request's pages from the tier (every page checked
// as it lands), times each load, then waits -gap for the next request's,
// in a loop: the load a request's first token waits on, as a KV pool's
// whole-page load (a prefill's pages landing in a decode, a HiCache
// hit) is. With the arbiter each load is a first-token transfer on the
// link, as libcxltier makes a KV pool's loads on a tier that joined it:
// stores and fills wait for it, and it waits for deadline claims only.
// A load is late past -deadline.
func ttftParty(c *tier.Client, eng kernels.Engine, lk *link.Link, p partyOpts) (Party, error) {
	kv, err := openKV(c, eng, p, "ttft")
	if err != nil {
		return Party{}, err
	}
	defer kv.close()
	m, l, keys := kv.m, kv.l, kv.keys
	firstTokenLoads(m, lk, p.deadline)
	src, dst := pageRange(0, p.pages), pageRange(p.pages, p.pages)
	if _, err := m.Put(keys, l, src); err != nil { // the request's pages, stored once
		return Party{}, err
	}
	load := func() (time.Duration, error) {
		t0 := time.Now()
		err := m.GetAll(keys, l, dst)
		return time.Since(t0), err
	}
	if _, err := load(); err != nil { // pages in the destination before the phase
		return Party{}, err
	}
	if err := untilStart(p); err != nil {
		return Party{}, err
	}
	var lat []time.Duration
	for time.Now().UnixNano() < p.end {
		d, err := load()
		if err != nil {
			return Party{}, err
		}
		lat = append(lat, d)
		time.Sleep(p.gap) // requests arrive apart; nothing due in between
	}
	res, err := latencies(lat, p.deadline)
	res.Bytes = int64(len(lat)) * int64(p.pages) * 2 * int64(p.layers) * p.chunk
	return res, err
}

// latencies is a party's calls of latencies lat: their count,
// percentiles, and those past deadline.
func latencies(lat []time.Duration, deadline time.Duration) (Party, error) {
	if len(lat) == 0 {
		return Party{}, errors.New("no call in the phase")
	}
	slices.Sort(lat)
	res := Party{Calls: len(lat), P50us: us(lat[len(lat)/2]), P99us: us(lat[len(lat)*99/100])}
	for _, d := range lat {
		if d > deadline {
			res.Misses++
		}
	}
	res.MissRate = float64(res.Misses) / float64(len(lat))
	return res, nil
}

// kvOpen is a KV party's index, its pool of pages, their keys and the
// mover between them (every page checked as it lands).
type kvOpen struct {
	s    *prefix.Store
	l    prefix.Layout
	keys []prefix.Key
	m    *prefix.Mover
}

// openKV opens p.index and a pool on eng for a KV party (tag names its
// keys).
func openKV(c *tier.Client, eng kernels.Engine, p partyOpts, tag string) (*kvOpen, error) {
	s, err := prefix.Open(c, p.index)
	if err != nil {
		return nil, err
	}
	l, keys, err := kvPages(eng, p, tag)
	if err != nil {
		s.Close()
		return nil, err
	}
	m, err := prefix.NewMover(s, eng, nil)
	if err != nil {
		freeLayout(l)
		s.Close()
		return nil, err
	}
	m.Verify = true
	return &kvOpen{s: s, l: l, keys: keys, m: m}, nil
}

func (kv *kvOpen) close() {
	kv.m.Close()
	freeLayout(kv.l)
	kv.s.Close()
}

// firstTokenLoads makes m's loads first-token transfers on lk, due
// within deadline, as libcxltier makes a KV pool's (nothing without lk).
func firstTokenLoads(m *prefix.Mover, lk *link.Link, deadline time.Duration) {
	if lk == nil {
		return
	}
	m.FirstToken = func() (kernels.Pacer, func()) {
		f := lk.BeginFirst(time.Now().Add(deadline))
		return f, f.End
	}
}

// kvPages is a KV party's pool of 2 × pages pages on eng (a buffer per
// layer's K and V, filled with a pattern) and the keys of its pages,
// named after tag.
func kvPages(eng kernels.Engine, p partyOpts, tag string) (prefix.Layout, []prefix.Key, error) {
	l := prefix.Layout{ChunkBytes: p.chunk}
	for range 2 * p.layers {
		buf, err := eng.Alloc(int64(2*p.pages) * p.chunk)
		if err != nil {
			freeLayout(l)
			return l, nil, err
		}
		l.Chunks = append(l.Chunks, kernels.Span{Buf: buf})
		fill := make([]byte, buf.Len())
		for i := range fill {
			fill[i] = byte(i*31 + i>>9)
		}
		if err := eng.Upload(buf, 0, fill); err != nil {
			freeLayout(l)
			return l, nil, err
		}
	}
	keys := make([]prefix.Key, p.pages)
	for i := range keys {
		keys[i] = prefix.StringKey(fmt.Sprintf("%s/%s/%d", p.index, tag, i))
	}
	return l, keys, nil
}

func freeLayout(l prefix.Layout) {
	for _, sp := range l.Chunks {
		sp.Buf.Free()
	}
}

// pageRange is pages from, from+1, ..., n of them.
func pageRange(from, n int) []int64 {
	r := make([]int64, n)
	for i := range r {
		r[i] = int64(from + i)
	}
	return r
}
