package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/tier/link"
)

// Party is what one party process reports when its phase ends.
type Party struct {
	Role string `json:"role"`
	// The prefetcher's calls, those whose rows were ready past the
	// deadline, and the call latencies' percentiles.
	Calls    int     `json:"calls,omitempty"`
	Steps    int     `json:"steps,omitempty"` // the top-k party's: its calls are layers, its percentiles steps'
	Misses   int     `json:"misses,omitempty"`
	MissRate float64 `json:"miss_rate"`
	P50us    float64 `json:"p50_us,omitempty"`
	P99us    float64 `json:"p99_us,omitempty"`
	// A KV process's bytes stored and loaded (every page verified as it
	// lands), and its rounds of a store and a load of all its pages; a
	// fill process's bytes filled (every page checked before it is
	// published), and its rounds of a fill of all its pages.
	Bytes       int64   `json:"bytes,omitempty"`
	KVRounds    int     `json:"kv_rounds,omitempty"`
	BytesPerSec float64 `json:"bytes_per_sec,omitempty"`
}

// partyOpts are a party's flags.
type partyOpts struct {
	role, tierPath, index, geometry string
	engine                          string
	start, end                      int64
	base                            int64
	batch, layers, pages            int
	chunk                           int64
	deadline, gap                   time.Duration
	arbiter                         bool
	topK                            int
	context                         int64
	topkHit                         float64
	piece                           int64
	share                           float64
	fillPart                        int64
	firstToken                      bool
	bulkPriority                    kernels.Priority
}

func runRole(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("link party", flag.ContinueOnError)
	var p partyOpts
	fs.StringVar(&p.role, "role", "", "engram, topk, ttft, kv, fill or spin")
	fs.StringVar(&p.tierPath, "tier", "", "tier file")
	fs.StringVar(&p.engine, "engine", "cpu", "cpu or cuda")
	fs.Int64Var(&p.start, "start", 0, "phase start, Unix ns")
	fs.Int64Var(&p.end, "end", 0, "phase end, Unix ns")
	fs.StringVar(&p.index, "index", "", "kv: the KV index")
	fs.IntVar(&p.layers, "layers", 16, "kv: layers")
	fs.IntVar(&p.pages, "pages", 32, "kv: pages")
	fs.Int64Var(&p.chunk, "chunk", 32<<10, "kv: chunk bytes")
	fs.StringVar(&p.geometry, "geometry", "", "engram: geometry")
	fs.Int64Var(&p.base, "base", 0, "engram: base size")
	fs.IntVar(&p.batch, "batch", 1, "engram: batch")
	fs.DurationVar(&p.deadline, "deadline", 0, "engram: deadline")
	fs.DurationVar(&p.gap, "gap", 0, "engram: gap")
	fs.IntVar(&p.topK, "topk", 2048, "topk: selections per request and layer")
	fs.Int64Var(&p.context, "context", 32768, "topk: tokens of each request")
	fs.Float64Var(&p.topkHit, "topk-hit", 0.9, "topk: the share of a layer's selection kept from the step before")
	fs.BoolVar(&p.arbiter, "arbiter", false, "join the node's link arbiter")
	fs.Int64Var(&p.piece, "piece", kernels.DefaultPiece, "kv: bytes between looks at the link's claims")
	fs.Float64Var(&p.share, "share", 0, "kv: the most of each window one process's claims may hold it (0: the arbiter's default)")
	fs.Int64Var(&p.fillPart, "fill-part", fillPart, "fill: bytes of a part (a link turn before each)")
	fs.BoolVar(&p.firstToken, "first-token", true, "kv: with the arbiter, loads are first-token transfers")
	bulkPriority := fs.String("bulk-priority", "normal", "kv: the priority of the CPU threads that copy the stores; fill: of the thread that writes and checks the parts (low, idle or normal)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if p.bulkPriority, err = kernels.ParsePriority(*bulkPriority); err != nil {
		return err
	}
	b, err := tier.ParseBacking("file:" + p.tierPath)
	if err != nil {
		return err
	}
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		return err
	}
	defer r.Close()
	c, err := r.Attach(tier.ClientOptions{Name: p.role})
	if err != nil {
		return err
	}
	defer c.Close()
	res, err := runParty(r, c, p)
	if err != nil {
		return fmt.Errorf("%s party: %w", p.role, err)
	}
	res.Role = p.role
	return json.NewEncoder(stdout).Encode(res)
}

