package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestMain lets the test binary serve as a worker process, as the
// benchmark binary does.
func TestMain(m *testing.M) {
	if spec := os.Getenv(envWorker); spec != "" {
		if err := runWorker(spec, os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestSmallRun runs the whole benchmark at toy sizes: worker processes,
// both ops, both paths, and Redis when the machine has it. It checks the
// report's shape and that every figure was measured, not its speed.
func TestSmallRun(t *testing.T) {
	// Worker processes of a race build run this small benchmark 40 times
	// slower (85 s against 2 s), half of the README's test command: under
	// -race it runs only when asked; .ci/run runs it without -race.
	if raceEnabled && os.Getenv("CXLTIER_FULL_TESTS") == "" {
		t.Skip("85 s under -race: run without -race (go test ./bench/prefix), or set CXLTIER_FULL_TESTS=1")
	}
	redis := ""
	if _, err := exec.LookPath("redis-server"); err == nil {
		redis = "redis-server"
	}
	out := filepath.Join(t.TempDir(), "r.json")
	var stdout, stderr bytes.Buffer
	err := run([]string{"-procs", "1,2", "-batch", "1,4", "-duration", "50ms", "-runs", "2", "-rounds", "3", "-tokens", "1,2",
		"-bytes-per-token", "4096",
		"-move-blocks", "4", "-move-bytes", "300000", "-move-rounds", "2", "-redis", redis, "-out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	rep := readReport(t, out)
	if len(rep.Ops) != (2+2)*2*2 { // lookups and probes, inserts on 1 and 8 shards
		t.Errorf("%d ops cases, want 16", len(rep.Ops))
	}
	for _, o := range rep.Ops {
		if o.KeysPerSec <= 0 || o.Scaling <= 0 {
			t.Errorf("ops case not measured: %+v", o)
		}
	}
	if len(rep.Moves) != 6 {
		t.Errorf("%d block-move cases, want put, get and get-unverified at +0 and +16", len(rep.Moves))
	}
	for i, m := range rep.Moves {
		if m.MedianMs <= 0 || m.CopyMs <= 0 || m.VsCopy <= 0 || m.Blocks != 4 || m.DstOffset != []int{0, 16}[i/3] {
			t.Errorf("block move not measured: %+v", m)
		}
		if (m.Op == "get") != (m.VerifiedOverUnverified > 0) {
			t.Errorf("a get and only a get has its ratio to the unverified one: %+v", m)
		}
	}
	paths := map[string]int{}
	for _, r := range rep.RoundTrip {
		paths[r.Path]++
		if r.RTP50us <= 0 || r.GBps <= 0 || (redis != "" && r.VsRedis <= 0) {
			t.Errorf("round trip not measured: %+v", r)
		}
	}
	if paths["host"] != 2 || paths["paged-cpu"] != 2 || (redis != "" && paths["redis"] != 2) {
		t.Errorf("round-trip paths %v", paths)
	}
	if redis == "" {
		t.Log("redis-server not installed: the baseline was not exercised")
	}
	if !bytes.Contains(stdout.Bytes(), []byte("keys/s")) {
		t.Errorf("no table printed:\n%s", stdout.String())
	}
}

// TestOpsSubset: -ops runs only the cases it names, and -cpuprofile
// leaves each worker's profile.
func TestOpsSubset(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.json")
	var stderr bytes.Buffer
	profiles := t.TempDir()
	err := run([]string{"-ops", "exists", "-procs", "1", "-batch", "2", "-duration", "20ms", "-runs", "1", "-rounds", "1",
		"-tokens", "1", "-bytes-per-token", "4096", "-move-blocks", "0", "-redis", "", "-out", out,
		"-cpuprofile", profiles}, &bytes.Buffer{}, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	rep := readReport(t, out)
	if len(rep.Ops) != 1 || rep.Ops[0].Op != "exists" {
		t.Errorf("-ops exists ran %+v", rep.Ops)
	}
	got, _ := filepath.Glob(filepath.Join(profiles, "exists-*.pprof"))
	if len(got) != 1 {
		t.Fatalf("-cpuprofile wrote %v, want one worker's profile", got)
	}
	if fi, err := os.Stat(got[0]); err != nil || fi.Size() == 0 {
		t.Errorf("worker profile %s: %v, %v", got[0], fi, err)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-procs", "0"}, {"-procs", "a"}, {"-batch", ""}, {"-tokens", "2000"},
		{"-rounds", "0"}, {"-bytes-per-token", "100"}, {"extra"}, {"-ops", "lookup,scan"},
	} {
		if err := run(args, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

func readReport(t *testing.T, path string) Report {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	return rep
}
