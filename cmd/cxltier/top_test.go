package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cxltier/cxltier/cmd/internal/adminapi"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/topk"
)

// TestDestroy: a tier with a live client is refused, a quiet one is
// removed.
func TestDestroy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tier")
	formatTier(t, path)
	b, _ := tier.ParseBacking("file:" + path)
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.Attach(tier.ClientOptions{Name: "busy"})
	if err != nil {
		t.Fatal(err)
	}
	if code, _, errs := runCLI(t, "destroy", path); code != 1 || !strings.Contains(errs, `"busy"`) {
		t.Fatalf("destroy with a live client: exit %d, %q", code, errs)
	} else if self := filepath.Base(os.Args[0]); !strings.Contains(errs, "running") || !strings.Contains(errs, self) {
		t.Errorf("the refusal does not say what the client runs (%s): %q", self, errs)
	}
	c.Close()
	r.Close()
	if code, out, errs := runCLI(t, "destroy", path); code != 0 || !strings.Contains(out, "destroyed") {
		t.Fatalf("destroy: exit %d, %q %q", code, out, errs)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the backing file is still there: %v", err)
	}
}

// TestTopRates: a screen shows tier use and per-second rates from two
// statuses a second apart.
func TestTopRates(t *testing.T) {
	a := adminapi.Status{Prefix: []prefix.Stats{{Name: "llama", Blocks: 64, Ready: 10, Hits: 100, Misses: 100}}, Topk: topk.Stats{Steps: 1000}}
	b := a
	b.Prefix = []prefix.Stats{{Name: "llama", Blocks: 64, Ready: 12, Hits: 350, Misses: 150, Inserts: 2}}
	b.Topk.Steps = 1500
	var out bytes.Buffer
	printTop(&out, &b, &a, time.Second)
	for _, want := range []string{"llama", "12/64", "300/s", "500/s", "2/s", "70.0%"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("screen lacks %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	printTop(&out, &b, nil, 0)
	if !strings.Contains(out.String(), "-") {
		t.Errorf("first screen shows rates without a previous status:\n%s", out.String())
	}
}

// TestRepair: a client that went silent (its process gone or stuck) holds
// its lease and chunks until a reaper runs; without a daemon, repair -dry-run
// reports it and repair reaps it, leaving the tier clean.
func TestRepair(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tier")
	if code, _, errs := runCLI(t, "format", "-device", "file:"+path, "-size", "16MiB", "-chunk", "256KiB", "-lease-timeout", "200ms"); code != 0 {
		t.Fatal(errs)
	}
	b, _ := tier.ParseBacking("file:" + path)
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.Attach(tier.ClientOptions{Name: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AllocChunks(2); err != nil {
		t.Fatal(err)
	}
	r.Close() // stops the heartbeat, leaves the lease and the chunks
	time.Sleep(500 * time.Millisecond)
	code, out, _ := runCLI(t, "repair", "-dry-run", path)
	if code != 0 || !strings.Contains(out, "repair would fix 1") || !strings.Contains(out, `"gone"`) {
		t.Fatalf("repair -dry-run: exit %d, %q", code, out)
	}
	code, out, errs := runCLI(t, "repair", path)
	if code != 0 || !strings.Contains(out, "1 client(s) reaped; 0 finding(s) left") || !strings.Contains(out, "2 chunks freed") {
		t.Fatalf("repair: exit %d, %q %q", code, out, errs)
	}
	if code, out, _ := runCLI(t, "inspect", "-deep", path); code != 0 {
		t.Fatalf("inspect -deep after repair: exit %d, %q", code, out)
	}
}

// TestResizeRefusesWithTheWay: resize is a clear refusal that says how.
func TestResizeRefusesWithTheWay(t *testing.T) {
	code, _, errs := runCLI(t, "resize", "-size", "8GiB", "shm:x")
	if code != 1 || !strings.Contains(errs, "cannot be resized in place") || !strings.Contains(errs, "prefix snapshot") {
		t.Fatalf("resize: exit %d, %q", code, errs)
	}
}

// TestTopIsPlainIntoAPipe: clear-screen codes go to a terminal only; a
// pipe, a file or a buffer gets plain screens.
func TestTopIsPlainIntoAPipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	f, err := os.CreateTemp(t.TempDir(), "top")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, out := range []io.Writer{w, f, &bytes.Buffer{}} {
		if isTerminal(out) {
			t.Errorf("%T taken for a terminal", out)
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		rw.Header().Set(adminapi.HealthHeader, "1") // as cxltierd answers (TestAdminEndpoints checks it does)
		json.NewEncoder(rw).Encode(adminapi.Status{Node: 1})
	}))
	defer srv.Close()
	code, out, errs := runCLI(t, "top", "-addr", strings.TrimPrefix(srv.URL, "http://"), "-interval", "100ms", "-n", "2")
	if code != 0 || strings.Contains(out, "\033[") || strings.Count(out, "cxltier top") != 2 {
		t.Fatalf("top -n 2 into a buffer: exit %d, %q %q", code, out, errs)
	}
}

// clientLabel: a client in this PID namespace is named with what its pid
// runs (whole, where the lease name is 8 bytes), one elsewhere says so, and
// a pid procfs does not know is named by its lease alone.
func TestClientLabel(t *testing.T) {
	procfs := t.TempDir()
	if err := os.MkdirAll(filepath.Join(procfs, "42"), 0o755); err != nil {
		t.Fatal(err)
	}
	cmdline := "python3\x00-m\x00cxltier.cluster.uplink\x00--tier\x00shm:cxltier\x00"
	if err := os.WriteFile(filepath.Join(procfs, "42", "cmdline"), []byte(cmdline), 0o644); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 200)
	if err := os.MkdirAll(filepath.Join(procfs, "43"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(procfs, "43", "cmdline"), []byte(long), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		lease tier.LeaseInfo
		want  string
	}{
		{tier.LeaseInfo{Slot: 1, PID: 42, Name: "cxltier-"}, `slot 1 pid 42 "cxltier-", running "python3 -m cxltier.cluster.uplink --tier shm:cxltier"`},
		{tier.LeaseInfo{Slot: 2, PID: 42, Name: "cxltier-", ElsewhereNS: true}, `slot 2 pid 42 "cxltier-" (in another PID namespace)`},
		{tier.LeaseInfo{Slot: 3, PID: 7, Name: "sglang-1"}, `slot 3 pid 7 "sglang-1"`},
		{tier.LeaseInfo{Slot: 4, PID: 43, Name: "x"}, `slot 4 pid 43 "x", running "` + long[:77] + `..."`},
	} {
		if got := clientLabel(tc.lease, procfs); got != tc.want {
			t.Errorf("clientLabel(%+v) = %s, want %s", tc.lease, got, tc.want)
		}
	}
}

// TestRepairDryRunOnAServedTier: a dry run beside a running daemon says the
// tier is in use (its findings may be changes in flight) and that repair
// itself would refuse; without the daemon it says nothing of the kind.
func TestRepairDryRunOnAServedTier(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tier")
	if code, _, errs := runCLI(t, "format", "-device", "file:"+path, "-size", "16MiB", "-chunk", "256KiB"); code != 0 {
		t.Fatal(errs)
	}
	b, _ := tier.ParseBacking("file:" + path)
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	m, err := tier.NewManager(r, tier.ManagerOptions{NoClientSocket: true})
	if err != nil {
		t.Fatal(err)
	}
	code, out, errs := runCLI(t, "repair", "-dry-run", path)
	if code != 0 || !strings.Contains(out, "a daemon serves node 0 of this tier") || !strings.Contains(out, "a change in flight") {
		t.Errorf("dry run beside a daemon: exit %d, %q %q", code, out, errs)
	}
	if code, _, errs := runCLI(t, "repair", path); code != 1 || !strings.Contains(errs, "runs already") {
		t.Errorf("repair beside a daemon: exit %d, %q", code, errs)
	}
	m.Close()
	if code, out, errs := runCLI(t, "repair", "-dry-run", path); code != 0 || strings.Contains(out, "daemon serves") {
		t.Errorf("dry run after the daemon stopped: exit %d, %q %q", code, out, errs)
	}
}
