// Command gather benchmarks the gather engine the way specs/gpu.md measured
// raw CUDA: random rows of several sizes drawn from regions of several sizes,
// through the fused call, the same rows sorted by address, one copy per row,
// and a CPU gather into a registered bounce buffer followed by one bulk copy,
// with the bulk copy bandwidth for reference. It prints a table and writes
// JSON.
//
//	go run ./bench/gather                           # CPU engine, small regions
//	go run -tags cuda ./bench/gather -engine cuda -regions 256MiB,1GiB,4GiB,16GiB
package main

import (
	"flag"
	"fmt"
	"github.com/cxltier/cxltier/bench/internal/report"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cxltier/cxltier/internal/tierflags"
	"github.com/cxltier/cxltier/kernels"
)

type config struct {
	engine    string
	rowSizes  []int64
	regions   []int64
	batch     int64
	iters     int
	eachRows  int
	hugepages bool
	out       string
}

// Result is one row of the table.
type Result struct {
	Region      int64   `json:"region_bytes"`
	RowBytes    int64   `json:"row_bytes"`
	Rows        int     `json:"rows_per_call"`
	FusedGBs    float64 `json:"fused_gb_s"`
	FusedMRows  float64 `json:"fused_mrows_s"`
	SortedGBs   float64 `json:"fused_sorted_gb_s"`
	EachGBs     float64 `json:"copy_each_gb_s"`
	BounceGBs   float64 `json:"cpu_gather_bulk_gb_s"`
	BulkGBs     float64 `json:"bulk_gb_s"`
	FusedVsEach float64 `json:"fused_over_copy_each"`
	// FusedVsBulk is the gather's speed over a copy of the same bytes.
	FusedVsBulk float64 `json:"fused_over_bulk"`
	// LineMLoads is the region's rate of random 64-byte line loads (in
	// millions a second, every core, independent loads): what a random
	// gather cannot beat, since each row costs at least one such load.
	// LinesVsLoads is the gather's lines a second over that rate.
	LineMLoads   float64 `json:"random_line_mloads_s"`
	LinesVsLoads float64 `json:"fused_lines_over_random_lines"`
}

// Latency is the DSA-sized call of gpu.md: 2048 rows of 656 B.
type Latency struct {
	Region   int64   `json:"region_bytes"`
	Rows     int     `json:"rows"`
	RowBytes int64   `json:"row_bytes"`
	FusedUs  float64 `json:"fused_p50_us"`
	EachUs   float64 `json:"copy_each_p50_us"`
	BounceUs float64 `json:"cpu_gather_bulk_p50_us"`
	Speedup  float64 `json:"fused_speedup_over_copy_each"`
}

