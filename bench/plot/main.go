// Command plot turns the committed benchmark results (bench/results/*.json)
// into the SVG charts the README shows (docs/figures/): gather bandwidth by
// row size against the bulk-copy ceiling, the top-k step against its bound,
// Engram prefetch latency against the per-layer deadline, and prefix
// operations by process count. Ratios are what these charts are for, so
// their value axes are logarithmic where the series span more than a few
// times, sizes and batches are written as such (not as exponents), each
// series has its bound or baseline beside it, and a caption names the
// result file, the hardware and the date of the run. A result file that is
// missing is skipped with a note; one that does not parse is an error.
//
//	go run ./bench/plot                   # from the repository root
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/cxltier/cxltier/internal/tierflags"
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
	png := fl.Bool("png", false, "also write each chart as PNG beside it, to look at before committing")
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
		cap, err := caption(c.file, raw)
		if err != nil {
			return fmt.Errorf("%s: %w", c.file, err)
		}
		p.X.Label.Text += "\n" + cap
		path := filepath.Join(*out, c.svg)
		if err := save(p, path); err != nil {
			return err
		}
		if *png {
			if err := p.Save(20*vg.Centimeter, 12*vg.Centimeter, strings.TrimSuffix(path, ".svg")+".png"); err != nil {
				return err
			}
		}
		fmt.Fprintf(stdout, "wrote %s from %s\n", path, c.file)
	}
	return nil
}

// save writes p as SVG, naming generic fallbacks after the font gonum
// embeds the metrics of, so that a viewer without Liberation Serif draws a
// serif face of about the same width instead of its default.
func save(p *plot.Plot, path string) error {
	w, err := p.WriterTo(20*vg.Centimeter, 12*vg.Centimeter, "svg")
	if err != nil {
		return err
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		return err
	}
	svg := strings.ReplaceAll(b.String(), "font-family:Liberation Serif;", "font-family:'Liberation Serif','Times New Roman',Times,serif;")
	return os.WriteFile(path, []byte(svg), 0o644)
}

