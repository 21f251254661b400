package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cxltier/cxltier/engram"
)

// What a newcomer types wrong gets a sentence saying what to do.
func TestNewcomerMistakes(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "tier")
	formatTier(t, dev)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"inspect"}, 2, "no DEVICE: name the tier's devices"},
		{[]string{"object", "ls"}, 2, "no DEVICE"},
		{[]string{"object", "rm", "name-only"}, 2, "no DEVICE"},
		{[]string{"format", "-device", "file:" + filepath.Join(dir, "t2"), "-size", "1GB"}, 2, "GB is ambiguous; write GiB"},
		{[]string{"status", "-addr", "https://127.0.0.1:7070"}, 1, "give HOST:PORT"},
		{[]string{"status", "-addr", "127.0.0.1:7070/v1"}, 1, "give HOST:PORT"},
		{[]string{"resize"}, 1, "wanted -size SIZE"},
		{[]string{"resize", "-size", "1GB"}, 1, "ambiguous"},
	} {
		code, _, errs := runCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
	// A scheme the admin API speaks is taken as the address it names.
	if code, _, errs := runCLI(t, "status", "-addr", "http://127.0.0.1:1/"); code != 1 || !strings.Contains(errs, "127.0.0.1:1/v1/status") {
		t.Errorf("http:// address: exit %d, %q", code, errs)
	}
}

func TestPresetsJSONAreConfigs(t *testing.T) {
	code, out, errs := runCLI(t, "engram", "presets", "-json")
	if code != 0 {
		t.Fatal(errs)
	}
	var gs []engram.Geometry
	if err := json.Unmarshal([]byte(out), &gs); err != nil || len(gs) != len(engram.PresetNames()) {
		t.Fatalf("presets -json: %v, %d geometries", err, len(gs))
	}
	for _, g := range gs {
		want, _ := engram.Preset(g.Name)
		if g.Name != want.Name || g.Vocab != want.Vocab || len(g.LayerIDs) != len(want.LayerIDs) {
			t.Errorf("%s: %+v", g.Name, g)
		}
	}
}

// presets -name writes a geometry file that --config takes as it stands.
func TestPresetAsConfigFile(t *testing.T) {
	code, out, errs := runCLI(t, "engram", "presets", "-name", "demo")
	if code != 0 {
		t.Fatal(errs)
	}
	file := filepath.Join(t.TempDir(), "my-model.json")
	if err := os.WriteFile(file, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	_, fromPreset, _ := runCLI(t, "engram", "hash", "--preset", "demo", "--layer", "1", "--ids", "5,6,7")
	code, fromFile, errs := runCLI(t, "engram", "hash", "--config", file, "--layer", "1", "--ids", "5,6,7")
	if code != 0 || fromFile != fromPreset || fromFile == "" {
		t.Fatalf("hash from the written file: exit %d, %q, want %q (%s)", code, fromFile, fromPreset, errs)
	}
	if code, _, errs := runCLI(t, "engram", "presets", "-name", "nonesuch"); code != 1 || !strings.Contains(errs, "nonesuch") {
		t.Fatalf("unknown preset: exit %d, %q", code, errs)
	}
}

func TestInspectJSONNamesKinds(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "tier")
	formatTier(t, dev)
	if code, _, errs := runCLI(t, "prefix", "create", "--name", "p", "--blocks", "4", "--block-bytes", "4KiB", "file:"+dev); code != 0 {
		t.Fatal(errs)
	}
	code, out, _ := runCLI(t, "inspect", "-json", "file:"+dev)
	if code != 0 || !strings.Contains(out, `"kind_tag"`) {
		t.Fatalf("inspect -json: exit %d, %s", code, out)
	}
}

// A snapshot is written through a fresh temporary: a file or link left
// where a fixed temporary name would be is neither followed nor clobbered.
func TestSnapshotTemporaryIsFresh(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "tier")
	formatTier(t, dev)
	if code, _, errs := runCLI(t, "prefix", "create", "--name", "m", "--blocks", "4", "--block-bytes", "4KiB", "file:"+dev); code != 0 {
		t.Fatal(errs)
	}
	victim := filepath.Join(dir, "victim")
	os.WriteFile(victim, []byte("keep me"), 0o600)
	snap := filepath.Join(dir, "m.zst")
	if err := os.Symlink(victim, snap+".tmp"); err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runCLI(t, "prefix", "snapshot", "--name", "m", "--out", snap, "file:"+dev); code != 0 {
		t.Fatal(errs)
	}
	if got, _ := os.ReadFile(victim); string(got) != "keep me" {
		t.Fatalf("the planted link was written through: %q", got)
	}
	left, _ := filepath.Glob(snap + ".*.tmp")
	if st, err := os.Stat(snap); err != nil || st.Size() == 0 || len(left) != 0 {
		t.Fatalf("snapshot %v (%v), temporaries left %v", st, err, left)
	}
}
