package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestSmallRun runs the benchmark at toy sizes and checks that every case
// was measured and one was skipped for size; it says nothing of speed.
func TestSmallRun(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.json")
	var stdout, stderr bytes.Buffer
	err := run([]string{"-batch", "1,3", "-context", "600,100000", "-overlap", "0.5,0.9", "-k", "64", "-slots", "128",
		"-steps", "4", "-warm", "2", "-entry-bytes", "64", "-max-bytes", "4MiB", "-out", out}, &stdout, &stderr)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr.String())
	}
	raw, _ := os.ReadFile(out)
	var rep Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if len(rep.Results) != 2*2*2 || len(rep.Skipped) != 2 {
		t.Fatalf("%d results, %d skipped: %+v", len(rep.Results), len(rep.Skipped), rep)
	}
	// Both planners ran the same traces: the same bytes and hit rate.
	type key struct {
		batch   int
		overlap float64
	}
	seen := map[key]Result{}
	for _, r := range rep.Results {
		k := key{r.Batch, r.Overlap}
		if o, ok := seen[k]; ok && (o.Planner == r.Planner || o.BytesPerStep != r.BytesPerStep || o.HitRate != r.HitRate) {
			t.Errorf("planners disagree: %+v and %+v", o, r)
		}
		seen[k] = r
	}
	for _, r := range rep.Results {
		if r.P50us <= 0 || r.BytesPerStep <= 0 || r.NoBufferUs <= 0 || r.BoundUs <= 0 || r.HitRate <= 0 || r.HitRate >= 1 {
			t.Errorf("case not measured: %+v", r)
		}
	}
	if rep.GatherGBps <= 0 || rep.LaunchFloor <= 0 || rep.BulkGBps <= 0 {
		t.Errorf("engine figures: %+v", rep)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-batch", "0"}, {"-overlap", "1.5"}, {"-context", "x"}, {"-steps", "0"}, {"-planner", "gpu"}, {"-planner", "auto"}, {"extra"}} {
		if err := run(args, &bytes.Buffer{}, &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