// caption is the chart's source line: the result file, the hardware and
// the date its run recorded.
func caption(file string, raw []byte) (string, error) {
	var r struct {
		Run struct {
			Date time.Time `json:"date"`
			CPU  string    `json:"cpu"`
			GPU  string    `json:"gpu"`
			Note string    `json:"note"`
		} `json:"run"`
		CPU    string `json:"cpu"`
		Engine string `json:"engine"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return "", err
	}
	hw := r.Run.CPU
	if hw == "" {
		hw = r.CPU
	}
	if r.Run.GPU != "" {
		hw = r.Run.GPU + " (" + r.Engine + "), host " + hw
	}
	date := "date not recorded"
	if !r.Run.Date.IsZero() {
		date = r.Run.Date.UTC().Format("2006-01-02")
		if strings.Contains(r.Run.Note, "added afterwards") {
			// Results older than run records carry the date of the commit
			// that brought them; the footer says so.
			date = "committed " + date + " (run undated)"
		}
	}
	// The date on a line of its own: the label is centred on the axis, and
	// one long line ran off the canvas's left edge.
	return fmt.Sprintf("source: bench/results/%s · %s\n%s", file, hw, date), nil
}

// logY makes p's value axis logarithmic, for series that span many times.
func logY(p *plot.Plot) {
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = ticks125{}
}

// ticks125 labels a log axis at 1, 2 and 5 times each power of ten, so
// that a range of less than a decade still has labels to read values by.
type ticks125 struct{}

func (ticks125) Ticks(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(min)); e <= math.Ceil(math.Log10(max)); e++ {
		for _, m := range []float64{1, 2, 5} {
			if v := m * math.Pow(10, e); v >= min && v <= max {
				ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	return ticks
}

// pow2Ticks labels an axis whose values are log2 exponents with the
// numbers themselves (label formats 2^x), one tick per exponent.
type pow2Ticks struct{ label func(int64) string }

func (t pow2Ticks) Ticks(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	for x := math.Max(math.Ceil(min), 0); x <= max && x < 62; x++ {
		ticks = append(ticks, plot.Tick{Value: x, Label: t.label(int64(1) << int(x))})
	}
	return ticks
}

// measured adds named series (name, points, name, points, ...) to p with
// a glyph at every measured point and a line only between neighbouring
// measured sizes (x one apart: the axes are log2), so that no line runs
// through a size that was not measured; plotutil's colours, dashes and
// glyphs tell the series apart.
func measured(p *plot.Plot, named ...any) error {
	i := 0
	for k := 0; k+1 < len(named); k += 2 {
		pts := named[k+1].(plotter.XYs)
		if len(pts) == 0 {
			continue
		}
		sort.Slice(pts, func(a, b int) bool { return pts[a].X < pts[b].X })
		sc, err := plotter.NewScatter(pts)
		if err != nil {
			return err
		}
		sc.GlyphStyle.Color, sc.GlyphStyle.Shape = plotutil.Color(i), plotutil.Shape(i)
		p.Add(sc)
		thumbs := []plot.Thumbnailer{sc}
		for start := 0; start < len(pts); {
			end := start + 1
			for end < len(pts) && pts[end].X-pts[end-1].X <= 1+1e-9 {
				end++
			}
			if end-start > 1 {
				l, err := plotter.NewLine(pts[start:end])
				if err != nil {
					return err
				}
				l.LineStyle.Color, l.LineStyle.Dashes = plotutil.Color(i), plotutil.Dashes(i)
				p.Add(l)
				if len(thumbs) == 1 {
					thumbs = append(thumbs, l)
				}
			}
			start = end
		}
		p.Legend.Add(named[k].(string), thumbs...)
		i++
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
	p := newPlot("Gather from pinned host memory (not a tier), "+r.Engine, "row size", "GB/s")
	p.Legend.Top, p.Legend.Left = false, false // the lines climb to the right: below them is empty
	p.X.Tick.Marker = pow2Ticks{tierflags.HumanSize}
	p.Y.Min = 0 // a linear axis from 0: heights compare as rates do
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
	return p, measured(p, append(named, "bulk copy (ceiling)", maxPerX(ceiling))...)
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
	p := newPlot("Top-k step against its bound, 64K context, 90% overlap, "+r.Engine, "batch (requests)", "µs per layer (p50, log scale)")
	logY(p)
	p.X.Tick.Marker = pow2Ticks{func(n int64) string { return strconv.FormatInt(n, 10) }}
	series := map[string]plotter.XYs{}
	for _, x := range r.Results {
		if x.Context != 65536 || x.Overlap != 0.9 {
			continue
		}
		b := log2(int64(x.Batch))
		series[x.Planner+" planner"] = append(series[x.Planner+" planner"], plotter.XY{X: b, Y: x.P50})
		if x.Planner == "engine" {
			series["no buffer (fetch every selection)"] = append(series["no buffer (fetch every selection)"], plotter.XY{X: b, Y: x.NoBuffer})
			series["bound (misses at gather bandwidth)"] = append(series["bound (misses at gather bandwidth)"], plotter.XY{X: b, Y: x.Bound})
		}
	}
	return p, measured(p, flatten(series)...)
}

func engramPlot(raw []byte) (*plot.Plot, error) {
	var r struct {
		Engine   string `json:"engine"`
		Base     int64  `json:"base_size_per_order"`
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
	title := "Engram prefetch against the per-layer deadline, V4.1-Flash geometry, " + r.Engine
	if r.Base > 0 && r.Base != v41Base {
		title += fmt.Sprintf("\ntables scaled down: %s rows per order and head (V4.1-Flash: %s, %.0f× more)",
			groupDigits(r.Base), groupDigits(v41Base), float64(v41Base)/float64(r.Base))
	}
	p := newPlot(title, "batch (requests, one token each)", "µs call → rows ready (p50, log scale)")
	logY(p)
	p.X.Tick.Marker = pow2Ticks{func(n int64) string { return strconv.FormatInt(n, 10) }}
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
	return p, measured(p, append(flatten(series), "per-layer deadline", maxPerX(deadline))...)
}

func prefixPlot(raw []byte) (*plot.Plot, error) {
	var r struct {
		Engine string `json:"engine"`
		Cores  int    `json:"cores"`
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
	p := newPlot(fmt.Sprintf("Prefix index: scaling with processes (%d cores)", r.Cores), "processes",
		"rate ÷ one process's rate")
	p.X.Min = -1 // room left of one process for the legend
	p.Legend.Top, p.Legend.Left = true, true
	p.X.Tick.Marker = pow2Ticks{func(n int64) string { return strconv.FormatInt(n, 10) }}
	one := map[string]float64{}
	for _, x := range r.Ops {
		if x.Procs == 1 {
			one[opName(x.Op, x.Shards, x.Batch)] = x.Keys
		}
	}
	series := map[string]plotter.XYs{}
	ideal := plotter.XYs{}
	for _, x := range r.Ops {
		name := opName(x.Op, x.Shards, x.Batch)
		base := one[name]
		if base <= 0 {
			continue
		}
		label := fmt.Sprintf("%s (%.2g M keys/s at 1)", name, base/1e6)
		series[label] = append(series[label], plotter.XY{X: log2(int64(x.Procs)), Y: x.Keys / base})
		ideal = append(ideal, plotter.XY{X: log2(int64(x.Procs)), Y: float64(min(x.Procs, max(r.Cores, 1)))})
	}
	return p, lines(p, append(flatten(series), fmt.Sprintf("bound: one process per core (%d)", r.Cores), maxPerX(ideal))...)
}

func opName(op string, shards, batch int) string {
	if op == "insert" && shards > 0 {
		return fmt.Sprintf("insert, %d shard(s), batch %d", shards, batch)
	}
	return fmt.Sprintf("%s, batch %d", op, batch)
}

// v41Base is DeepSeek-V4.1-Flash's base table size per n-gram order.
const v41Base = 16_000_000

func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + " " + s[i:]
	}
	return s
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
