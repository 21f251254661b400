package topk

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// A test re-executes this binary as a pool's process; the environment
// tells the child its role and tier.
const (
	envRole    = "CXLTIER_TOPK_ROLE"
	envDevices = "CXLTIER_TOPK_DEVICES"
)

func TestMain(m *testing.M) {
	if os.Getenv(envRole) == "appender" {
		err := runAppender(os.Getenv(envDevices))
		fmt.Fprintf(os.Stderr, "topk appender %d: %v\n", os.Getpid(), err)
		os.Exit(3)
	}
	os.Exit(m.Run())
}

// runAppender fills a pool's sequence with 0xEE entries, round after
// round, after saying it is ready: a top-k pool's process writing its
// extents outside any lock.
func runAppender(devices string) error {
	c, err := tiertest.Attach(devices, "appender")
	if err != nil {
		return err
	}
	eng := kernels.NewCPU(1)
	p, err := New(c, eng, nil, Config{Layers: 1, EntryBytes: 64, Slots: 16, TopK: 4, MaxRequests: 1})
	if err != nil {
		return err
	}
	entries := bytes.Repeat([]byte{0xEE}, 64*1024)
	for round := 0; ; round++ {
		if err := p.Register(0, Sequence{Layers: 1, EntryBytes: 64, Capacity: 8192}); err != nil {
			return err
		}
		for range 8 {
			if err := p.Append(0, 0, entries); err != nil {
				return err
			}
		}
		if round == 0 {
			fmt.Println("ready")
		}
		if err := p.Free(0); err != nil {
			return err
		}
	}
}

// TestStoppedPoolIsEndedBeforeItsExtentsMove: a top-k pool's process
// stopped (SIGSTOP) past its lease is killed and waited for by the reaper
// before its extents are freed; memory then given to another client keeps
// what that client wrote after the stopped process is told to go on. The
// reaper used to free the extents of the live process, whose appends on
// resuming landed in the new owner's memory (a prefix index's entries).
func TestStoppedPoolIsEndedBeforeItsExtentsMove(t *testing.T) {
	r, c := testTier(t, 1)
	m, err := tier.NewManager(r, tier.ManagerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=appender", envDevices+"="+strings.Join(r.Info().Devices, ","))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("appender said %q, %v", line, err)
	}
	tiertest.WaitProven(t, m, cmd.Process.Pid)
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Signal(syscall.SIGCONT)
	gone := func() bool {
		for _, l := range r.Leases() {
			if l.PID == cmd.Process.Pid && l.State == "live" {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(30 * time.Second); !gone(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the stopped pool's process was not reaped")
		}
		m.ReapOnce()
	}
	// Everything free goes to this client now, the freed extents with it.
	chunk := r.ChunkSize()
	mine := bytes.Repeat([]byte{0x11}, int(chunk))
	var owned []tier.Offset
	for {
		off, err := c.AllocChunks(1)
		if errors.Is(err, tier.ErrExhausted) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := r.WriteAt(mine, off); err != nil {
			t.Fatal(err)
		}
		owned = append(owned, off)
	}
	cmd.Process.Signal(syscall.SIGCONT)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var waitErr error
	select {
	case waitErr = <-exited:
	case <-time.After(5 * time.Second):
		waitErr = errors.New("still running 5 s after SIGCONT")
	}
	time.Sleep(100 * time.Millisecond)
	now := make([]byte, chunk)
	for _, off := range owned {
		if err := r.ReadAt(now, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(now, mine) {
			t.Fatalf("the reaped pool wrote into chunk %v of the new owner", off)
		}
	}
	if waitErr == nil || !strings.Contains(waitErr.Error(), "killed") {
		t.Fatalf("the stopped pool's process: %v, want killed", waitErr)
	}
	for _, off := range owned {
		c.FreeChunks(off, 1)
	}
}
