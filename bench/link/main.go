// Command link measures what bulk tier traffic does to the transfers
// that have a deadline on the same link: an Engram prefetcher calls at its
// per-layer cadence, each call due within its deadline, while other
// processes store and load KV pages through the tier at full speed, as
// two engines' KV traffic does, and another fills the tier as the node's
// uplink does from the cluster (a part at a time, every page checked
// before it is published). Every party is an OS process of its own,
// mapping one tier file, on the CPU engine, where the link they share is
// the host's memory bandwidth and its cores, or on a GPU (-engine cuda),
// where it is that GPU's PCIe link and the host memory behind it.
//
// Each round runs its phases of -seconds each: the prefetcher alone (its
// idle miss rate and latency), the bulk processes (KV and fills) alone
// (their throughput alone) and beside a process that only spins a core,
// then all of them at once, without the arbiter and with it. The table gives each
// phase's figures and the goals the issue on deadlines sets for a node
// that arbitrates its link (deadline misses at most the idle rate plus
// 0.5 points, p99 latency at most 1.2 times idle, bulk throughput at least
// 0.9 times alone), which these figures, taken with no arbiter, are the
// baseline for.
//
// With -with ttft the party with a deadline is a request's KV load, which
// its first token waits on: with the arbiter it is a first-token transfer
// (tier/link), which the stores and fills give way to, as a KV pool's
// loads are on a tier that joined the link.
//
//	go run ./bench/link
//	go run ./bench/link -kv 2 -batch 32 -seconds 5 -rounds 3
//	go run ./bench/link -with ttft
//	bench-link -engine cuda            (a cuda build: scripts/gpu-suite link)
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cxltier/cxltier/bench/internal/report"
	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/internal/tierflags"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

func main() {
	var err error
	if len(os.Args) > 1 && os.Args[1] == roleArg {
		err = runRole(os.Args[2:], os.Stdout)
	} else {
		err = run(os.Args[1:], os.Stdout, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "link:", err)
		os.Exit(1)
	}
}

// partyGrace is how long past its phase's end a party may take to report
// (a KV party ends its last round of a store and a load first).
const partyGrace = 30 * time.Second

// roleArg, as the first argument, makes this program one party of a
// phase (a process the parent started), not the parent.
const roleArg = "-party"

// opts are the parent's flags; the parties get the ones they need.
type opts struct {
	tierDir  string
	tierSize int64
	seconds  float64
	rounds   int
	kv       int
	fill     int   // cluster-fill processes (uplinks)
	fillPart int64 // the part a fill moves in
	base     int64
	batch    int
	deadline time.Duration
	gap      time.Duration
	layers   int
	pages    int
	chunk    int64
	geometry string
	out      string
	keepTier bool
	tierPath string
	engine   string // the parties' engine: cpu or cuda
	// arbiter: "off", "on", or "both" (a mixed phase each way, every round).
	arbiter string
	piece   int64
	share   float64
	// party: the transfer with a deadline, "engram" (a prefetch a layer)
	// or "topk" (a sparse-attention step's fetches, a layer at a time).
	party        string
	topK         int
	context      int64
	topkHit      float64
	topkLayers   int
	topkDeadline time.Duration
	// ttft: the load a request's first token waits on.
	ttftPages    int
	ttftGap      time.Duration
	ttftDeadline time.Duration
	kvFirst      bool // with the arbiter, the KV processes' loads are first-token transfers
	// bulkPriority: with the arbiter, the KV processes' stores are copied
	// on threads of this priority (the CPU engine's background threads).
	bulkPriority kernels.Priority
	// mixedPriority: the same in the mixed phase, without the arbiter.
	mixedPriority kernels.Priority
}

