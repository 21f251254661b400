// Command engram benchmarks Engram hashing and prefetch: hashing throughput
// per core, and prefetch latency (call → rows ready) for batches of 1, 32
// and 256 decode tokens under the V4.1 and 27B geometries, uniform and Zipf
// ids, with and without the hot-row cache, planned on the host or on the
// engine, against the per-layer deadline.
//
// Ids: "uniform" and "zipf" draw every token independently (Zipf over the
// vocabulary, s = 1.1), so n-grams of two or more tokens rarely repeat;
// "phrases" strings together phrases of 2–8 tokens drawn Zipf-distributed
// from a fixed set of 50,000, a stand-in for text whose n-grams repeat;
// "trace" (or trace:PATH) replays real text: B requests decode the trace's
// documents token by token, each taking the next document when done
// (internal/tokentrace; default ../shared/data/engram/pydocs-cl100k.u32).
// Every case warms the cache on as many calls as it measures (for a trace,
// the first half of the steps it replays, then the second).
//
// -forward also emulates a decode step's forward pass: a compute timeline
// of -layers layers of -layer-time each, the prefetch started at the top of
// the pass, and the Engram layer (the geometry's first, the one with the
// least time to hide the fetch) waiting for its rows. It reports the step
// with rows already in device memory, with rows from the tier, and the
// stall between them (see forward for how the CPU engine reckons it).
//
// The tables are scaled down (-base) so they fit a small machine: hashing
// cost is the same, and -base sets how far rows spread. Use -base 0 for the
// real sizes (V4.1: ~100 GB per layer).
//
//	go run ./bench/engram
//	go run ./bench/engram -ids trace -batch 256 -calls 5000 -forward
//	go run -tags cuda ./bench/engram -engine cuda -base 0
package main

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cxltier/cxltier/bench/internal/report"
	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/internal/tokentrace"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// HashResult is hashing throughput on one core.
type HashResult struct {
	Geometry     string  `json:"geometry"`
	TokensPerSec float64 `json:"tokens_per_s_per_core"`
	RowsPerSec   float64 `json:"rows_per_s_per_core"`
}

