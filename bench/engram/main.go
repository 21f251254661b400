// Command engram benchmarks Engram hashing and prefetch: hashing throughput
// per core, and prefetch latency (call → rows ready) for batches of 1, 32
// and 256 decode tokens under the V4.1 and 27B geometries, uniform and Zipf
// ids, with and without the hot-row cache, planned on the host or on the
// engine, against the per-layer deadline.
//
// Ids: "uniform" and "zipf" draw every token independently (Zipf over the
// vocabulary, s = 1.1), so n-grams of two or more tokens rarely repeat;
// "phrases" strings together phrases of 2–8 tokens drawn Zipf-distributed
// from a fixed set of 50,000, a stand-in for text whose n-grams repeat (not
// a trace of real text).
//
// The tables are scaled down (-base) so they fit a small machine: hashing
// cost is the same, and -base sets how far rows spread. Use -base 0 for the
// real sizes (V4.1: ~100 GB per layer).
//
//	go run ./bench/engram
//	go run -tags cuda ./bench/engram -engine cuda -base 0
package main

import (
	"flag"
	"fmt"
	"github.com/cxltier/cxltier/bench/internal/report"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cxltier/cxltier/engram"
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
}

// Report is the JSON written to -out.
type Report struct {
	Run      report.Run       `json:"run"`
	Engine   string           `json:"engine"`
	CPU      string           `json:"cpu"`
	Base     int64            `json:"base_size_per_order"`
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
	dists := fs.String("ids", "uniform,zipf,phrases", "id distributions: uniform, zipf, phrases")
	batches := fs.String("batch", "1,32,256", "batch sizes (decode tokens per call)")
	out := fs.String("out", "", "JSON output (default bench/results/engram-ENGINE.json)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *base < 0 || *calls < 1 || *slots < 1 {
		return fmt.Errorf("-base must be >= 0, -calls and -slots positive")
	}
	cases, err := parseCases(*planners, *dists, *batches)
	if err != nil {
		return err
	}
	eng, err := kernels.New(*engName)
	if err != nil {
		return err
	}
	defer eng.Close()
	rep := Report{Run: report.NewRun(eng), Engine: eng.Name(), CPU: report.CPUModel(), Base: *base}
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
		res, err := prefetchCases(eng, name, g, h, cases, *calls, *slots, *deadline, stderr)
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

// parseCases crosses the flags' lists: batch, ids, cache off and on, planner.
func parseCases(planners, dists, batches string) ([]benchCase, error) {
	var ps []engram.Planner
	for _, s := range strings.Split(planners, ",") {
		p, err := engram.ParsePlanner(s)
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	var out []benchCase
	for _, b := range strings.Split(batches, ",") {
		batch, err := strconv.Atoi(b)
		if err != nil || batch < 1 {
			return nil, fmt.Errorf("-batch: %q is not a positive number", b)
		}
		for _, d := range strings.Split(dists, ",") {
			if d != "uniform" && d != "zipf" && d != "phrases" {
				return nil, fmt.Errorf("-ids: %q (want uniform, zipf or phrases)", d)
			}
			for _, cache := range []bool{false, true} {
				for _, p := range ps {
					out = append(out, benchCase{batch, d, cache, p})
				}
			}
		}
	}
	return out, nil
}

func prefetchCases(eng kernels.Engine, name string, g engram.Geometry, h *engram.Hasher, cases []benchCase, calls, slots int,
	deadline time.Duration, log io.Writer) ([]PrefetchResult, error) {
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
		res, err := prefetchCase(eng, r, h, t, bc, calls, slots, deadline)
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

func prefetchCase(eng kernels.Engine, r *tier.Region, h *engram.Hasher, t *engram.Table, bc benchCase,
	calls, slots int, deadline time.Duration) (PrefetchResult, error) {
	g := h.Geometry()
	batch := bc.batch
	opts := engram.PrefetchOptions{Slots: slots, Deadline: deadline, Cache: bc.cache, Planner: bc.planner}
	p, err := engram.NewPrefetcher(eng, r, h, []*engram.Table{t}, opts)
	if err != nil {
		return PrefetchResult{}, err
	}
	defer p.Close()
	streams := idStreams(bc.dist, g.Vocab, batch)
	hist := make([][]int64, batch)
	for b := range hist {
		hist[b] = []int64{streams[b](), streams[b](), streams[b]()}
	}
	seqs := make([][]int64, batch)
	var lat []time.Duration
	for i := range calls + calls/4 {
		for b := range seqs {
			seqs[b] = []int64{streams[b]()}
		}
		pd, err := p.Prefetch(t.Layer, hist, seqs)
		if err != nil {
			return PrefetchResult{}, err
		}
		d, err := pd.Wait()
		if err != nil {
			return PrefetchResult{}, err
		}
		if i >= calls/4 { // the first quarter warms the cache
			lat = append(lat, d)
		}
		for b := range hist {
			hist[b] = append(hist[b][1:], seqs[b][0])
		}
	}
	slices.Sort(lat)
	missed := 0
	for _, d := range lat {
		if d > deadline {
			missed++
		}
	}
	m := p.Metrics()
	return PrefetchResult{Batch: batch, IDs: bc.dist, Cache: bc.cache, Planner: bc.planner.String(),
		P50us: us(lat[len(lat)/2]), P99us: us(lat[len(lat)*99/100]),
		HitRate:    float64(m.Hits.Load()) / float64(m.Rows.Load()),
		DeadlineUs: us(deadline), MissRate: float64(missed) / float64(len(lat))}, nil
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
	fmt.Fprintf(w, "engine %s on %s; tables scaled to base %d per order\n\n", rep.Engine, rep.CPU, rep.Base)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "geometry\ttokens/s/core\trows/s/core\t")
	for _, h := range rep.Hash {
		fmt.Fprintf(tw, "%s\t%.3g\t%.3g\t\n", h.Geometry, h.TokensPerSec, h.RowsPerSec)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "geometry\tbatch\tids\tcache\tplanner\tp50 µs\tp99 µs\thit rate\tdeadline µs\tmissed\t")
	for _, p := range rep.Prefetch {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%v\t%s\t%.1f\t%.1f\t%.2f\t%.0f\t%.0f%%\t\n", p.Geometry, p.Batch, p.IDs, p.Cache, p.Planner,
			p.P50us, p.P99us, p.HitRate, p.DeadlineUs, p.MissRate*100)
	}
	tw.Flush()
}
