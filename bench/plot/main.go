// Command plot turns the committed benchmark results (bench/results/*.json)
// into the SVG charts the README shows (docs/figures/): gather bandwidth by
// row size against the bulk-copy ceiling, the top-k step against its bound,
// Engram prefetch latency against the per-layer deadline, and prefix
// operations by process count. A result file that is missing is skipped
// with a note; one that does not parse is an error.
//
//	go run ./bench/plot                   # from the repository root
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
}

func run(args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("plot", flag.ContinueOnError)
	fl.SetOutput(stderr)
	in := fl.String("in", filepath.Join("bench", "results"), "directory of result JSON files")
	out := fl.String("out", filepath.Join("docs", "figures"), "directory for the SVG charts")
	if err := fl.Parse(args); err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	for _, c := range []struct {
		file, svg string
		make      func([]byte) (*plot.Plot, error)
	}{
		{"gather-cuda0.json", "gather.svg", gatherPlot},
		{"topk-cuda0.json", "topk.svg", topkPlot},
		{"engram-cuda0.json", "engram.svg", engramPlot},
		{"prefix-cpu.json", "prefix.svg", prefixPlot},
	} {
		raw, err := os.ReadFile(filepath.Join(*in, c.file))
		if errors.Is(err, fs.ErrNotExist) {
			fmt.Fprintf(stderr, "no %s: %s skipped\n", c.file, c.svg)
			continue
		}
		if err != nil {
			return err
		}
		p, err := c.make(raw)
		if err != nil {
			return fmt.Errorf("%s: %w", c.file, err)
		}
		path := filepath.Join(*out, c.svg)
		if err := p.Save(20*vg.Centimeter, 12*vg.Centimeter, path); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s from %s\n", path, c.file)
	}
	return nil
}

// lines adds named series (name, points, name, points, ...) to p, each
// sorted by x, with plotutil's distinct colours, dashes and glyphs.
func lines(p *plot.Plot, named ...any) error {
	var args []any
	for k := 0; k+1 < len(named); k += 2 {
		pts := named[k+1].(plotter.XYs)
		if len(pts) == 0 {
			continue
		}
		sort.Slice(pts, func(i, j int) bool { return pts[i].X < pts[j].X })
		args = append(args, named[k], pts)
	}
	return plotutil.AddLinePoints(p, args...)
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, x, y
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = vg.Points(8)
	p.Legend.Padding = vg.Points(2)
	p.Add(plotter.NewGrid())
	return p
}

