package main

import (
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/tier/link"
	"github.com/cxltier/cxltier/topk"
)

// The top-k party is a sparse-attention decode (DeepSeek DSA through
// cxltier's top-k pool): each step resolves every layer's selection of
// TopK of a long context, most of them already in the layer's buffer from
// the step before (-topk-hit) and the rest fetched from the tier, the
// step's attention (-gap) between one layer's entries and the next
// layer's selection. Its deadline is per layer (-deadline), and what it
// reports is per step: the whole step's time, the goal's p99.

// topkEntryBytes is one token's entry of a DSA layer in FP8 (656 bytes).
const topkEntryBytes = 656

// topkParty runs p.batch requests of p.context tokens each through a pool
// of p.layers layers on eng until the phase ends, timing each step.
func topkParty(c *tier.Client, eng kernels.Engine, lk *link.Link, p partyOpts) (Party, error) {
	cfg := topk.Config{Layers: p.layers, EntryBytes: topkEntryBytes, Slots: 2 * p.topK, TopK: p.topK,
		MaxRequests: p.batch, Planner: topk.PlanHost, Deadline: p.deadline}
	if lk != nil {
		cfg.Link = lk
	}
	pool, err := topk.New(c, eng, nil, cfg)
	if err != nil {
		return Party{}, err
	}
	defer pool.Close()
	if err := fillTopk(pool, p); err != nil {
		return Party{}, err
	}
	rng := rand.New(rand.NewPCG(uint64(p.start), 11))
	reqs, lens := make([]int, p.batch), make([]int64, p.batch)
	for b := range reqs {
		reqs[b], lens[b] = b, p.context
	}
	sel := make([][]int32, p.layers) // each layer's selection, kept from step to step
	for l := range sel {
		sel[l] = make([]int32, p.batch*p.topK)
		for i := range sel[l] {
			sel[l][i] = int32(rng.Int64N(p.context))
		}
	}
	out := make([]int32, p.batch*p.topK)
	seen, gen := make([]uint32, p.context), uint32(0)
	misses := 0
	step := func() (time.Duration, error) {
		t0 := time.Now()
		for l := range sel {
			// A step's selection keeps most of the last step's tokens.
			for i := range sel[l] {
				if sel[l][i] < 0 || rng.Float64() >= p.topkHit {
					sel[l][i] = int32(rng.Int64N(p.context))
				}
			}
			ls := time.Now()
			if _, err := pool.Resolve(l, reqs, lens, dedupe(sel[l], p.batch, p.topK, seen, &gen), out); err != nil {
				return 0, err
			}
			if time.Since(ls) > p.deadline {
				misses++
			}
			spin(p.gap)
		}
		return time.Since(t0), nil
	}
	for range 20 { // the buffers filled and the tier's entries paged in before the phase
		if _, err := step(); err != nil {
			return Party{}, err
		}
	}
	misses = 0
	if err := untilStart(p); err != nil {
		return Party{}, err
	}
	var lat []time.Duration
	for time.Now().UnixNano() < p.end {
		d, err := step()
		if err != nil {
			return Party{}, err
		}
		lat = append(lat, d)
	}
	if len(lat) == 0 {
		return Party{}, errors.New("no step in the phase")
	}
	slices.Sort(lat)
	res := Party{Calls: len(lat) * p.layers, Misses: misses, Steps: len(lat), P50us: us(lat[len(lat)/2]), P99us: us(lat[len(lat)*99/100])}
	res.MissRate = float64(res.Misses) / float64(res.Calls)
	return res, nil
}

// fillTopk registers the party's requests and appends p.context entries to
// every layer of each, as a prefill leaves them.
func fillTopk(pool *topk.Pool, p partyOpts) error {
	const run = 4096
	buf := make([]byte, run*topkEntryBytes)
	for i := range buf {
		buf[i] = byte(i*13 + i>>10)
	}
	for b := range p.batch {
		if err := pool.Register(b, topk.Sequence{Layers: p.layers, EntryBytes: topkEntryBytes, Capacity: p.context}); err != nil {
			return err
		}
		for l := range p.layers {
			for n := int64(0); n < p.context; n += run {
				k := min(run, p.context-n)
				if err := pool.Append(b, l, buf[:k*topkEntryBytes]); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// dedupe pads repeated tokens of each request's selection with -1 (a
// selection names distinct tokens, as a top-k does), in place: seen[t] is
// the generation that last saw token t.
func dedupe(sel []int32, batch, k int, seen []uint32, gen *uint32) []int32 {
	for b := range batch {
		*gen++
		row := sel[b*k : (b+1)*k]
		for i, t := range row {
			if t < 0 {
				continue
			}
			if seen[t] == *gen {
				row[i] = -1
				continue
			}
			seen[t] = *gen
		}
	}
	return sel
}