func parseOpts(args []string, stderr io.Writer) (opts, error) {
	fs := flag.NewFlagSet("link", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o opts
	size := fs.String("tier-size", "512MiB", "size of the tier file")
	fs.StringVar(&o.tierDir, "tier-dir", tier.ShmDir, "directory of the tier file (a tmpfs: /dev/shm, or a huge-page mount)")
	fs.Float64Var(&o.seconds, "seconds", 3, "length of each phase")
	fs.IntVar(&o.rounds, "rounds", 2, "rounds of the three phases, one after another")
	fs.IntVar(&o.kv, "kv", 2, "KV processes (each stores and loads its own pages)")
	fs.IntVar(&o.fill, "fill", 1, "cluster-fill processes (each fills its own index as the node's uplink does: a part at a time, every page checked)")
	fillPartSize := fs.String("fill-part", tierflags.HumanSize(fillPart), "fill: the part a fill moves in, a link turn before each (the uplink's on a node's link; 0: one part)")
	fs.Int64Var(&o.base, "base", 20000, "Engram table base size per order (rows spread over base × orders)")
	fs.IntVar(&o.batch, "batch", 1, "decode tokens per Engram call")
	fs.DurationVar(&o.deadline, "deadline", 56*time.Microsecond, "time allowed from an Engram call to its rows being ready")
	fs.DurationVar(&o.gap, "gap", 56*time.Microsecond, "the layer's compute between one call's rows and the next call (spun on the core, as a thread driving a GPU waits)")
	fs.IntVar(&o.layers, "layers", 16, "KV: layers of a page (K and V each)")
	fs.IntVar(&o.pages, "pages", 32, "KV: pages each KV process stores and loads a round")
	fs.Int64Var(&o.chunk, "chunk", 32<<10, "KV: bytes of one layer's K (or V) of a page")
	fs.StringVar(&o.geometry, "geometry", "v4.1-flash", "Engram geometry: "+fmt.Sprint(engram.PresetNames()))
	fs.StringVar(&o.out, "out", "", "JSON output (default bench/results/local/link-cpu.json)")
	fs.BoolVar(&o.keepTier, "keep-tier", false, "leave the tier file behind")
	fs.StringVar(&o.arbiter, "arbiter", "both", "the link arbiter (tier/link) in the mixed phase: off, on, or both (a mixed phase each way every round)")
	fs.StringVar(&o.engine, "engine", "cpu", "the parties' engine: cpu, or cuda (device 0; a build with -tags cuda)")
	fs.Int64Var(&o.piece, "piece", 0, "with the arbiter: bytes a KV process moves between looks at the link's claims (0: the engine's default, 256 KiB on the CPU, 1 MiB on a GPU)")
	fs.Float64Var(&o.share, "share", 0.25, "with the arbiter: the most of each 100 ms window a KV process waits on one process's claims")
	fs.StringVar(&o.party, "with", "engram", "the transfer with a deadline: engram (a prefetch each layer), topk (a sparse-attention decode's top-k fetches, a layer at a time) or ttft (a request's KV load, which its first token waits on)")
	fs.IntVar(&o.topK, "topk", 2048, "topk: selections per request and layer")
	fs.Int64Var(&o.context, "context", 32768, "topk: tokens of each request's context (-batch requests)")
	fs.Float64Var(&o.topkHit, "topk-hit", 0.9, "topk: the share of a layer's selection kept from the step before")
	fs.IntVar(&o.topkLayers, "topk-layers", 8, "topk: sparse-attention layers of a step")
	fs.DurationVar(&o.topkDeadline, "topk-deadline", 300*time.Microsecond, "topk: time allowed for one layer's fetches")
	fs.IntVar(&o.ttftPages, "ttft-pages", 16, "ttft: pages of a request's load (KV pages of -layers and -chunk)")
	fs.DurationVar(&o.ttftGap, "ttft-gap", 20*time.Millisecond, "ttft: time between one load's end and the next request's")
	fs.DurationVar(&o.ttftDeadline, "ttft-deadline", 20*time.Millisecond, "ttft: time a load may take before it is late")
	bulkPriority := fs.String("bulk-priority", "low", "with the arbiter, the CPU threads that copy the KV processes' stores (low: nice 19, as on a tier that joined the link; idle: SCHED_IDLE; or normal) and those of the fills (as an uplink run at that priority)")
	mixedPriority := fs.String("mixed-bulk-priority", "normal", "the same in the mixed phase, without the arbiter: low or idle measures lowering the bulk threads alone")
	kvFirst := fs.String("kv-first-token", "auto", "with the arbiter, the KV processes' loads are first-token transfers (on) or bulk (off); auto: as a KV pool's on the engine, first-token on cuda, bulk on cpu")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	n, err := tierflags.ParseSize(*size)
	if err != nil {
		return o, fmt.Errorf("-tier-size: %w", err)
	}
	o.tierSize = n
	if o.fillPart, err = tierflags.ParseSize(*fillPartSize); err != nil {
		return o, fmt.Errorf("-fill-part: %w", err)
	}
	if o.bulkPriority, err = kernels.ParsePriority(*bulkPriority); err != nil || *bulkPriority == "" {
		return o, fmt.Errorf("-bulk-priority %q: low, idle or normal", *bulkPriority)
	}
	if o.mixedPriority, err = kernels.ParsePriority(*mixedPriority); err != nil || *mixedPriority == "" {
		return o, fmt.Errorf("-mixed-bulk-priority %q: low, idle or normal", *mixedPriority)
	}
	switch *kvFirst {
	case "auto":
		o.kvFirst = o.engine == "cuda"
	case "on", "off":
		o.kvFirst = *kvFirst == "on"
	default:
		return o, fmt.Errorf("-kv-first-token %q: auto, on or off", *kvFirst)
	}
	switch {
	case o.seconds <= 0 || o.rounds < 1 || o.kv < 1 || o.batch < 1 || o.layers < 1 || o.pages < 1:
		return o, errors.New("-seconds, -rounds, -kv, -batch, -layers and -pages must be positive")
	case o.fill < 0:
		return o, fmt.Errorf("-fill %d: want 0 or more", o.fill)
	case o.base < 1 || o.deadline <= 0 || o.gap < 0:
		return o, errors.New("-base and -deadline must be positive, -gap at least 0")
	case o.chunk < 64 || o.chunk%64 != 0:
		return o, fmt.Errorf("-chunk %d: a positive multiple of 64 bytes", o.chunk)
	case o.arbiter != "off" && o.arbiter != "on" && o.arbiter != "both":
		return o, fmt.Errorf("-arbiter %q: off, on or both", o.arbiter)
	case o.piece < 0:
		return o, fmt.Errorf("-piece %d: want positive, or 0 for the engine's default", o.piece)
	case o.engine != "cpu" && o.engine != "cuda":
		return o, fmt.Errorf("-engine %q: cpu or cuda", o.engine)
	case o.share <= 0 || o.share > 1:
		return o, fmt.Errorf("-share %v: want (0, 1]", o.share)
	case o.party != "engram" && o.party != "topk" && o.party != "ttft":
		return o, fmt.Errorf("-with %q: engram, topk or ttft", o.party)
	case o.ttftPages < 1 || o.ttftGap < 0 || o.ttftDeadline <= 0:
		return o, fmt.Errorf("-ttft-pages %d, -ttft-gap %v, -ttft-deadline %v: want positive pages and deadline, a gap of at least 0",
			o.ttftPages, o.ttftGap, o.ttftDeadline)
	case o.topK < 1 || o.context < int64(o.topK) || o.context > 1<<31-1 || o.topkLayers < 1 || o.topkDeadline <= 0:
		return o, fmt.Errorf("-topk %d, -context %d, -topk-layers %d, -topk-deadline %v: want positive, a context of at least -topk tokens",
			o.topK, o.context, o.topkLayers, o.topkDeadline)
	case o.topkHit < 0 || o.topkHit > 1:
		return o, fmt.Errorf("-topk-hit %v: want 0..1", o.topkHit)
	}
	if _, err := o.engramGeometry(); err != nil {
		return o, err
	}
	if o.piece == 0 {
		o.piece = kernels.DefaultPiece
		if o.engine == "cuda" {
			o.piece = kernels.DevicePiece
		}
	}
	return o, nil
}

// engramGeometry is -geometry scaled by -base.
func (o opts) engramGeometry() (engram.Geometry, error) {
	g, err := scaledGeometry(o.geometry, o.base)
	if err != nil {
		return g, fmt.Errorf("-geometry: %w", err)
	}
	return g, nil
}

// scaledGeometry is preset name with every order's base size base and its
// first Engram layer alone (the one a call is timed on): the parent builds
// the table by it and the prefetcher party opens it by it.
func scaledGeometry(name string, base int64) (engram.Geometry, error) {
	g, err := engram.Preset(name)
	if err != nil {
		return g, err
	}
	for i := range g.BaseSizes {
		g.BaseSizes[i] = base
	}
	g.LayerIDs = g.LayerIDs[:1]
	return g, nil
}

func (o opts) kvBlockBytes() int64 { return 2 * int64(o.layers) * o.chunk }

// Phase is what one phase measured: the prefetcher's calls and the KV
// processes' bytes (each absent when the phase ran without them).
type Phase struct {
	Name   string  `json:"name"`
	Engram *Party  `json:"engram,omitempty"`
	TopK   *Party  `json:"topk,omitempty"`
	TTFT   *Party  `json:"ttft,omitempty"`
	KV     []Party `json:"kv,omitempty"`
	Fill   []Party `json:"fill,omitempty"`
	// KVBytesPerSec is all KV processes' bytes (stored plus loaded) a
	// second, FillBytesPerSec the fill processes' (filled), and
	// BulkBytesPerSec both: the bulk traffic the goal is set on.
	KVBytesPerSec   float64 `json:"kv_bytes_per_sec,omitempty"`
	FillBytesPerSec float64 `json:"fill_bytes_per_sec,omitempty"`
	BulkBytesPerSec float64 `json:"bulk_bytes_per_sec,omitempty"`
}

// Round is one round's phases and the ratios the goals are set on.
type Round struct {
	Idle Phase `json:"idle"`
	Bulk Phase `json:"bulk"`
	// BesideCompute is the KV processes beside a process that spins a core
	// as the prefetcher does (its compute) and moves nothing: on a machine
	// with few cores, what the KV traffic keeps of the cores alone.
	BesideCompute Phase `json:"bulk_beside_compute"`
	// Mixed, without the arbiter and with it (either absent when -arbiter
	// left it out).
	Mixed      *Phase   `json:"mixed,omitempty"`
	Arbitrated *Phase   `json:"arbitrated,omitempty"`
	Without    *Outcome `json:"without_arbiter,omitempty"`
	With       *Outcome `json:"with_arbiter,omitempty"`
}

// Outcome is a mixed phase against the phases alone.
type Outcome struct {
	// MissPointsOverIdle: the mixed phase's miss rate minus the idle one's,
	// in percentage points (goal ≤ 0.5).
	MissPointsOverIdle float64 `json:"miss_points_over_idle"`
	// P99OverIdle: the mixed phase's p99 call over the idle one's (goal ≤ 1.2).
	P99OverIdle float64 `json:"p99_over_idle"`
	// BulkKept: the bulk throughput (KV and fills) mixed over alone (goal
	// ≥ 0.9), and over beside a spinning core (what is left once the cores
	// are shared).
	BulkKept              float64 `json:"bulk_kept"`
	BulkKeptBesideCompute float64 `json:"bulk_kept_beside_compute"`
}

// deadline is the phase's party with a deadline (nil: none ran).
func (ph *Phase) deadline() *Party {
	switch {
	case ph.TopK != nil:
		return ph.TopK
	case ph.TTFT != nil:
		return ph.TTFT
	}
	return ph.Engram
}

func outcome(rd *Round, mixed *Phase) *Outcome {
	return &Outcome{
		MissPointsOverIdle:    100 * (mixed.deadline().MissRate - rd.Idle.deadline().MissRate),
		P99OverIdle:           mixed.deadline().P99us / rd.Idle.deadline().P99us,
		BulkKept:              mixed.BulkBytesPerSec / rd.Bulk.BulkBytesPerSec,
		BulkKeptBesideCompute: mixed.BulkBytesPerSec / rd.BesideCompute.BulkBytesPerSec,
	}
}

// TopKSpec is the top-k party's shape.
type TopKSpec struct {
	TopK       int     `json:"topk"`
	Context    int64   `json:"context"`
	Hit        float64 `json:"hit"`
	Layers     int     `json:"layers"`
	DeadlineUs float64 `json:"deadline_us"`
	EntryBytes int     `json:"entry_bytes"`
}

// TTFTSpec is the first-token party's shape.
type TTFTSpec struct {
	Pages      int     `json:"pages"`
	PageBytes  int64   `json:"page_bytes"`
	GapMs      float64 `json:"gap_ms"`
	DeadlineMs float64 `json:"deadline_ms"`
}

// Report is the JSON result.
type Report struct {
	report.Run
	Engine      string    `json:"engine"`      // the parties': cpu, or cuda:0
	Arbitration string    `json:"arbitration"` // off, on or both
	Party       string    `json:"party"`       // engram or topk
	TopK        *TopKSpec `json:"topk,omitempty"`
	TTFT        *TTFTSpec `json:"ttft,omitempty"`
	PieceBytes  int64     `json:"piece_bytes"`
	Share       float64   `json:"share"`
	Tier        string    `json:"tier"`
	TierFS      string    `json:"tier_fs,omitempty"`
	Seconds     float64   `json:"seconds_per_phase"`
	Geometry    string    `json:"geometry"`
	Batch       int       `json:"batch"`
	DeadlineUs  float64   `json:"deadline_us"`
	GapUs       float64   `json:"gap_us"`
	KVProcs     int       `json:"kv_processes"`
	KVPageBytes int64     `json:"kv_page_bytes"`
	KVPages     int       `json:"kv_pages"`
	// Fill processes, their pages (the KV pages' size and count) and
	// the part each moves in.
	FillProcs     int   `json:"fill_processes"`
	FillPartBytes int64 `json:"fill_part_bytes"`
	// KVFirstToken: with the arbiter the KV processes' loads were
	// first-token transfers.
	KVFirstToken bool `json:"kv_first_token"`
	// BulkPriority: with the arbiter, the priority of the CPU threads
	// that copied the KV processes' stores.
	BulkPriority string `json:"bulk_priority"`
	// MixedBulkPriority: the same in the mixed phase, without the arbiter.
	MixedBulkPriority string  `json:"mixed_bulk_priority"`
	Rounds            []Round `json:"rounds"`
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parseOpts(args, stderr)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp(o.tierDir, "cxltier-link-")
	if err != nil {
		return fmt.Errorf("tier directory: %w", err)
	}
	if !o.keepTier {
		defer os.RemoveAll(dir)
	}
	o.tierPath = filepath.Join(dir, "tier")
	fmt.Fprintf(stderr, "formatting a %s tier at %s; the %s party's data, %d KV indexes and %d to fill...\n", tierflags.HumanSize(o.tierSize), o.tierPath, o.party, o.kv, o.fill)
	if err := prepare(o, stderr); err != nil {
		return err
	}
	eng, err := kernels.New(o.engine) // names the device in the report
	if err != nil {
		return err
	}
	defer eng.Close()
	rep := Report{Run: report.NewRun(eng), Engine: eng.Name(), Arbitration: o.arbiter, PieceBytes: o.piece, Share: o.share, Tier: o.tierPath, TierFS: mountOf(o.tierDir), Seconds: o.seconds,
		Geometry: o.geometry, Batch: o.batch, DeadlineUs: us(o.deadline), GapUs: us(o.gap),
		KVProcs: o.kv, KVPageBytes: o.kvBlockBytes(), KVPages: o.pages, Party: o.party, FillProcs: o.fill, FillPartBytes: o.fillPart, KVFirstToken: o.kvFirst, BulkPriority: o.bulkPriority.String(), MixedBulkPriority: o.mixedPriority.String()}
	if o.party == "topk" {
		rep.TopK = &TopKSpec{TopK: o.topK, Context: o.context, Hit: o.topkHit, Layers: o.topkLayers, DeadlineUs: us(o.topkDeadline), EntryBytes: topkEntryBytes}
	}
	if o.party == "ttft" {
		rep.TTFT = &TTFTSpec{Pages: o.ttftPages, PageBytes: o.kvBlockBytes(), GapMs: us(o.ttftGap) / 1e3, DeadlineMs: us(o.ttftDeadline) / 1e3}
	}
	for i := range o.rounds {
		rd, err := runRound(o, i, stderr)
		if err != nil {
			return err
		}
		rep.Rounds = append(rep.Rounds, rd)
	}
	printTable(stdout, rep)
	return report.WriteJSON(o.out, "link", eng.Name(), rep, stderr)
}

// prepare formats the tier and makes what the parties open: the Engram
// table and one KV index per KV process.
func prepare(o opts, log io.Writer) error {
	b, err := tier.ParseBacking("file:" + o.tierPath)
	if err != nil {
		return err
	}
	geo := tier.DefaultGeometry()
	geo.DeviceSize = o.tierSize / geo.ChunkSize * geo.ChunkSize
	r, err := tier.Format(tier.Options{Devices: []tier.Backing{b}, Geometry: geo})
	if err != nil {
		return err
	}
	defer r.Close()
	c, err := r.Attach(tier.ClientOptions{Name: "link"})
	if err != nil {
		return err
	}
	defer c.Close()
	if o.party == "engram" { // the top-k party appends its own sequences
		if err := makeEngramTable(c, o, log); err != nil {
			return err
		}
	}
	type index struct {
		name  string
		pages int
	}
	var names []index
	if o.party == "ttft" {
		names = append(names, index{ttftIndex, o.ttftPages})
	}
	for i := range o.kv {
		names = append(names, index{kvName(i), o.pages})
	}
	for i := range o.fill {
		names = append(names, index{fillName(i), o.pages})
	}
	for _, ix := range names {
		s, err := prefix.Create(c, prefix.Config{Name: ix.name, Blocks: int64(ix.pages), BlockBytes: o.kvBlockBytes(), PinsPerClient: 4 * int64(ix.pages)})
		if err != nil {
			return fmt.Errorf("index %s: %w (a larger -tier-size, or fewer -pages)", ix.name, err)
		}
		if err := s.Close(); err != nil {
			return err
		}
	}
	return nil
}

// makeEngramTable builds the table the Engram party prefetches from.
func makeEngramTable(c *tier.Client, o opts, log io.Writer) error {
	g, _ := o.engramGeometry()
	h, err := engram.NewHasher(g)
	if err != nil {
		return err
	}
	if _, err := engram.CreateTable(c, g, h, g.LayerIDs[0], func(i int64, row []byte) error {
		engram.SyntheticRow(g.LayerIDs[0], i, row)
		return nil
	}, log); err != nil {
		return fmt.Errorf("engram table: %w (a larger -tier-size, or a smaller -base)", err)
	}
	return nil
}

func kvName(i int) string   { return "link-kv" + strconv.Itoa(i) }
func fillName(i int) string { return "link-fill" + strconv.Itoa(i) }

// phaseSpec is one phase: who takes part, and whether under the arbiter.
type phaseSpec struct {
	name                   string
	engram, kv, spin, arbd bool
	bulk                   kernels.Priority // of the KV processes' stores and the fills
}

// runRound runs the phases alone, then mixed without the arbiter and with
// it, as -arbiter asks.
func runRound(o opts, round int, log io.Writer) (Round, error) {
	var rd Round
	type step struct {
		spec phaseSpec
		keep func(Phase)
	}
	steps := []step{
		{phaseSpec{name: "idle", engram: true}, func(p Phase) { rd.Idle = p }},
		{phaseSpec{name: "bulk", kv: true}, func(p Phase) { rd.Bulk = p }},
		{phaseSpec{name: "bulk+spin", kv: true, spin: true}, func(p Phase) { rd.BesideCompute = p }},
	}
	if o.arbiter != "on" {
		steps = append(steps, step{phaseSpec{name: "mixed", engram: true, kv: true, bulk: o.mixedPriority}, func(p Phase) { rd.Mixed = &p }})
	}
	if o.arbiter != "off" {
		steps = append(steps, step{phaseSpec{name: "arbitrated", engram: true, kv: true, arbd: true, bulk: o.bulkPriority}, func(p Phase) { rd.Arbitrated = &p }})
	}
	for _, st := range steps {
		fmt.Fprintf(log, "round %d: %s phase (%.1f s)...\n", round+1, st.spec.name, o.seconds)
		got, err := runPhase(o, st.spec)
		if err != nil {
			return rd, fmt.Errorf("round %d, %s phase: %w", round+1, st.spec.name, err)
		}
		st.keep(got)
	}
	if rd.Mixed != nil {
		rd.Without = outcome(&rd, rd.Mixed)
	}
	if rd.Arbitrated != nil {
		rd.With = outcome(&rd, rd.Arbitrated)
	}
	return rd, nil
}

// runPhase starts the phase's parties together and collects what each
// reports.
func runPhase(o opts, spec phaseSpec) (Phase, error) {
	// The parties start at one instant, after each has set itself up (on
	// a GPU, a context and the tier pinned in each).
	setup := time.Second + time.Duration(o.kv+o.fill)*200*time.Millisecond
	if o.engine == "cuda" {
		setup = 3*time.Second + time.Duration(o.kv)*time.Second
	}
	start := time.Now().Add(setup)
	end := start.Add(time.Duration(o.seconds * float64(time.Second)))
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	add := func(role string, extra ...string) error {
		self, err := os.Executable()
		if err != nil {
			return err
		}
		args := append([]string{roleArg, "-role", role, "-tier", o.tierPath, "-engine", o.engine,
			"-start", strconv.FormatInt(start.UnixNano(), 10), "-end", strconv.FormatInt(end.UnixNano(), 10)}, extra...)
		cmd := exec.Command(self, args...)
		out := new(bytes.Buffer)
		cmd.Stdout, cmd.Stderr = out, os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("start the %s party: %w", role, err)
		}
		cmds, outs = append(cmds, cmd), append(outs, out)
		return nil
	}
	arb := []string{"-arbiter=" + strconv.FormatBool(spec.arbd), "-piece", strconv.FormatInt(o.piece, 10),
		"-share", strconv.FormatFloat(o.share, 'g', -1, 64)}
	var err error
	switch {
	case spec.engram && o.party == "topk":
		err = add("topk", append(arb, "-batch", strconv.Itoa(o.batch), "-layers", strconv.Itoa(o.topkLayers), "-topk", strconv.Itoa(o.topK),
			"-context", strconv.FormatInt(o.context, 10), "-topk-hit", strconv.FormatFloat(o.topkHit, 'g', -1, 64),
			"-deadline", o.topkDeadline.String(), "-gap", o.gap.String())...)
	case spec.engram && o.party == "ttft":
		err = add("ttft", append(arb, "-index", ttftIndex, "-layers", strconv.Itoa(o.layers), "-pages", strconv.Itoa(o.ttftPages),
			"-chunk", strconv.FormatInt(o.chunk, 10), "-deadline", o.ttftDeadline.String(), "-gap", o.ttftGap.String())...)
	case spec.engram:
		err = add("engram", append(arb, "-geometry", o.geometry, "-base", strconv.FormatInt(o.base, 10), "-batch", strconv.Itoa(o.batch),
			"-deadline", o.deadline.String(), "-gap", o.gap.String())...)
	}
	if spec.spin && err == nil {
		err = add("spin")
	}
	for i := 0; spec.kv && i < o.kv && err == nil; i++ {
		err = add("kv", append(arb, "-first-token="+strconv.FormatBool(o.kvFirst), "-bulk-priority", spec.bulk.String(), "-index", kvName(i), "-layers", strconv.Itoa(o.layers), "-pages", strconv.Itoa(o.pages),
			"-chunk", strconv.FormatInt(o.chunk, 10))...)
	}
	for i := 0; spec.kv && i < o.fill && err == nil; i++ {
		err = add("fill", append(arb, "-bulk-priority", spec.bulk.String(), "-index", fillName(i), "-layers", strconv.Itoa(o.layers), "-pages", strconv.Itoa(o.pages),
			"-chunk", strconv.FormatInt(o.chunk, 10), "-fill-part", strconv.FormatInt(o.fillPart, 10))...)
	}
	ph := Phase{Name: spec.name}
	// A party past its phase by this much is stuck: it is killed, and the
	// phase fails naming it, rather than the run waiting for ever.
	stuck := time.AfterFunc(time.Until(end)+partyGrace, func() {
		for _, cmd := range cmds {
			cmd.Process.Kill()
		}
	})
	defer stuck.Stop()
	for i, cmd := range cmds {
		if werr := cmd.Wait(); werr != nil && err == nil {
			err = fmt.Errorf("party %d (%v): %w", i, cmd.Args[3], werr)
		}
	}
	if err != nil {
		return ph, err
	}
	for _, out := range outs {
		var p Party
		if err := json.Unmarshal(out.Bytes(), &p); err != nil {
			return ph, fmt.Errorf("a party's report %q: %w", out.String(), err)
		}
		switch p.Role {
		case "engram":
			ph.Engram = &p
		case "topk":
			ph.TopK = &p
		case "ttft":
			ph.TTFT = &p
		case "kv":
			ph.KV = append(ph.KV, p)
			ph.KVBytesPerSec += p.BytesPerSec
			ph.BulkBytesPerSec += p.BytesPerSec
		case "fill":
			ph.Fill = append(ph.Fill, p)
			ph.FillBytesPerSec += p.BytesPerSec
			ph.BulkBytesPerSec += p.BytesPerSec
		}
	}
	return ph, nil
}