func gatherPlot(raw []byte) (*plot.Plot, error) {
	var r struct {
		Engine  string `json:"engine"`
		Results []struct {
			Region   int64   `json:"region_bytes"`
			RowBytes int64   `json:"row_bytes"`
			Fused    float64 `json:"fused_gb_s"`
			Bulk     float64 `json:"bulk_gb_s"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, err
	}
	p := newPlot("Gather from the tier, "+r.Engine, "row bytes (log2)", "GB/s")
	p.Legend.Top, p.Legend.Left = false, false // the lines climb to the top right
	byRegion := map[int64]plotter.XYs{}
	ceiling := plotter.XYs{}
	for _, x := range r.Results {
		lx := log2(x.RowBytes)
		byRegion[x.Region] = append(byRegion[x.Region], plotter.XY{X: lx, Y: x.Fused})
		ceiling = append(ceiling, plotter.XY{X: lx, Y: x.Bulk})
	}
	var named []any
	for _, reg := range sortedKeys(byRegion) {
		named = append(named, fmt.Sprintf("fused gather, %d MiB region", reg>>20), byRegion[reg])
	}
	return p, lines(p, append(named, "bulk copy (ceiling)", maxPerX(ceiling))...)
}

func topkPlot(raw []byte) (*plot.Plot, error) {
	var r struct {
		Engine  string `json:"engine"`
		Results []struct {
			Batch    int     `json:"batch"`
			Context  int     `json:"context"`
			Overlap  float64 `json:"overlap"`
			Planner  string  `json:"planner"`
			P50      float64 `json:"resolve_fetch_p50_us"`
			NoBuffer float64 `json:"no_buffer_us"`
			Bound    float64 `json:"bound_us"`
		} `json:"results"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, err
	}
	p := newPlot("Top-k step, 64K context, 90% overlap, "+r.Engine, "batch", "µs per layer (p50)")
	series := map[string]plotter.XYs{}
	for _, x := range r.Results {
		if x.Context != 65536 || x.Overlap != 0.9 {
			continue
		}
		b := float64(x.Batch)
		series[x.Planner+" planner"] = append(series[x.Planner+" planner"], plotter.XY{X: b, Y: x.P50})
		if x.Planner == "engine" {
			series["no buffer (fetch every selection)"] = append(series["no buffer (fetch every selection)"], plotter.XY{X: b, Y: x.NoBuffer})
			series["bound (misses at gather bandwidth)"] = append(series["bound (misses at gather bandwidth)"], plotter.XY{X: b, Y: x.Bound})
		}
	}
	return p, lines(p, flatten(series)...)
}

func engramPlot(raw []byte) (*plot.Plot, error) {
	var r struct {
		Engine   string `json:"engine"`
		Prefetch []struct {
			Geometry string  `json:"geometry"`
			Batch    int     `json:"batch"`
			IDs      string  `json:"ids"`
			Cache    bool    `json:"hot_cache"`
			Planner  string  `json:"planner"`
			P50      float64 `json:"p50_us"`
			Deadline float64 `json:"deadline_us"`
		} `json:"prefetch"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, err
	}
	p := newPlot("Engram prefetch, V4.1-Flash, "+r.Engine, "batch (log2)", "µs call → rows ready (p50)")
	series := map[string]plotter.XYs{}
	var deadline plotter.XYs
	for _, x := range r.Prefetch {
		if x.Geometry != "v4.1-flash" || x.Cache || (x.Planner != "host" && x.Planner != "") {
			continue
		}
		b := log2(int64(x.Batch))
		series[x.IDs+" ids"] = append(series[x.IDs+" ids"], plotter.XY{X: b, Y: x.P50})
		deadline = append(deadline, plotter.XY{X: b, Y: x.Deadline})
	}
	return p, lines(p, append(flatten(series), "per-layer deadline", maxPerX(deadline))...)
}

func prefixPlot(raw []byte) (*plot.Plot, error) {
	var r struct {
		Engine string `json:"engine"`
		Ops    []struct {
			Op     string  `json:"op"`
			Shards int     `json:"shards"`
			Batch  int     `json:"batch"`
			Procs  int     `json:"procs"`
			Keys   float64 `json:"keys_per_s"`
		} `json:"ops"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, err
	}
	p := newPlot("Prefix index operations, "+r.Engine, "processes", "M keys/s (all processes)")
	series := map[string]plotter.XYs{}
	for _, x := range r.Ops {
		name := fmt.Sprintf("%s, batch %d", x.Op, x.Batch)
		if x.Op == "insert" && x.Shards > 0 {
			name = fmt.Sprintf("insert, %d shard(s), batch %d", x.Shards, x.Batch)
		}
		series[name] = append(series[name], plotter.XY{X: float64(x.Procs), Y: x.Keys / 1e6})
	}
	return p, lines(p, flatten(series)...)
}

// flatten lists a map's series as lines wants them, by name.
func flatten(series map[string]plotter.XYs) []any {
	var out []any
	for _, name := range sortedKeys(series) {
		out = append(out, name, series[name])
	}
	return out
}

func log2(n int64) float64 {
	l := 0.0
	for ; n > 1; n >>= 1 {
		l++
	}
	return l
}

// maxPerX keeps the largest y at each x.
func maxPerX(pts plotter.XYs) plotter.XYs {
	best := map[float64]float64{}
	for _, p := range pts {
		if y, ok := best[p.X]; !ok || p.Y > y {
			best[p.X] = p.Y
		}
	}
	out := plotter.XYs{}
	for x, y := range best {
		out = append(out, plotter.XY{X: x, Y: y})
	}
	return out
}

func sortedKeys[K int64 | string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
