package main

import (
	"bytes"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cxltier/cxltier/tier"
)

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestFormatThenInspect(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tier")
	code, out, errs := runCLI(t, "format", "-device", "file:"+path, "-size", "16MiB", "-chunk", "256KiB")
	if code != 0 {
		t.Fatalf("format: exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "formatted") || !strings.Contains(errs, "formatting 1 device(s) of 16MiB") {
		t.Errorf("format output: %q / %q", out, errs)
	}

	code, out, errs = runCLI(t, "inspect", path)
	if code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "file:"+path) {
		t.Errorf("inspect text does not name the device:\n%s", out)
	}

	code, out, errs = runCLI(t, "inspect", "-json", "file:"+path)
	if code != 0 {
		t.Fatalf("inspect -json: exit %d: %s", code, errs)
	}
	var snap tier.Snapshot
	if err := json.Unmarshal([]byte(out), &snap); err != nil {
		t.Fatalf("inspect -json output is not JSON: %v\n%s", err, out)
	}
	if snap.Size <= 0 || snap.Chunks.Size != 256<<10 || snap.Chunks.Used != 0 || snap.Chunks.Free != snap.Chunks.Total {
		t.Errorf("snapshot of a fresh tier: %+v", snap.Chunks)
	}

	// Formatting over an existing tier needs -force.
	if code, _, errs = runCLI(t, "format", "-device", "file:"+path, "-size", "16MiB"); code != 1 || !strings.Contains(errs, "exist") {
		t.Errorf("format over an existing tier: exit %d, %q", code, errs)
	}
	if code, _, errs = runCLI(t, "format", "-force", "-device", "file:"+path, "-size", "16MiB"); code != 0 {
		t.Errorf("format -force: exit %d, %q", code, errs)
	}
}

func TestInspectRefusesDamage(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if code, _, errs := runCLI(t, "format", "-device", "file:"+good, "-size", "16MiB"); code != 0 {
		t.Fatalf("format: %s", errs)
	}
	raw, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	truncated := filepath.Join(dir, "truncated")
	if err := os.WriteFile(truncated, raw[:len(raw)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	badMagic := filepath.Join(dir, "magic")
	damaged := bytes.Clone(raw)
	copy(damaged, "NOTATIER")
	if err := os.WriteFile(badMagic, damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{truncated, tier.ErrTruncated.Error()},
		{badMagic, tier.ErrBadMagic.Error()},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		code, _, errs := runCLI(t, "inspect", tc.path)
		if code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("inspect %s: exit %d, %q; want exit 1 and %q", filepath.Base(tc.path), code, errs, tc.want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: cxltier COMMAND"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"inspect"}, 2, "usage: cxltier inspect"},
		{[]string{"format", "-size", "huge"}, 2, "size"},
		{[]string{"format", "-device", "file:/x", "extra"}, 1, "unexpected arguments"},
		{[]string{"help"}, 0, "usage: cxltier COMMAND"},
	} {
		code, _, errs := runCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("cxltier %v: exit %d, %q; want exit %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}

func TestStatusWithoutDaemon(t *testing.T) {
	// A port that was just free: nothing listens on it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	code, _, errs := runCLI(t, "status", "-addr", addr)
	if code != 1 || !strings.Contains(errs, "is cxltierd running?") {
		t.Errorf("status with no daemon: exit %d, %q", code, errs)
	}
}

func TestEngramCommands(t *testing.T) {
	code, out, errs := runCLI(t, "engram", "hash", "--preset", "v4.1-flash", "--layer", "1", "--ids", "0,1,2")
	if code != 0 {
		t.Fatalf("engram hash: exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("want one line per position, got %d:\n%s", len(lines), out)
	}
	var first []int64
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || len(first) != 24 {
		t.Fatalf("line 1 is not a JSON array of 24 rows: %q (%v)", lines[0], err)
	}
	if first[0] != 5702652 || first[1] != 24393184 || first[2] != 39183301 {
		t.Errorf("engram.md check vector: %v", first[:3])
	}
	code, out, _ = runCLI(t, "engram", "multipliers", "--preset", "v4.1-flash", "--layer", "14")
	if code != 0 || strings.TrimSpace(out) != "[67716810739261,51510806800915,30921347202721,82619226485591]" {
		t.Errorf("multipliers: exit %d, %q", code, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"engram", "hash", "--preset", "v4.1-flash", "--layer", "1", "--ids", "0,99092"}, "ids[1] = 99092 outside [0, 99092)"},
		{[]string{"engram", "hash", "--preset", "v4.1-flash", "--layer", "2", "--ids", "0"}, "layer 2 is not an Engram layer"},
		{[]string{"engram", "hash", "--preset", "v4.1-flash", "--layer", "1", "--ids", "0,x"}, `position 1: "x"`},
		{[]string{"engram", "hash", "--preset", "nope", "--layer", "1", "--ids", "0"}, `no preset "nope"`},
		{[]string{"engram", "multipliers", "--preset", "demo"}, "--layer is required"},
		{[]string{"engram", "multipliers", "--layer", "1"}, "exactly one of --preset and --config"},
	} {
		code, _, errs := runCLI(t, tc.args...)
		if code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %q", tc.args, code, errs, tc.want)
		}
	}
}