func printTable(w io.Writer, rep Report) {
	if t := rep.TTFT; t != nil {
		fmt.Fprintf(w, "a request's KV load of %d × %s pages (every page checked), late past %.1f ms, a request %.1f ms after the last one's load; calls are loads",
			t.Pages, tierflags.HumanSize(t.PageBytes), t.DeadlineMs, t.GapMs)
	} else if t := rep.TopK; t != nil {
		fmt.Fprintf(w, "top-k steps of %d layers, batch %d, %d of %d tokens a layer (%.0f%% kept from the step before), deadline %.0f µs a layer, %.0f µs of attention after each; p50 and p99 are a step's",
			t.Layers, rep.Batch, t.TopK, t.Context, 100*t.Hit, t.DeadlineUs, rep.GapUs)
	} else {
		fmt.Fprintf(w, "Engram %s, batch %d, deadline %.0f µs, a call every %.0f µs after the last one's rows", rep.Geometry, rep.Batch, rep.DeadlineUs, rep.GapUs)
	}
	kvLoads := "bulk"
	if rep.KVFirstToken {
		kvLoads = "first-token"
	}
	fmt.Fprintf(w, "; %d KV processes (with the arbiter: loads %s, stores on threads of %s priority; without: %s) and %d fills (parts of %s) of %d × %s pages; arbiter: %s (pieces of %s)\n",
		rep.KVProcs, kvLoads, rep.BulkPriority, rep.MixedBulkPriority, rep.FillProcs, tierflags.HumanSize(rep.FillPartBytes), rep.KVPages, tierflags.HumanSize(rep.KVPageBytes), rep.Arbitration, tierflags.HumanSize(rep.PieceBytes))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tphase\tcalls\tmisses %\tp50 µs\tp99 µs\tKV GB/s\tfill GB/s\t")
	for i, rd := range rep.Rounds {
		for _, ph := range []*Phase{&rd.Idle, &rd.Bulk, &rd.BesideCompute, rd.Mixed, rd.Arbitrated} {
			if ph == nil {
				continue
			}
			calls, miss, p50, p99, kv, fill := "-", "-", "-", "-", "-", "-"
			if e := ph.deadline(); e != nil {
				calls, miss = strconv.Itoa(e.Calls), fmt.Sprintf("%.2f", 100*e.MissRate)
				p50, p99 = fmt.Sprintf("%.1f", e.P50us), fmt.Sprintf("%.1f", e.P99us)
			}
			if ph.KV != nil {
				kv = fmt.Sprintf("%.2f", ph.KVBytesPerSec/1e9)
			}
			if ph.Fill != nil {
				fill = fmt.Sprintf("%.2f", ph.FillBytesPerSec/1e9)
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", i+1, ph.Name, calls, miss, p50, p99, kv, fill)
		}
	}
	tw.Flush()
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tarbiter\tmisses over idle (goal ≤ 0.5 pt)\tp99 over idle (goal ≤ 1.2×)\tbulk kept (goal ≥ 0.9×)\tbulk kept beside a spinning core\t")
	for i, rd := range rep.Rounds {
		for _, oc := range []struct {
			name string
			o    *Outcome
		}{{"off", rd.Without}, {"on", rd.With}} {
			if oc.o == nil {
				continue
			}
			fmt.Fprintf(tw, "%d\t%s\t%+.2f pt %s\t%.2f× %s\t%.2f× %s\t%.2f×\t\n", i+1, oc.name,
				oc.o.MissPointsOverIdle, met(oc.o.MissPointsOverIdle <= 0.5), oc.o.P99OverIdle, met(oc.o.P99OverIdle <= 1.2),
				oc.o.BulkKept, met(oc.o.BulkKept >= 0.9), oc.o.BulkKeptBesideCompute)
		}
	}
	tw.Flush()
}

func met(ok bool) string {
	if ok {
		return "(met)"
	}
	return "(missed)"
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// mountOf is the filesystem the tier file lies on and its options, from
// /proc/self/mounts ("tmpfs rw,huge=always"), so a result says whether its
// tier had huge pages; "" where it cannot tell.
func mountOf(dir string) string {
	raw, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return ""
	}
	dir, _ = filepath.Abs(dir)
	best, found := "", ""
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		at := f[1]
		if (dir == at || strings.HasPrefix(dir, strings.TrimSuffix(at, "/")+"/")) && len(at) >= len(best) {
			best, found = at, f[2]+" "+f[3]
		}
	}
	return found
}
