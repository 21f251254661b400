package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"time"

	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

// OpsResult is one ops/s case: every process runs op in a loop on one
// goroutine for the same window.
type OpsResult struct {
	Op         string  `json:"op"` // lookup (pinned, then released), exists (the bare probe) or insert (with eviction)
	Shards     int     `json:"shards"`
	Batch      int     `json:"batch"`
	Procs      int     `json:"procs"`
	Runs       int     `json:"runs"`
	KeysPerSec float64 `json:"keys_per_s"` // median of the runs
	MinKeys    float64 `json:"min_keys_per_s"`
	MaxKeys    float64 `json:"max_keys_per_s"`
	PerProcess float64 `json:"keys_per_s_per_process"`
	Scaling    float64 `json:"scaling_vs_1_proc"` // KeysPerSec / KeysPerSec of 1 process, same op and batch
}

const (
	envWorker    = "CXLTIER_PREFIX_BENCH_WORKER"
	opsIndex     = "ops"
	opsBlocks    = 8192
	opsBlockSize = 512
)

// job is what a worker process is told through its environment.
type job struct {
	Device string `json:"device"`
	Index  string `json:"index"`
	Op     string `json:"op"`
	Batch  int    `json:"batch"`
	Worker int    `json:"worker"`
	Run    int    `json:"run"` // distinct per case, so inserts never meet keys of an earlier case
	// Profile, if set, is a directory for the worker's CPU profile of its
	// measuring window (scripts/pgo.sh merges them into the build's profile).
	Profile string `json:"profile,omitempty"`
}

// benchKey is key i of a family: lookups read family 0, worker w of case
// run inserts family run<<16|w+1. The bytes are mixed so keys look like digests.
func benchKey(family, i uint64) prefix.Key {
	var k prefix.Key
	x := i*0x9e3779b97f4a7c15 ^ (family+1)*0xd6e8feb86659fd93
	for w := 0; w < 4; w++ {
		x ^= x >> 30
		x *= 0xbf58476d1ce4e5b9
		x ^= x >> 27
		binary.LittleEndian.PutUint64(k[8*w:], x)
	}
	return k
}