// runParty runs the party p.role names on tier r as client c, with a
// seat on the link when p.arbiter.
func runParty(r *tier.Region, c *tier.Client, p partyOpts) (Party, error) {
	if p.role == "spin" { // moves nothing: no engine, no seat on the link
		if err := untilStart(p); err != nil {
			return Party{}, err
		}
		spin(time.Until(time.Unix(0, p.end)))
		return Party{}, nil
	}
	var lk *link.Link
	if p.arbiter {
		var err error
		if lk, err = link.Open(c, link.Config{Name: "bench", Share: p.share}); err != nil {
			return Party{}, err
		}
		defer lk.Close()
	}
	if p.role == "fill" { // the transfer engine's writes and the commit's checks: no engine of ours
		return fillParty(c, lk, p)
	}
	eng, err := partyEngine(p.engine)
	if err != nil {
		return Party{}, err
	}
	defer eng.Close()
	if lk != nil {
		pe, ok := eng.(kernels.Paced)
		if !ok {
			return Party{}, fmt.Errorf("engine %s cannot be paced", eng.Name())
		}
		pe.SetPacer(lk, p.piece)
	}
	if cpu, ok := eng.(*kernels.CPU); ok && p.bulkPriority != kernels.PriorityNormal {
		if err := cpu.SetBackground(p.bulkPriority); err != nil {
			return Party{}, err
		}
	}
	switch p.role {
	case "engram":
		return engramParty(r, c, eng, lk, p)
	case "topk":
		return topkParty(c, eng, lk, p)
	case "ttft":
		return ttftParty(c, eng, lk, p)
	case "kv":
		return kvParty(c, eng, lk, p)
	}
	return Party{}, fmt.Errorf("role %q: want engram, topk, ttft, kv, fill or spin", p.role)
}

// partyEngine is a party's engine: on the CPU one worker (a party is one
// engine's one stream of copies), on a GPU device 0 on a stream of its own.
func partyEngine(kind string) (kernels.Engine, error) {
	switch kind {
	case "cpu":
		return kernels.NewCPU(1), nil
	case "cuda":
		return kernels.NewCUDA(kernels.CUDAOptions{})
	}
	return nil, fmt.Errorf("engine %q: want cpu or cuda", kind)
}

// untilStart sleeps until the phase starts; a party that was set up too
// late to start with the others says so rather than measure a shorter
// phase.
func untilStart(p partyOpts) error {
	d := time.Until(time.Unix(0, p.start))
	if d < 0 {
		return fmt.Errorf("set up %v after the phase started", -d)
	}
	time.Sleep(d)
	return nil
}

// engramParty calls the prefetcher for one layer in a loop, one batch of
// uniform ids a call: it waits for the call's rows, then for the layer's
// compute (-gap), and calls again, as a decode step does layer by layer.
func engramParty(r *tier.Region, c *tier.Client, eng kernels.Engine, lk *link.Link, p partyOpts) (Party, error) {
	g, err := scaledGeometry(p.geometry, p.base)
	if err != nil {
		return Party{}, err
	}
	h, err := engram.NewHasher(g)
	if err != nil {
		return Party{}, err
	}
	t, err := engram.OpenTable(r, g, h, g.LayerIDs[0], false)
	if err != nil {
		return Party{}, err
	}
	po := engram.PrefetchOptions{Slots: 64 * p.batch, Deadline: p.deadline}
	if lk != nil {
		po.Link = lk
	}
	pf, err := engram.NewPrefetcher(eng, c, h, []*engram.Table{t}, po)
	if err != nil {
		return Party{}, err
	}
	defer pf.Close()
	rng := rand.New(rand.NewPCG(uint64(p.start), 7))
	hist, seqs := make([][]int64, p.batch), make([][]int64, p.batch)
	for b := range hist {
		hist[b] = []int64{rng.Int64N(g.Vocab), rng.Int64N(g.Vocab), rng.Int64N(g.Vocab)}
		seqs[b] = []int64{rng.Int64N(g.Vocab)}
	}
	call := func() (time.Duration, error) {
		for b := range seqs {
			hist[b] = append(hist[b][1:], seqs[b][0])
			seqs[b][0] = rng.Int64N(g.Vocab)
		}
		pd, err := pf.Prefetch(t.Layer, hist, seqs)
		if err != nil {
			return 0, err
		}
		return pd.Wait()
	}
	for range 200 { // page in the table's rows and the buffers before the phase
		if _, err := call(); err != nil {
			return Party{}, err
		}
	}
	if err := untilStart(p); err != nil {
		return Party{}, err
	}
	var lat []time.Duration
	for time.Now().UnixNano() < p.end {
		d, err := call()
		if err != nil {
			return Party{}, err
		}
		lat = append(lat, d)
		spin(p.gap)
	}
	return latencies(lat, p.deadline)
}