// Report is the JSON written to -out.
type Report struct {
	Run     report.Run `json:"run"`
	Engine  string     `json:"engine"`
	CPU     string     `json:"cpu"`
	Procs   int        `json:"gomaxprocs"`
	When    time.Time  `json:"when"`
	Batch   int64      `json:"batch_bytes"`
	Huge    bool       `json:"hugepages"`
	Results []Result   `json:"results"`
	Latency []Latency  `json:"latency"`
}

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "gather:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	eng, err := kernels.New(cfg.engine)
	if err != nil {
		return err
	}
	defer eng.Close()
	base, ok := eng.(kernels.Baseline)
	if !ok {
		return fmt.Errorf("engine %s has no baselines", eng.Name())
	}
	rep := Report{Run: report.NewRun(eng), Engine: eng.Name(), CPU: report.CPUModel(), Procs: runtime.GOMAXPROCS(0), When: time.Now().UTC(),
		Batch: cfg.batch, Huge: cfg.hugepages}
	b := &bench{cfg: cfg, eng: eng, base: base, rng: rand.New(rand.NewPCG(1, 1)), log: stderr}
	for _, region := range cfg.regions {
		res, lat, err := b.region(region)
		if err != nil {
			return err
		}
		rep.Results = append(rep.Results, res...)
		rep.Latency = append(rep.Latency, lat)
	}
	printTable(stdout, rep)
	return report.WriteJSON(cfg.out, "gather", rep.Engine, rep, stderr)
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("gather", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := config{}
	rows := fs.String("rows", "64,256,656,1KiB,4KiB,16KiB", "row sizes")
	regions := fs.String("regions", "256MiB,1GiB", "region sizes the rows are drawn from (gpu.md: 256MiB,1GiB,4GiB,16GiB)")
	batch := fs.String("batch", "64MiB", "bytes moved per call")
	fs.StringVar(&cfg.engine, "engine", "auto", "cpu, cuda or auto")
	fs.IntVar(&cfg.iters, "iters", 5, "timed calls per case (after one warm-up)")
	fs.IntVar(&cfg.eachRows, "each-rows", 2048, "rows for the one-copy-per-row baseline (it is slow)")
	fs.BoolVar(&cfg.hugepages, "hugepages", false, "ask for transparent huge pages on the regions")
	fs.StringVar(&cfg.out, "out", "", "JSON output (default bench/results/local/gather-ENGINE.json)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	var err error
	if cfg.rowSizes, err = parseSizes(*rows); err != nil {
		return cfg, err
	}
	if cfg.regions, err = parseSizes(*regions); err != nil {
		return cfg, err
	}
	if cfg.batch, err = tierflags.ParseSize(*batch); err != nil {
		return cfg, err
	}
	if cfg.iters < 1 || cfg.eachRows < 1 {
		return cfg, fmt.Errorf("-iters and -each-rows must be positive")
	}
	for _, r := range cfg.rowSizes {
		if r <= 0 || r > cfg.batch {
			return cfg, fmt.Errorf("row size %d must be in (0, batch]", r)
		}
		for _, g := range cfg.regions {
			if g < r || g < cfg.batch {
				return cfg, fmt.Errorf("region %d smaller than a row or the batch", g)
			}
		}
	}
	return cfg, nil
}

func parseSizes(s string) ([]int64, error) {
	var out []int64
	for _, f := range strings.Split(s, ",") {
		n, err := tierflags.ParseSize(f)
		if err != nil {
			return nil, err
		}
		if n <= 0 {
			return nil, fmt.Errorf("size %q must be positive", f)
		}
		out = append(out, n)
	}
	return out, nil
}

type bench struct {
	cfg  config
	eng  kernels.Engine
	base kernels.Baseline
	rng  *rand.Rand
	log  io.Writer
}

// region maps and fills one region, registers it and runs every row size.
func (b *bench) region(size int64) ([]Result, Latency, error) {
	fmt.Fprintf(b.log, "region %s: mapping and touching every page...\n", tierflags.HumanSize(size))
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE|unix.MAP_NORESERVE)
	if err != nil {
		return nil, Latency{}, fmt.Errorf("map %d bytes: %w", size, err)
	}
	defer unix.Munmap(mem)
	if b.cfg.hugepages {
		unix.Madvise(mem, unix.MADV_HUGEPAGE)
	}
	for i := 0; i < len(mem); i += 4096 {
		mem[i] = byte(i >> 12) // real pages, not the shared zero page
	}
	id, err := b.eng.Register(mem)
	if err != nil {
		return nil, Latency{}, err
	}
	defer b.eng.Unregister(id)
	bounce, err := unix.Mmap(-1, 0, int(b.cfg.batch), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, Latency{}, err
	}
	defer unix.Munmap(bounce)
	bid, err := b.eng.Register(bounce)
	if err != nil {
		return nil, Latency{}, err
	}
	defer b.eng.Unregister(bid)
	buf, err := b.eng.Alloc(b.cfg.batch)
	if err != nil {
		return nil, Latency{}, err
	}
	defer buf.Free()
	s := &regionBench{bench: b, mem: mem, id: id, bounce: bounce, bid: bid, buf: buf}

	bulk, err := s.timeGBs(b.cfg.batch, func() error { return b.base.BulkCopy(buf, 0, kernels.At(bid, 0), b.cfg.batch) })
	if err != nil {
		return nil, Latency{}, err
	}
	lines := randomLineRate(mem, b.rng)
	var out []Result
	for _, rb := range b.cfg.rowSizes {
		fmt.Fprintf(b.log, "  rows of %s...\n", tierflags.HumanSize(rb))
		res, err := s.rows(rb)
		if err != nil {
			return nil, Latency{}, err
		}
		res.Region, res.BulkGBs, res.FusedVsBulk, res.LineMLoads = size, bulk, res.FusedGBs/bulk, lines
		res.LinesVsLoads = res.FusedMRows * float64((rb+63)/64) / lines
		out = append(out, res)
	}
	// DSA's decode step: 2048 rows of 656 B, or what fits a smaller -batch.
	lat, err := s.latency(int(min(2048, b.cfg.batch/656)), 656)
	lat.Region = size
	return out, lat, err
}

// randomLineRate is the region's rate of random 64-byte line loads, in
// millions a second, on every core: each goroutine reads one byte of each
// of its lines, the addresses known in advance, so the core keeps as many
// loads in flight as it can (none waits on another's data).
func randomLineRate(mem []byte, rng *rand.Rand) float64 {
	const lines = 1 << 21
	offs := make([]int64, lines)
	for i := range offs {
		offs[i] = rng.Int64N(int64(len(mem))/64) * 64
	}
	procs := runtime.GOMAXPROCS(0)
	var sink atomic.Uint64
	best := 0.0
	for range 3 {
		var wg sync.WaitGroup
		t0 := time.Now()
		for p := range procs {
			wg.Go(func() {
				var s uint64
				for _, o := range offs[p*lines/procs : (p+1)*lines/procs] {
					s += uint64(mem[o])
				}
				sink.Add(s)
			})
		}
		wg.Wait()
		best = max(best, lines/time.Since(t0).Seconds()/1e6)
	}
	return best
}

type regionBench struct {
	*bench
	mem    []byte
	id     kernels.RangeID
	bounce []byte
	bid    kernels.RangeID
	buf    kernels.Buffer
}