// opsCases measures lookups and bare probes on a full index, then inserts
// for each shard count in -shards (one shard is the single-lock baseline),
// each on a fresh index (lookups leave their entries marked used, which
// the first evictions after them pay for), for each process count and
// batch size. The lookup index is one shard of exactly the keys' blocks (a
// 2 MiB table, as the figures before shards were taken on); the insert
// indexes have twice the blocks of the keys they are filled with, so that
// no shard evicts one before the inserts start.
func opsCases(o options, log io.Writer) ([]OpsResult, error) {
	dev := fmt.Sprintf("shm:cxltier-bench-prefix-%d", os.Getpid())
	r, c, err := formatShm(dev, 128<<20)
	if err != nil {
		return nil, err
	}
	defer removeShm(r, c, dev)
	var out []OpsResult
	run := 0
	cases := func(name string, blocks int64, shards int, ops []string) error {
		s, err := prefix.Create(c, prefix.Config{Name: name, Blocks: blocks, BlockBytes: opsBlockSize, Shards: shards})
		if err != nil {
			return err
		}
		defer s.Close()
		if err := fillLookupKeys(s); err != nil {
			return err
		}
		shards = int(s.Stats().Shards)
		for _, op := range ops {
			for _, batch := range o.batches {
				// Runs go round the process counts in turn, so that a slow
				// spell of a shared machine falls on all of them alike.
				rates := make([][]float64, len(o.procs))
				for range o.runs {
					for p, procs := range o.procs {
						fmt.Fprintf(log, "%s, %d shard(s), batch %d, %d process(es)...\n", op, shards, batch, procs)
						run++
						rate, err := runWorkers(job{Device: dev, Index: name, Op: op, Batch: batch, Run: run, Profile: o.profile}, procs, o.duration)
						if err != nil {
							return err
						}
						rates[p] = append(rates[p], rate)
					}
				}
				var one float64
				for p, procs := range o.procs {
					r := rates[p]
					slices.Sort(r)
					res := OpsResult{Op: op, Shards: shards, Batch: batch, Procs: procs, Runs: len(r),
						KeysPerSec: r[len(r)/2], MinKeys: r[0], MaxKeys: r[len(r)-1]}
					res.PerProcess = res.KeysPerSec / float64(procs)
					if procs == 1 {
						one = res.KeysPerSec
					}
					if one > 0 {
						res.Scaling = res.KeysPerSec / one
					}
					out = append(out, res)
				}
			}
		}
		if bad, err := s.Check(true); err != nil || len(bad) > 0 {
			return fmt.Errorf("index %q after its cases: %v %v", name, bad, err)
		}
		s.Close()
		return prefix.Destroy(c, name)
	}
	var reads []string
	for _, op := range []string{"lookup", "exists"} {
		if o.ops[op] {
			reads = append(reads, op)
		}
	}
	if len(reads) > 0 {
		if err := cases(opsIndex+"-lookup", opsBlocks, 1, reads); err != nil {
			return nil, err
		}
	}
	for _, shards := range o.shards {
		if !o.ops["insert"] {
			break
		}
		if err := cases(fmt.Sprintf("%s-insert-%d", opsIndex, shards), 2*opsBlocks, shards, []string{"insert"}); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func fillLookupKeys(s *prefix.Store) error {
	payload := make([]byte, opsBlockSize)
	keys := make([]prefix.Key, 0, 256)
	payloads := make([][]byte, 0, 256)
	for i := range uint64(opsBlocks) {
		keys = append(keys, benchKey(0, i))
		payloads = append(payloads, payload)
		if len(keys) == cap(keys) {
			if _, err := s.Set(keys, payloads); err != nil {
				return err
			}
			keys, payloads = keys[:0], payloads[:0]
		}
	}
	if n := s.Exists([]prefix.Key{benchKey(0, 0), benchKey(0, opsBlocks-1)}); n != 2 {
		return fmt.Errorf("lookup keys were not all stored")
	}
	return nil
}

// runWorkers starts procs workers, lets them all go at once when every one
// has mapped the tier, and returns the keys they handled in d.
func runWorkers(j job, procs int, d time.Duration) (keysPerSec float64, err error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	type worker struct {
		cmd *exec.Cmd
		in  io.WriteCloser
		out *bufio.Reader
	}
	var ws []worker
	defer func() {
		for _, w := range ws {
			w.cmd.Process.Kill()
			w.cmd.Wait()
		}
	}()
	for i := range procs {
		j.Worker = i
		spec, _ := json.Marshal(j)
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), envWorker+"="+string(spec))
		cmd.Stderr = os.Stderr
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			return 0, fmt.Errorf("start worker: %w", err)
		}
		w := worker{cmd, in, bufio.NewReader(out)}
		ws = append(ws, w)
		if line, err := w.out.ReadString('\n'); line != "ready\n" {
			return 0, fmt.Errorf("worker %d: %q %v", i, line, err)
		}
	}
	for _, w := range ws {
		fmt.Fprintf(w.in, "go %d\n", d.Nanoseconds())
	}
	var total float64
	for i, w := range ws {
		line, err := w.out.ReadString('\n')
		var n, ns int64
		if _, serr := fmt.Sscanf(line, "done %d %d", &n, &ns); serr != nil || ns <= 0 {
			return 0, fmt.Errorf("worker %d: %q %v", i, line, err)
		}
		total += float64(n) / (float64(ns) / 1e9)
	}
	return total, nil
}