// kvParty stores all its pages and loads them back (every page checked
// against its checksum as it lands), then deletes them, in a loop, as
// fast as the link lets it: one engine's KV stores and loads of other
// requests. With the arbiter its loads are first-token transfers, as a KV
// pool's are on a tier that joined the link, and its stores bulk.
func kvParty(c *tier.Client, eng kernels.Engine, lk *link.Link, p partyOpts) (Party, error) {
	kv, err := openKV(c, eng, p, "kv")
	if err != nil {
		return Party{}, err
	}
	defer kv.close()
	s, m, l, keys := kv.s, kv.m, kv.l, kv.keys
	if p.firstToken {
		firstTokenLoads(m, lk, firstTokenBudget)
	}
	src, dst := pageRange(0, p.pages), pageRange(p.pages, p.pages)
	round := func(n int) error {
		for i := range keys {
			keys[i] = prefix.StringKey(fmt.Sprintf("%s/%d/%d", p.index, n, i))
		}
		st, err := m.Put(keys, l, src)
		if err != nil {
			return err
		}
		for i, x := range st {
			if x != prefix.Reserved {
				return fmt.Errorf("page %d of round %d: %v, not stored", i, n, x)
			}
		}
		if err := m.GetAll(keys, l, dst); err != nil {
			return err
		}
		if n, err := s.Delete(keys); err != nil || n != len(keys) {
			return fmt.Errorf("delete: %d of %d, %v", n, len(keys), err)
		}
		return nil
	}
	rounds, took, err := roundsInPhase(p, round) // round -1 pages in the pool and the tier's blocks
	if err != nil {
		return Party{}, err
	}
	page := 2 * int64(p.layers) * p.chunk
	res := Party{KVRounds: rounds, Bytes: 2 * int64(rounds) * int64(p.pages) * page}
	res.BytesPerSec = float64(res.Bytes) / took.Seconds()
	return res, nil
}

// firstTokenBudget is the deadline of a KV party's loads with the
// arbiter: libcxltier's for a KV pool's.
const firstTokenBudget = 2 * time.Second

// roundsInPhase runs round(-1) before the phase (to page in what the
// rounds touch), then round(0), round(1), ... from the phase's start until
// its end: the rounds run and how long they took.
func roundsInPhase(p partyOpts, round func(n int) error) (int, time.Duration, error) {
	if err := round(-1); err != nil {
		return 0, 0, err
	}
	if err := untilStart(p); err != nil {
		return 0, 0, err
	}
	n, t0 := 0, time.Now()
	for ; time.Now().UnixNano() < p.end; n++ {
		if err := round(n); err != nil {
			return n, 0, err
		}
	}
	return n, time.Since(t0), nil
}

// spin waits d on the core, as the thread that drives a GPU waits for its
// kernels: a sleep would give the core up, and waking from it costs
// more than a layer (a 56 µs sleep took about a millisecond on a 2-core
// machine, with one call in seven then past its deadline from the wake-up
// alone).
func spin(d time.Duration) {
	for t := time.Now(); time.Since(t) < d; {
	}
}
