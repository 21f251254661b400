package main

import (
	"bytes"
	"context"
	"errors"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

// TestPrefixesFollowTheDirectory: after an index is destroyed and created
// again (another geometry, the same chunks), the daemon's next look drops
// its old handle and watches the new index; its reclaim pass leaves the new
// index intact. The daemon used to keep the old handle and reclaim with the
// old geometry into the new index.
func TestPrefixesFollowTheDirectory(t *testing.T) {
	r, c := tiertest.Format(t, 1, 16<<20, 256<<10)
	var logs bytes.Buffer
	px := &prefixes{c: c, logger: log.New(&logs, "", 0), open: map[string]*prefix.Store{}, failed: map[string]string{}}
	defer px.close()
	cli, err := r.Attach(tier.ClientOptions{Name: "cli"})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	s, err := prefix.Create(cli, prefix.Config{Name: "p", Blocks: 8, BlockBytes: 4096})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	px.refresh()
	if got := px.stats(); len(got) != 1 || got[0].Blocks != 8 {
		t.Fatalf("watching %+v", got)
	}
	if err := prefix.Destroy(cli, "p"); err != nil {
		t.Fatal(err)
	}
	s, err = prefix.Create(cli, prefix.Config{Name: "p", Blocks: 4, BlockBytes: 8192})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	px.refresh()
	px.reclaim()
	if got := px.stats(); len(got) != 1 || got[0].Blocks != 4 {
		t.Fatalf("after the index was created again, watching %+v", got)
	}
	if !strings.Contains(logs.String(), "dropped the daemon's handle") {
		t.Errorf("log: %s", logs.String())
	}
	if bad, err := s.Check(true); err != nil || len(bad) != 0 {
		t.Fatalf("the new index: %v, %v", bad, err)
	}
}

// TestPortTakenLeavesNoTier: a daemon whose admin port is taken exits with
// an error and formats nothing; it used to format the tier first and leave
// the file behind.
func TestPortTakenLeavesNoTier(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	path := filepath.Join(t.TempDir(), "tier")
	var logs bytes.Buffer
	err = run(context.Background(), []string{"-device", "file:" + path, "-size", "32MiB", "-chunk", "256KiB",
		"-listen", ln.Addr().String(), "-prefix-blocks", "0"}, &logs)
	if err == nil || !strings.Contains(err.Error(), "admin listen") {
		t.Fatalf("run with the port taken: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a tier was left behind: %v", err)
	}
}
