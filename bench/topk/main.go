// Command topk benchmarks the sparse-attention KV tier: per-layer resolve
// and fetch latency of one decode step for batches of 1, 16 and 64
// requests, contexts of 32K to 128K tokens and 80–95% overlap between
// consecutive steps' top-k (DSA: k = 2048, 656-byte FP8 entries), against
//
//	(a) no buffer: gathering every selected entry every step;
//	(b) the whole layer's KV of the batch, what a store that moves full
//	    prefixes does (from the bulk copy bandwidth measured here);
//	(c) the bound: the step's missed bytes at the measured gather
//	    bandwidth plus the launch floor (the time of a one-row gather).
//
// Every case runs with each planner of -planner (default both, side by
// side): host (slot tables in host memory, planned in Go) and engine (tables
// in engine memory, planned by the engine: on a GPU, the planning kernels,
// with each step's selections put in GPU memory before its clock starts, as
// an indexer leaves them). Cases whose KV would exceed -max-bytes are
// skipped (the tier is host memory). Go to a GPU machine for the numbers
// that matter:
//
//	go run ./bench/topk
//	go run -tags cuda ./bench/topk -engine cuda
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/cxltier/cxltier/bench/internal/report"
	"github.com/cxltier/cxltier/internal/tierflags"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/topk"
)

// Result is one case.
type Result struct {
	Batch        int     `json:"batch"`
	Context      int64   `json:"context"`
	Overlap      float64 `json:"overlap"`
	Planner      string  `json:"planner"` // host or engine
	P50us        float64 `json:"resolve_fetch_p50_us"`
	P99us        float64 `json:"resolve_fetch_p99_us"`
	PlanUs       float64 `json:"plan_mean_us"` // of which CPU planning
	BytesPerStep float64 `json:"bytes_per_step"`
	HitRate      float64 `json:"hit_rate"`
	NoBufferUs   float64 `json:"no_buffer_us"`      // (a), measured
	WholeLayerUs float64 `json:"whole_layer_us"`    // (b), from measured bulk bandwidth
	BoundUs      float64 `json:"bound_us"`          // (c)
	VsBound      float64 `json:"p50_over_bound"`    // P50us / BoundUs
	VsNoBuffer   float64 `json:"speedup_no_buffer"` // NoBufferUs / P50us
}

// Report is the JSON written to -out.
type Report struct {
	Run         report.Run `json:"run"`
	CPU         string     `json:"cpu"`
	Engine      string     `json:"engine"`
	EntryBytes  int64      `json:"entry_bytes"`
	TopK        int        `json:"top_k"`
	Slots       int        `json:"slots"`
	GatherGBps  float64    `json:"gather_gb_per_s"` // random 656-byte rows, large batch
	BulkGBps    float64    `json:"bulk_gb_per_s"`   // one contiguous copy
	LaunchFloor float64    `json:"launch_floor_us"` // a one-row gather
	Skipped     []string   `json:"skipped,omitempty"`
	Results     []Result   `json:"results"`
}

