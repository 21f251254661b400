package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/cxltier/cxltier/tier"
)

// TestMain runs the command itself when a test re-executes this binary as
// the CLI (CXLTIER_CLI_MAIN=1), for what only a real process shows: how it
// dies.
func TestMain(m *testing.M) {
	if os.Getenv("CXLTIER_CLI_MAIN") == "1" {
		main()
	}
	if dev := os.Getenv("CXLTIER_TEST_HOLD_LEASE"); dev != "" {
		holdLease(dev)
	}
	os.Exit(m.Run())
}

// holdLease is a client that attaches to dev, says so, and waits to be killed.
func holdLease(dev string) {
	b, err := tier.ParseBacking("file:" + dev)
	if err != nil {
		panic(err)
	}
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		panic(err)
	}
	if _, err := r.Attach(tier.ClientOptions{Name: "server"}); err != nil {
		panic(err)
	}
	os.Stdout.WriteString("attached\n")
	select {}
}

// TestFormatForceCountsOnlyRunningClients: a client killed a moment ago
// (its heartbeat still fresh, its process gone) does not keep format -force
// from replacing the tier; one that runs does.
func TestFormatForceCountsOnlyRunningClients(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "tier")
	formatTier(t, dev)
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "CXLTIER_TEST_HOLD_LEASE="+dev)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	if _, err := out.Read(make([]byte, 16)); err != nil {
		t.Fatal(err)
	}
	format := func() (int, string) {
		code, _, errs := runCLI(t, "format", "-device", "file:"+dev, "-size", "16MiB", "-chunk", "256KiB", "-force")
		return code, errs
	}
	if code, errs := format(); code == 0 || !strings.Contains(errs, "live client") {
		t.Fatalf("format -force with a running client: exit %d, %q", code, errs)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if code, errs := format(); code != 0 {
		t.Fatalf("format -force after its only client was killed: exit %d, %q", code, errs)
	}
}

// TestClosedPipeLeavesNoLease: `cxltier prefix stats ... | head -0` must
// not kill the tool between its attach and its close (a write to a pipe
// whose reader is gone raises SIGPIPE, which kills a Go program writing to
// stdout), leaving a live lease behind for the reaper.
func TestClosedPipeLeavesNoLease(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "tier")
	formatTier(t, dev)
	if code, _, errs := runCLI(t, "prefix", "create", "--name", "m", "--blocks", "8", "--block-bytes", "4KiB", "file:"+dev); code != 0 {
		t.Fatal(errs)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close() // the reader is gone before the tool writes
	cmd := exec.Command(os.Args[0], "prefix", "stats", "--name", "m", "file:"+dev)
	cmd.Env = append(os.Environ(), "CXLTIER_CLI_MAIN=1")
	cmd.Stdout = w
	cmd.Run()
	w.Close()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signaled() {
		t.Fatalf("the tool was killed by %v", ws.Signal())
	}
	reg := openFileTier(t, dev)
	defer reg.Close()
	for _, l := range reg.Leases() {
		if l.State == "live" {
			t.Fatalf("a lease stayed live after the tool exited: %+v", l)
		}
	}
}
