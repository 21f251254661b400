package topk

import (
	"fmt"
	"math/rand/v2"
)

// TraceConfig shapes a synthetic DSA selection trace.
type TraceConfig struct {
	Batch   int     // requests
	Context int64   // tokens per sequence at the first step
	TopK    int     // selections per request and step
	Overlap float64 // fraction of a step's selections kept from the step before, in [0, 1]
	Seed    uint64
}

// Trace generates top-k selections the way a DSA indexer's output looks to
// the buffer: each step keeps Overlap of the previous selections, replaces
// the rest with other positions, always selects the newest token, and the
// sequences grow by one token per step.
type Trace struct {
	cfg  TraceConfig
	rng  *rand.Rand
	lens []int64
	sel  [][]int32
}

// NewTrace checks cfg and starts a trace.
func NewTrace(cfg TraceConfig) (*Trace, error) {
	switch {
	case cfg.Batch < 1 || cfg.TopK < 1:
		return nil, fmt.Errorf("%w: trace batch %d, top-k %d", ErrBadInput, cfg.Batch, cfg.TopK)
	case cfg.Context < int64(cfg.TopK)+1 || cfg.Context > 1<<30:
		return nil, fmt.Errorf("%w: trace context %d must exceed top-k %d", ErrBadInput, cfg.Context, cfg.TopK)
	case cfg.Overlap < 0 || cfg.Overlap > 1:
		return nil, fmt.Errorf("%w: trace overlap %v outside [0, 1]", ErrBadInput, cfg.Overlap)
	}
	t := &Trace{cfg: cfg, rng: rand.New(rand.NewPCG(cfg.Seed, 0x7a11)), lens: make([]int64, cfg.Batch), sel: make([][]int32, cfg.Batch)}
	for b := range t.lens {
		t.lens[b] = cfg.Context
	}
	return t, nil
}

// Lens are the sequence lengths of the step Next returned last.
func (t *Trace) Lens() []int64 { return t.lens }

// Next returns the next step's selections, [Batch × TopK] row-major. The
// first call starts at Context tokens; each later call adds one token.
func (t *Trace) Next() []int32 {
	out := make([]int32, 0, t.cfg.Batch*t.cfg.TopK)
	for b := range t.sel {
		if t.sel[b] != nil {
			t.lens[b]++
		}
		t.sel[b] = t.step(t.sel[b], t.lens[b])
		out = append(out, t.sel[b]...)
	}
	return out
}

func (t *Trace) step(prev []int32, n int64) []int32 {
	k := t.cfg.TopK
	next := make([]int32, 0, k)
	taken := make(map[int32]bool, k)
	add := func(p int32) {
		if !taken[p] && len(next) < k {
			taken[p] = true
			next = append(next, p)
		}
	}
	add(int32(n - 1))
	keep := int(t.cfg.Overlap * float64(k))
	for _, i := range t.rng.Perm(len(prev)) {
		if len(next) >= keep {
			break
		}
		add(prev[i])
	}
	for len(next) < k {
		add(int32(t.rng.Int64N(n - 1)))
	}
	return next
}