type options struct {
	batches  []int
	contexts []int64
	overlaps []float64
	steps    int
	warm     int
	maxBytes tierflags.Size
	engine   string
	out      string
	entry    int64
	k, slots int
	profile  string
	planners []topk.Planner
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "topk:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("topk", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o := options{maxBytes: 2 << 30}
	batches := fs.String("batch", "1,16,64", "batch sizes")
	contexts := fs.String("context", "32768,65536,131072", "context lengths (tokens)")
	overlaps := fs.String("overlap", "0.8,0.9,0.95", "consecutive-step top-k overlap")
	fs.IntVar(&o.steps, "steps", 40, "measured steps per case")
	fs.IntVar(&o.warm, "warm", 10, "steps before measuring (the buffer fills)")
	fs.Var(&o.maxBytes, "max-bytes", "skip cases whose KV (one layer, whole batch) exceeds this")
	fs.StringVar(&o.engine, "engine", "cpu", "cpu, cuda or auto")
	fs.StringVar(&o.out, "out", "", "JSON output (default bench/results/local/topk-ENGINE.json)")
	fs.Int64Var(&o.entry, "entry-bytes", 656, "bytes per token entry (656: DSA FP8)")
	fs.IntVar(&o.k, "k", 2048, "top-k")
	fs.IntVar(&o.slots, "slots", 4096, "buffer slots per request")
	fs.StringVar(&o.profile, "cpuprofile", "", "write a CPU profile of the cases here")
	planners := fs.String("planner", "host,engine", "who plans each step: host (Go, tables in host memory) and/or engine (tables in engine memory; on a GPU, the planning kernels)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.batches, err = report.Ints("-batch", *batches, 1<<20); err != nil {
		return o, err
	}
	ctx, err := report.Ints("-context", *contexts, 1<<30)
	if err != nil {
		return o, err
	}
	for _, c := range ctx {
		o.contexts = append(o.contexts, int64(c))
	}
	for _, f := range strings.Split(*planners, ",") {
		pl, err := topk.ParsePlanner(strings.TrimSpace(f))
		if err != nil || pl == topk.PlanAuto {
			return o, fmt.Errorf("-planner: %q (want host and/or engine)", f)
		}
		o.planners = append(o.planners, pl)
	}
	for _, f := range strings.Split(*overlaps, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 0 || v > 1 {
			return o, fmt.Errorf("-overlap: %q is not a fraction in [0, 1]", f)
		}
		o.overlaps = append(o.overlaps, v)
	}
	if o.steps < 1 || o.warm < 0 {
		return o, fmt.Errorf("-steps must be positive and -warm not negative")
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	eng, err := kernels.New(o.engine)
	if err != nil {
		return err
	}
	defer eng.Close()
	rep := Report{Run: report.NewRun(eng), CPU: report.CPUModel(), Engine: eng.Name(), EntryBytes: o.entry, TopK: o.k, Slots: o.slots}
	if err := measureEngine(eng, o, &rep, stderr); err != nil {
		return err
	}
	if o.profile != "" {
		f, err := os.Create(o.profile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	for _, b := range o.batches {
		for _, ctx := range o.contexts {
			if need := int64(b) * (ctx + int64(o.warm+o.steps+1)) * o.entry; need > int64(o.maxBytes) {
				rep.Skipped = append(rep.Skipped, fmt.Sprintf("batch %d context %d: %.1f GiB of KV > -max-bytes %.1f GiB",
					b, ctx, float64(need)/(1<<30), float64(o.maxBytes)/(1<<30)))
				continue
			}
			for _, pl := range o.planners {
				res, err := runCases(eng, o, pl, b, ctx, &rep, stderr)
				if err != nil {
					return err
				}
				rep.Results = append(rep.Results, res...)
			}
		}
	}
	printTable(stdout, rep)
	return report.WriteJSON(o.out, "topk", rep.Engine, rep, stderr)
}

func printTable(w io.Writer, rep Report) {
	fmt.Fprintf(w, "sparse KV resolve+fetch on %s, engine %s: k=%d, %d slots, %d-byte entries\n", rep.CPU, rep.Engine, rep.TopK, rep.Slots, rep.EntryBytes)
	fmt.Fprintf(w, "gather %.2f GB/s, bulk %.2f GB/s, launch floor %.1f µs\n\n", rep.GatherGBps, rep.BulkGBps, rep.LaunchFloor)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "batch\tcontext\toverlap\tplanner\thit rate\tKiB/step\tp50 µs\tp99 µs\tplan µs\t(a) no buffer µs\t(b) whole layer µs\t(c) bound µs\tp50/(c)\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%d\t%d\t%.2f\t%s\t%.3f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.2f×\t\n", r.Batch, r.Context, r.Overlap, r.Planner, r.HitRate,
			r.BytesPerStep/1024, r.P50us, r.P99us, r.PlanUs, r.NoBufferUs, r.WholeLayerUs, r.BoundUs, r.VsBound)
	}
	tw.Flush()
	for _, s := range rep.Skipped {
		fmt.Fprintln(w, "skipped:", s)
	}
}
