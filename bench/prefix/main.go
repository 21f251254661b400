// Command prefix benchmarks the prefix cache, each figure beside its
// baseline in the same run:
//
//   - keys per second of pinned lookups (then released), bare probes
//     (exists) and inserts (with eviction) with 1, 2 and 4 processes sharing
//     one index, each case run -runs times (median, min, max); inserts on
//     one shard (one lock: the baseline) and on eight;
//
//   - a batch of block moves (64 × 2 MiB) put, got with and without
//     checksum verification, against a plain copy of the same bytes between
//     the same fresh buffers, on one core and split over every core (the
//     store splits a batch of megabytes over the cores too), for
//     destinations at each of -move-dst-offsets past a page (a verified
//     get's kernel depends on it; verified_get.py does the same from
//     Python);
//
//   - the round trip of one KV block of an 8B-class model (16 and 64
//     tokens) through the tier — from host memory, and from a paged KV pool
//     through the engine's block gather/scatter — beside the same blocks
//     through Redis on loopback, the network-store baseline (Debian's
//     redis-server, started here).
//
// Run it with
//
//	go run ./bench/prefix
//	go run ./bench/prefix -procs 1,2 -rounds 20 -redis ''
//
// The tier is POSIX shared memory (/dev/shm) so that the worker processes,
// this program re-executed, map the same region. Each worker is one
// goroutine, so "per process" is "per core" while processes ≤ cores.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/cxltier/cxltier/bench/internal/report"
	"github.com/cxltier/cxltier/kernels"
)

// Report is the JSON written to -out.
type Report struct {
	Run       report.Run   `json:"run"`
	CPU       string       `json:"cpu"`
	Cores     int          `json:"cores"`
	Engine    string       `json:"engine"`
	Ops       []OpsResult  `json:"ops"`
	Moves     []MoveResult `json:"moves"`
	RoundTrip []RTResult   `json:"round_trip"`
	Redis     string       `json:"redis"` // version used, or why the baseline is missing
}

func main() {
	if spec := os.Getenv(envWorker); spec != "" {
		if err := runWorker(spec, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "prefix worker:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "prefix:", err)
		os.Exit(1)
	}
}

type options struct {
	procs         []int
	batches       []int
	shards        []int
	ops           map[string]bool
	tokens        []int
	duration      time.Duration
	runs          int
	rounds        int
	bytesPerToken int64
	moveBlocks    int
	moveBytes     int64
	moveRounds    int
	moveOffsets   []int
	redis         string
	engine        string
	out           string
	profile       string
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("prefix", flag.ContinueOnError)
	fs.SetOutput(stderr)
	procs := fs.String("procs", "1,2,4", "process counts for the ops/s cases")
	batches := fs.String("batch", "1,32", "keys per call for the ops/s cases")
	shards := fs.String("shards", "1,8", "shard counts for the insert cases (lookups use one)")
	ops := fs.String("ops", "lookup,exists,insert", "ops/s cases to run: lookup (pinned), exists (bare probe), insert ('' skips them all)")
	tokens := fs.String("tokens", "16,64", "tokens per block for the round-trip cases")
	o := options{}
	fs.DurationVar(&o.duration, "duration", time.Second, "measuring time of each ops/s case")
	fs.IntVar(&o.runs, "runs", 3, "runs of each ops/s case (the table shows the median, min and max)")
	fs.IntVar(&o.rounds, "rounds", 50, "round trips per block case")
	fs.Int64Var(&o.bytesPerToken, "bytes-per-token", 128<<10,
		"KV bytes per token (8B-class: 32 layers × K,V × 8 heads × 128 dims × 2 B)")
	fs.IntVar(&o.moveBlocks, "move-blocks", 64, "blocks per batch in the block-move cases (0 skips them)")
	fs.Int64Var(&o.moveBytes, "move-bytes", 2<<20, "bytes per block in the block-move cases")
	fs.IntVar(&o.moveRounds, "move-rounds", 5, "rounds of the block-move cases")
	offsets := fs.String("move-dst-offsets", "0,16", "where the block-move cases' destinations start past a 4 KiB page, in bytes")
	fs.StringVar(&o.redis, "redis", "redis-server", "redis-server binary for the baseline ('' skips it)")
	fs.StringVar(&o.engine, "engine", "cpu", "gather engine for the paged cases: cpu, cuda or auto")
	fs.StringVar(&o.out, "out", "", "JSON output (default bench/results/local/prefix-ENGINE.json)")
	fs.StringVar(&o.profile, "cpuprofile", "", "directory for each ops/s worker's CPU profile of its window (scripts/pgo.sh)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var err error
	if o.procs, err = report.Ints("-procs", *procs, 64); err != nil {
		return o, err
	}
	if o.batches, err = report.Ints("-batch", *batches, 4096); err != nil {
		return o, err
	}
	if o.shards, err = report.Ints("-shards", *shards, 32); err != nil {
		return o, err
	}
	if o.profile != "" {
		if o.profile, err = filepath.Abs(o.profile); err != nil { // the workers open it
			return o, err
		}
		if err := os.MkdirAll(o.profile, 0o755); err != nil {
			return o, fmt.Errorf("-cpuprofile: %w", err)
		}
	}
	if o.ops, err = parseOps(*ops); err != nil {
		return o, err
	}
	if o.tokens, err = report.Ints("-tokens", *tokens, 1024); err != nil {
		return o, err
	}
	if o.duration <= 0 || o.rounds < 1 || o.runs < 1 || o.bytesPerToken < 64 || o.bytesPerToken%64 != 0 {
		return o, fmt.Errorf("-duration, -runs and -rounds must be positive, -bytes-per-token a multiple of 64")
	}
	if o.moveOffsets, err = pageOffsets(*offsets); err != nil {
		return o, err
	}
	if o.moveBlocks < 0 || o.moveBlocks > 1<<16 || o.moveBytes < 1 || o.moveBytes > 1<<30 || o.moveRounds < 1 {
		return o, fmt.Errorf("-move-blocks must be in [0, 65536], -move-bytes in [1, 1GiB], -move-rounds positive")
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
	rep := Report{Run: report.NewRun(eng), CPU: report.CPUModel(), Cores: runtime.NumCPU(), Engine: eng.Name()}
	if rep.Ops, err = opsCases(o, stderr); err != nil {
		return err
	}
	if rep.Moves, err = moveCases(o, stderr); err != nil {
		return err
	}
	if rep.RoundTrip, rep.Redis, err = roundTripCases(o, eng, stderr); err != nil {
		return err
	}
	printTable(stdout, rep)
	return report.WriteJSON(o.out, "prefix", rep.Engine, rep, stderr)
}

// parseOps reads -ops: a comma-separated subset of the ops/s cases.
func parseOps(list string) (map[string]bool, error) {
	ops := map[string]bool{}
	for _, op := range strings.Split(list, ",") {
		switch op = strings.TrimSpace(op); op {
		case "":
		case "lookup", "exists", "insert":
			ops[op] = true
		default:
			return nil, fmt.Errorf("-ops: unknown op %q (want lookup, exists or insert)", op)
		}
	}
	return ops, nil
}

// pageOffsets parses -move-dst-offsets: byte offsets in [0, 4095].
func pageOffsets(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 0 || v > 4095 {
			return nil, fmt.Errorf("-move-dst-offsets: %q is not a byte offset in [0, 4095]", f)
		}
		out = append(out, v)
	}
	return out, nil
}