func (s *regionBench) randomRows(n int, rb int64) kernels.Rows {
	r := kernels.Rows{RowBytes: rb, Tier: make([]kernels.Addr, n), Buf: s.buf}
	cells := int64(len(s.mem)) / rb
	for i := range r.Tier {
		r.Tier[i] = kernels.At(s.id, s.rng.Int64N(cells)*rb)
	}
	return r
}

func (s *regionBench) rows(rb int64) (Result, error) {
	n := int(s.cfg.batch / rb)
	r := s.randomRows(n, rb)
	bytes := int64(n) * rb
	res := Result{RowBytes: rb, Rows: n}
	var err error
	if res.FusedGBs, err = s.timeGBs(bytes, func() error { return gatherWait(s.eng, r) }); err != nil {
		return res, err
	}
	res.FusedMRows = res.FusedGBs * 1e3 / float64(rb)
	sorted := r
	sorted.Tier = slices.Clone(r.Tier)
	slices.Sort(sorted.Tier)
	if res.SortedGBs, err = s.timeGBs(bytes, func() error { return gatherWait(s.eng, sorted) }); err != nil {
		return res, err
	}
	each := r
	each.Tier = r.Tier[:min(n, s.cfg.eachRows)]
	if res.EachGBs, err = s.timeGBs(int64(len(each.Tier))*rb, func() error { return s.base.CopyEach(each) }); err != nil {
		return res, err
	}
	if res.BounceGBs, err = s.timeGBs(bytes, func() error { return s.viaBounce(r) }); err != nil {
		return res, err
	}
	res.FusedVsEach = res.FusedGBs / res.EachGBs
	return res, nil
}

// viaBounce is the classic path: gather rows on the CPU into a registered
// (pinned) buffer, then one bulk copy.
func (s *regionBench) viaBounce(r kernels.Rows) error {
	rb := r.RowBytes
	for i, a := range r.Tier {
		copy(s.bounce[int64(i)*rb:int64(i+1)*rb], s.mem[a.Offset():])
	}
	return s.base.BulkCopy(s.buf, 0, kernels.At(s.bid, 0), int64(len(r.Tier))*rb)
}

func (s *regionBench) latency(n int, rb int64) (Latency, error) {
	lat := Latency{Rows: n, RowBytes: rb}
	const calls = 50
	var err error
	p50 := func(f func(r kernels.Rows) error) float64 {
		var ts []time.Duration
		for range calls {
			r := s.randomRows(n, rb) // fresh rows every call
			t0 := time.Now()
			if e := f(r); e != nil && err == nil {
				err = e
			}
			ts = append(ts, time.Since(t0))
		}
		slices.Sort(ts)
		return float64(ts[len(ts)/2].Nanoseconds()) / 1e3
	}
	lat.FusedUs = p50(func(r kernels.Rows) error { return gatherWait(s.eng, r) })
	lat.EachUs = p50(s.base.CopyEach)
	lat.BounceUs = p50(s.viaBounce)
	lat.Speedup = lat.EachUs / lat.FusedUs
	return lat, err
}

func gatherWait(e kernels.Engine, r kernels.Rows) error {
	h, err := e.Gather(r)
	if err != nil {
		return err
	}
	return h.Wait()
}

// timeGBs runs f once to warm up, then iters times, and returns GB/s.
func (s *regionBench) timeGBs(bytes int64, f func() error) (float64, error) {
	if err := f(); err != nil {
		return 0, err
	}
	t0 := time.Now()
	for range s.cfg.iters {
		if err := f(); err != nil {
			return 0, err
		}
	}
	return float64(bytes) * float64(s.cfg.iters) / time.Since(t0).Seconds() / 1e9, nil
}

func printTable(w io.Writer, rep Report) {
	fmt.Fprintf(w, "engine %s on %s, GOMAXPROCS %d, %s per call\n\n", rep.Engine, rep.CPU, rep.Procs, tierflags.HumanSize(rep.Batch))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "region\trow\trows/call\tfused GB/s\tM rows/s\tsorted GB/s\tper-row copy GB/s\tCPU+bulk GB/s\tbulk GB/s\tfused/per-row\tfused/bulk\trandom M lines/s\tfused lines/random\t")
	for _, r := range rep.Results {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%.1f\t%.2f\t%.3f\t%.2f\t%.2f\t%.1f×\t%.3f×\t%.1f\t%.2f×\t\n", tierflags.HumanSize(r.Region),
			tierflags.HumanSize(r.RowBytes), r.Rows, r.FusedGBs, r.FusedMRows, r.SortedGBs, r.EachGBs, r.BounceGBs, r.BulkGBs, r.FusedVsEach,
			r.FusedVsBulk, r.LineMLoads, r.LinesVsLoads)
	}
	tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "region\tcall\tfused p50 µs\tper-row p50 µs\tCPU+bulk p50 µs\tfused speed-up\t")
	for _, l := range rep.Latency {
		fmt.Fprintf(tw, "%s\t%d×%d B\t%.1f\t%.1f\t%.1f\t%.0f×\t\n", tierflags.HumanSize(l.Region), l.Rows, l.RowBytes,
			l.FusedUs, l.EachUs, l.BounceUs, l.Speedup)
	}
	tw.Flush()
}