// runWorker is the worker process: map the tier, say ready, wait for go,
// run the op until the window closes, report the keys handled and the
// time they took.
func runWorker(spec string, stdin io.Reader, stdout io.Writer) error {
	var j job
	if err := json.Unmarshal([]byte(spec), &j); err != nil {
		return fmt.Errorf("job %q: %w", spec, err)
	}
	b, err := tier.ParseBacking(j.Device)
	if err != nil {
		return err
	}
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		return err
	}
	defer r.Close()
	c, err := r.Attach(tier.ClientOptions{Name: fmt.Sprintf("bench-%d", j.Worker)})
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := prefix.Open(c, j.Index)
	if err != nil {
		return err
	}
	defer s.Close()
	step, err := stepFor(s, j)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, "ready")
	line, err := bufio.NewReader(stdin).ReadString('\n')
	var ns int64
	if _, serr := fmt.Sscanf(line, "go %d", &ns); serr != nil {
		return fmt.Errorf("waiting for go: %q %v", line, err)
	}
	stop, err := startProfile(j)
	if err != nil {
		return err
	}
	// The clock is read every callsPerClock calls (a read costs as much as
	// a lookup in a VM), and the rate is of the time the calls really took.
	const callsPerClock = 64
	var keys int64
	start := time.Now()
	end := start.Add(time.Duration(ns))
	for now := start; now.Before(end); now = time.Now() {
		for range callsPerClock {
			if err := step(); err != nil {
				return err
			}
		}
		keys += int64(callsPerClock * j.Batch)
	}
	took := time.Since(start)
	if err := stop(); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "done %d %d\n", keys, took.Nanoseconds())
	return nil
}

// startProfile starts the CPU profile of j's worker when j asks for one
// and returns what ends it.
func startProfile(j job) (stop func() error, err error) {
	if j.Profile == "" {
		return func() error { return nil }, nil
	}
	path := filepath.Join(j.Profile, fmt.Sprintf("%s-batch%d-run%d-worker%d.pprof", j.Op, j.Batch, j.Run, j.Worker))
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile %s: %w", path, err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("cpu profile %s: %w", path, err)
		}
		return nil
	}, nil
}

// stepFor returns one call of j's op on batch keys. Lookups read windows
// of a sequence of stored keys drawn at random once, before the clock
// starts (the probe is measured, not a generator), and reuse their hits
// slice, as a server does.
func stepFor(s *prefix.Store, j job) (func() error, error) {
	rng := rand.New(rand.NewPCG(uint64(j.Worker), 7))
	keys := make([]prefix.Key, j.Batch)
	draws := make([]prefix.Key, 1<<16+j.Batch)
	for i := range draws {
		draws[i] = benchKey(0, rng.Uint64N(opsBlocks))
	}
	at := 0
	window := func() []prefix.Key {
		if at += j.Batch; at > 1<<16 {
			at = 0
		}
		return draws[at : at+j.Batch]
	}
	switch j.Op {
	case "lookup":
		var hits []prefix.Hit
		return func() error {
			keys := window()
			var err error
			hits, err = s.LookupAppend(hits[:0], keys)
			if err == nil && len(hits) != len(keys) {
				err = fmt.Errorf("lookup: %d of %d hits", len(hits), len(keys))
			}
			s.Release(hits)
			return err
		}, nil
	case "exists":
		return func() error {
			keys := window()
			if n := s.Exists(keys); n != len(keys) {
				return fmt.Errorf("exists: %d of %d", n, len(keys))
			}
			return nil
		}, nil
	case "insert":
		payload := make([]byte, opsBlockSize)
		payloads := make([][]byte, j.Batch)
		for i := range payloads {
			payloads[i] = payload
		}
		next := uint64(0)
		return func() error {
			for i := range keys {
				keys[i] = benchKey(uint64(j.Run)<<16|uint64(j.Worker)+1, next)
				next++
			}
			st, err := s.Set(keys, payloads)
			for _, x := range st {
				if err == nil && x != prefix.Reserved {
					err = fmt.Errorf("insert: status %v", x)
				}
			}
			return err
		}, nil
	}
	return nil, fmt.Errorf("unknown op %q", j.Op)
}

func formatShm(dev string, size int64) (*tier.Region, *tier.Client, error) {
	b, err := tier.ParseBacking(dev)
	if err != nil {
		return nil, nil, err
	}
	g := tier.DefaultGeometry()
	g.DeviceSize = size
	r, err := tier.Format(tier.Options{Devices: []tier.Backing{b}, Geometry: g})
	if err != nil {
		return nil, nil, err
	}
	c, err := r.Attach(tier.ClientOptions{Name: "bench"})
	if err != nil {
		r.Close()
		os.Remove(b.Path)
		return nil, nil, err
	}
	return r, c, nil
}

func removeShm(r *tier.Region, c *tier.Client, dev string) {
	c.Close()
	r.Close()
	os.Remove(tier.ShmDir + "/" + strings.TrimPrefix(dev, "shm:"))
}
