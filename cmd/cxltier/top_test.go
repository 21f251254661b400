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
		json.NewEncoder(rw).Encode(adminapi.Status{Node: 1})
	}))
	defer srv.Close()
	code, out, errs := runCLI(t, "top", "-addr", strings.TrimPrefix(srv.URL, "http://"), "-interval", "100ms", "-n", "2")
	if code != 0 || strings.Contains(out, "\033[") || strings.Count(out, "cxltier top") != 2 {
		t.Fatalf("top -n 2 into a buffer: exit %d, %q %q", code, out, errs)
	}
}