// PrefetchResult is one prefetch case.
type PrefetchResult struct {
	Geometry   string  `json:"geometry"`
	Batch      int     `json:"batch"`
	IDs        string  `json:"ids"`
	Cache      bool    `json:"hot_cache"`
	Planner    string  `json:"planner"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	HitRate    float64 `json:"hit_rate"`
	DeadlineUs float64 `json:"deadline_us"`
	MissRate   float64 `json:"deadline_miss_rate"`
	// Misses per call: rows fetched from the tier, p50 over measured calls.
	MissesPerCall float64  `json:"misses_per_call"`
	Forward       *Forward `json:"forward,omitempty"`
}

// Forward is the emulated forward pass of one case (p50 over its steps).
type Forward struct {
	Layers      int     `json:"layers"`
	LayerUs     float64 `json:"layer_us"`
	EngramLayer int     `json:"engram_layer"` // its index in the pass
	StepUs      float64 `json:"step_us"`      // rows already in device memory
	StepTierUs  float64 `json:"step_tier_us"` // rows prefetched from the tier
	StallUs     float64 `json:"stall_us"`
	StallPct    float64 `json:"stall_pct"`
}

// Report is the JSON written to -out.
type Report struct {
	Run      report.Run       `json:"run"`
	Engine   string           `json:"engine"`
	CPU      string           `json:"cpu"`
	Base     int64            `json:"base_size_per_order"`
	Trace    string           `json:"trace,omitempty"`
	Hash     []HashResult     `json:"hash"`
	Prefetch []PrefetchResult `json:"prefetch"`
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "engram:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("engram", flag.ContinueOnError)
	fs.SetOutput(stderr)
	engName := fs.String("engine", "auto", "cpu, cuda or auto")
	base := fs.Int64("base", 20000, "base size per order for the tables (0: the geometry's own)")
	calls := fs.Int("calls", 200, "prefetch calls per case")
	deadline := fs.Duration("deadline", 56*time.Microsecond, "per-layer deadline")
	slots := fs.Int("slots", 1<<17, "hot cache rows per layer")
	planners := fs.String("planner", "host,engine", "planners to run: host, engine (comma-separated)")
	dists := fs.String("ids", "uniform,zipf,phrases", "id sources: uniform, zipf, phrases, trace or trace:PATH (real text; default "+defaultTrace+")")
	batches := fs.String("batch", "1,32,256", "batch sizes (decode tokens per call)")
	out := fs.String("out", "", "JSON output (default bench/results/local/engram-ENGINE.json)")
	var fw forwardOpts
	fs.BoolVar(&fw.on, "forward", false, "also emulate the forward pass and report the stall")
	fs.IntVar(&fw.layers, "layers", 64, "-forward: layers in the pass")
	fs.DurationVar(&fw.layerTime, "layer-time", 56*time.Microsecond, "-forward: compute time of one layer")
	fs.IntVar(&fw.steps, "forward-steps", 40, "-forward: emulated steps per case")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *base < 0 || *calls < 1 || *slots < 1 || fw.layers < 2 || fw.layerTime <= 0 || fw.steps < 1 {
		return fmt.Errorf("-base must be >= 0; -calls, -slots, -layer-time and -forward-steps positive; -layers at least 2")
	}
	cases, tracePath, err := parseCases(*planners, *dists, *batches)
	if err != nil {
		return err
	}
	var trace *tokentrace.Trace
	if tracePath != "" {
		if trace, err = tokentrace.Read(tracePath); err != nil {
			return fmt.Errorf("-ids trace: %w (the pydocs trace is in the shared data directory, ../shared/data/engram/; a 24K-token head of it is engram/testdata/pydocs-head.u32)", err)
		}
		fmt.Fprintf(stderr, "trace %s: %d documents, %d tokens\n", tracePath, len(trace.Docs), trace.Tokens)
	}
	eng, err := kernels.New(*engName)
	if err != nil {
		return err
	}
	defer eng.Close()
	rep := Report{Run: report.NewRun(eng), Engine: eng.Name(), CPU: report.CPUModel(), Base: *base, Trace: tracePath}
	for _, name := range []string{"v4.1-flash", "engram-27b"} {
		g, _ := engram.Preset(name)
		if *base > 0 {
			for i := range g.BaseSizes {
				g.BaseSizes[i] = *base
			}
		}
		g.LayerIDs = g.LayerIDs[:1]
		h, err := engram.NewHasher(g)
		if err != nil {
			return err
		}
		rep.Hash = append(rep.Hash, hashThroughput(name, h))
		if trace != nil && trace.MaxID >= g.Vocab {
			return fmt.Errorf("-ids trace: ids up to %d, the %s vocabulary is %d", trace.MaxID, name, g.Vocab)
		}
		res, err := prefetchCases(eng, name, g, h, cases, caseOpts{calls: *calls, slots: *slots, deadline: *deadline, trace: trace, fw: fw}, stderr)
		if err != nil {
			return err
		}
		rep.Prefetch = append(rep.Prefetch, res...)
	}
	printTable(stdout, rep)
	return report.WriteJSON(*out, "engram", rep.Engine, rep, stderr)
}

func hashThroughput(name string, h *engram.Hasher) HashResult {
	g := h.Geometry()
	rng := rand.New(rand.NewPCG(1, 2))
	ids := make([]int64, 4096)
	for i := range ids {
		ids[i] = rng.Int64N(g.Vocab)
	}
	var dst []int64
	tokens := 0
	start := time.Now()
	for time.Since(start) < 500*time.Millisecond {
		dst, _ = h.Hash(dst[:0], g.LayerIDs[0], nil, ids)
		tokens += len(ids)
	}
	secs := time.Since(start).Seconds()
	return HashResult{Geometry: name, TokensPerSec: float64(tokens) / secs,
		RowsPerSec: float64(tokens*g.HashesPerToken()) / secs}
}

// benchCase is one prefetch configuration.
type benchCase struct {
	batch   int
	dist    string
	cache   bool
	planner engram.Planner
}

// defaultTrace is where -ids trace looks, from the repository root.
const defaultTrace = "../shared/data/engram/pydocs-cl100k.u32"

// parseCases crosses the flags' lists: batch, ids, cache off and on,
// planner. It also returns the trace's path when an id source is one.
func parseCases(planners, dists, batches string) ([]benchCase, string, error) {
	var ps []engram.Planner
	for _, s := range strings.Split(planners, ",") {
		p, err := engram.ParsePlanner(s)
		if err != nil {
			return nil, "", err
		}
		ps = append(ps, p)
	}
	var out []benchCase
	trace := ""
	for _, b := range strings.Split(batches, ",") {
		batch, err := strconv.Atoi(b)
		if err != nil || batch < 1 {
			return nil, "", fmt.Errorf("-batch: %q is not a positive number", b)
		}
		for _, d := range strings.Split(dists, ",") {
			switch {
			case d == "uniform" || d == "zipf" || d == "phrases":
			case d == "trace" || strings.HasPrefix(d, "trace:"):
				path := strings.TrimPrefix(strings.TrimPrefix(d, "trace"), ":")
				if path == "" {
					path = defaultTrace
				}
				if trace != "" && trace != path {
					return nil, "", fmt.Errorf("-ids: two traces (%s and %s)", trace, path)
				}
				trace, d = path, "trace"
			default:
				return nil, "", fmt.Errorf("-ids: %q (want uniform, zipf, phrases, trace or trace:PATH)", d)
			}
			for _, cache := range []bool{false, true} {
				for _, p := range ps {
					out = append(out, benchCase{batch, d, cache, p})
				}
			}
		}
	}
	return out, trace, nil
}

// caseOpts are the flags every case shares.
type caseOpts struct {
	calls, slots int
	deadline     time.Duration
	trace        *tokentrace.Trace
	fw           forwardOpts
}

func prefetchCases(eng kernels.Engine, name string, g engram.Geometry, h *engram.Hasher, cases []benchCase, o caseOpts, log io.Writer) ([]PrefetchResult, error) {
	layer := g.LayerIDs[0]
	rows, _ := h.Rows(layer)
	fmt.Fprintf(log, "%s: building a synthetic table of %d rows × %d B...\n", name, rows, g.RowBytes)
	r, c, err := tierFor(rows * g.RowBytes)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	defer c.Close()
	t, err := engram.CreateTable(c, g, h, layer, func(i int64, b []byte) error {
		engram.SyntheticRow(layer, i, b)
		return nil
	}, log)
	if err != nil {
		return nil, err
	}
	var out []PrefetchResult
	for _, bc := range cases {
		res, err := prefetchCase(eng, c, h, t, bc, o)
		if err != nil {
			return nil, fmt.Errorf("%s %+v: %w", name, bc, err)
		}
		res.Geometry = name
		out = append(out, res)
	}
	return out, nil
}

func tierFor(bytes int64) (*tier.Region, *tier.Client, error) {
	b, _ := tier.ParseBacking("anon")
	geo := tier.DefaultGeometry()
	geo.DeviceSize = (bytes + bytes/8 + 64<<20 + geo.ChunkSize - 1) / geo.ChunkSize * geo.ChunkSize
	r, err := tier.Format(tier.Options{Devices: []tier.Backing{b}, Geometry: geo})
	if err != nil {
		return nil, nil, err
	}
	c, err := r.Attach(tier.ClientOptions{})
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	return r, c, nil
}

func prefetchCase(eng kernels.Engine, c *tier.Client, h *engram.Hasher, t *engram.Table, bc benchCase, o caseOpts) (PrefetchResult, error) {
	g := h.Geometry()
	opts := engram.PrefetchOptions{Slots: o.slots, Deadline: o.deadline, Cache: bc.cache, Planner: bc.planner}
	p, err := engram.NewPrefetcher(eng, c, h, []*engram.Table{t}, opts)
	if err != nil {
		return PrefetchResult{}, err
	}
	defer p.Close()
	src, warm, calls, err := newSource(bc, g, o)
	if err != nil {
		return PrefetchResult{}, err
	}
	var lat []time.Duration
	var misses []int
	m := p.Metrics()
	var rows0, hits0 uint64
	for i := range warm + calls {
		if i == warm {
			rows0, hits0 = m.Rows.Load(), m.Hits.Load()
		}
		hist, seqs, ok := src.Step()
		if !ok {
			return PrefetchResult{}, fmt.Errorf("the id source ran out after %d calls", i)
		}
		fetched := m.Fetched.Load()
		pd, err := p.Prefetch(t.Layer, hist, seqs)
		if err != nil {
			return PrefetchResult{}, err
		}
		d, err := pd.Wait()
		if err != nil {
			return PrefetchResult{}, err
		}
		if i >= warm {
			lat = append(lat, d)
			misses = append(misses, int(m.Fetched.Load()-fetched))
		}
	}
	slices.Sort(lat)
	slices.Sort(misses)
	missed := 0
	for _, d := range lat {
		if d > o.deadline {
			missed++
		}
	}
	res := PrefetchResult{Batch: bc.batch, IDs: bc.dist, Cache: bc.cache, Planner: bc.planner.String(),
		P50us: us(lat[len(lat)/2]), P99us: us(lat[len(lat)*99/100]),
		HitRate:    float64(m.Hits.Load()-hits0) / float64(max(1, m.Rows.Load()-rows0)),
		DeadlineUs: us(o.deadline), MissRate: float64(missed) / float64(len(lat)), MissesPerCall: float64(misses[len(misses)/2])}
	if o.fw.on {
		fw, err := forward(p, t.Layer, src, o.fw)
		if err != nil {
			return res, err
		}
		res.Forward = &fw
	}
	return res, nil
}

// source yields decode steps: per sequence the ids before its token and
// the token.
type source interface {
	Step() (hist, ids [][]int64, ok bool)
}

// newSource is the case's id source and how many calls it warms and
// measures: -calls each, or for a trace the two halves of what it has at
// this batch (at most -calls each, leaving steps for -forward).
func newSource(bc benchCase, g engram.Geometry, o caseOpts) (source, int, int, error) {
	if bc.dist != "trace" {
		return newStreams(bc.dist, g.Vocab, bc.batch), o.calls, o.calls, nil
	}
	steps := o.trace.Steps(bc.batch)
	if o.fw.on {
		steps -= o.fw.steps
	}
	half := min(o.calls, steps/2)
	if half < 1 {
		return nil, 0, 0, fmt.Errorf("the trace has %d steps at batch %d: too few to warm and measure", o.trace.Steps(bc.batch), bc.batch)
	}
	rp, err := tokentrace.NewReplay(o.trace, bc.batch, g.MaxNgram-1)
	return rp, half, half, err
}

// streams are synthetic id streams with the histories they build.
type streams struct {
	gen        []func() int64
	hist, seqs [][]int64
	started    bool
}

func newStreams(dist string, vocab int64, batch int) *streams {
	s := &streams{gen: idStreams(dist, vocab, batch), hist: make([][]int64, batch), seqs: make([][]int64, batch)}
	for b := range s.hist {
		s.hist[b] = []int64{s.gen[b](), s.gen[b](), s.gen[b]()}
		s.seqs[b] = make([]int64, 1)
	}
	return s
}

func (s *streams) Step() (hist, ids [][]int64, ok bool) {
	for b := range s.seqs {
		if s.started { // the last step's token joins the history
			s.hist[b] = append(s.hist[b][1:], s.seqs[b][0])
		}
		s.seqs[b][0] = s.gen[b]()
	}
	s.started = true
	return s.hist, s.seqs, true
}

// forwardOpts are the -forward flags.
type forwardOpts struct {
	on        bool
	layers    int
	layerTime time.Duration
	steps     int
}

// forward emulates decode steps' forward passes and reports the p50
// step with rows already in device memory, with rows prefetched from the
// tier, and the stall between them. The prefetch starts at the top of the
// pass and runs for real; the compute is a timeline: layer l would start
// at l × layer-time, and the Engram layer (index engramLayer of the pass)
// starts only when its rows are ready. The CPU engine has no second
// processor to run the layers on (burning this machine's cores would slow
// the prefetch it measures), so the timeline is reckoned, not run; a GPU
// run of the same program is what a user feels.
func forward(p *engram.Prefetcher, layer int, src source, o forwardOpts) (Forward, error) {
	engramLayer := min(layer, o.layers-1)
	window := time.Duration(engramLayer) * o.layerTime
	step := time.Duration(o.layers) * o.layerTime
	var tiered []time.Duration
	for range o.steps {
		hist, ids, ok := src.Step()
		if !ok {
			return Forward{}, fmt.Errorf("-forward: the id source ran out")
		}
		start := time.Now()
		pd, err := p.Prefetch(layer, hist, ids)
		if err == nil {
			_, err = pd.Wait()
		}
		if err != nil {
			return Forward{}, err
		}
		ready := time.Since(start)
		tiered = append(tiered, step+max(0, ready-window))
	}
	slices.Sort(tiered)
	t := tiered[len(tiered)/2]
	return Forward{Layers: o.layers, LayerUs: us(o.layerTime), EngramLayer: engramLayer, StepUs: us(step), StepTierUs: us(t),
		StallUs: us(t - step), StallPct: 100 * float64(t-step) / float64(step)}, nil
}

// idStreams are the id streams of a batch's sequences under dist. Phrases
// come from one set shared by the batch, so that sequences repeat each
// other's n-grams as texts do.
func idStreams(dist string, vocab int64, batch int) []func() int64 {
	var phrases [][]int64
	if dist == "phrases" {
		set := rand.New(rand.NewPCG(uint64(batch), 1))
		phrases = make([][]int64, 50000)
		for i := range phrases {
			phrases[i] = make([]int64, 2+set.IntN(7))
			for j := range phrases[i] {
				phrases[i][j] = set.Int64N(vocab)
			}
		}
	}
	streams := make([]func() int64, batch)
	for b := range streams {
		rng := rand.New(rand.NewPCG(uint64(batch), 9+uint64(b)))
		switch dist {
		case "zipf":
			z := rand.NewZipf(rng, 1.1, 1, uint64(vocab-1))
			streams[b] = func() int64 { return int64(z.Uint64()) }
		case "phrases":
			z := rand.NewZipf(rng, 1.1, 1, uint64(len(phrases)-1))
			var cur []int64
			streams[b] = func() int64 {
				if len(cur) == 0 {
					cur = phrases[z.Uint64()]
				}
				id := cur[0]
				cur = cur[1:]
				return id
			}
		default:
			streams[b] = func() int64 { return rng.Int64N(vocab) }
		}
	}
	return streams
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

func printTable(w io.Writer, rep Report) {
	fmt.Fprintf(w, "engine %s on %s; tables scaled to base %d per order\n", rep.Engine, rep.CPU, rep.Base)
	if rep.Trace != "" {
		fmt.Fprintf(w, "trace: %s\n", rep.Trace)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "geometry\ttokens/s/core\trows/s/core\t")
	for _, h := range rep.Hash {
		fmt.Fprintf(tw, "%s\t%.3g\t%.3g\t\n", h.Geometry, h.TokensPerSec, h.RowsPerSec)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "geometry\tbatch\tids\tcache\tplanner\tp50 µs\tp99 µs\thit rate\tmisses/call\tdeadline µs\tmissed\tstep µs\tfrom tier µs\tstall\t")
	for _, p := range rep.Prefetch {
		fw := "\t\t\t"
		if f := p.Forward; f != nil {
			fw = fmt.Sprintf("%.0f\t%.0f\t%.0f µs (%.1f%%)\t", f.StepUs, f.StepTierUs, f.StallUs, f.StallPct)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%v\t%s\t%.1f\t%.1f\t%.2f\t%.0f\t%.0f\t%.0f%%\t%s\n", p.Geometry, p.Batch, p.IDs, p.Cache, p.Planner,
			p.P50us, p.P99us, p.HitRate, p.MissesPerCall, p.DeadlineUs, p.MissRate*100, fw)
	}
	tw.Flush()
}
