package main

import (
	"bufio"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// daemon is one cxltierd process the soak runs. Its log is kept (the last
// lines) rather than printed: a reap line per killed worker would bury the
// soak's table, and the lines matter only when something fails.
type daemon struct {
	cmd   *exec.Cmd
	done  chan struct{} // closed once it exited
	mu    sync.Mutex
	tail  []string
	panic []string // a panic's first lines: its goroutine dump pushes them out of tail
}

const daemonTailLines = 30

var addrRE = regexp.MustCompile(`admin API on http://(\S+)`)

// startDaemon starts cxltierd on the tier (creating it the first time) and
// waits until it serves.
func (s *soak) startDaemon() error {
	cmd := exec.Command(s.o.daemon, "-device", s.device, "-size", s.o.size, "-chunk", "256KiB",
		"-listen", "127.0.0.1:0", "-lease-timeout", leaseTimeout.String(), "-prefix-blocks", "0")
	errs, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.o.daemon, err)
	}
	d := &daemon{cmd: cmd, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(errs)
		serving := false
		for sc.Scan() {
			d.keep(sc.Text())
			if !serving && addrRE.MatchString(sc.Text()) {
				serving = true
				close(ready)
			}
		}
		cmd.Wait()
		close(d.done)
	}()
	select {
	case <-ready:
	case <-d.done:
		return fmt.Errorf("cxltierd exited before serving (%v); its last lines:\n%s", cmd.ProcessState, d.lastLines())
	case <-time.After(10 * time.Second):
		d.kill()
		return fmt.Errorf("cxltierd did not start in 10 s; its last lines:\n%s", d.lastLines())
	}
	s.daemon = d
	return nil
}

func (d *daemon) keep(line string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.panic == nil && (strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: ")) {
		d.panic = []string{line}
	} else if len(d.panic) > 0 && len(d.panic) < 8 {
		d.panic = append(d.panic, line)
	}
	d.tail = append(d.tail, line)
	if len(d.tail) > daemonTailLines {
		d.tail = d.tail[len(d.tail)-daemonTailLines:]
	}
}

func (d *daemon) lastLines() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	lines := d.tail
	if d.panic != nil {
		lines = append(append(slices.Clone(d.panic), "..."), lines...)
	}
	return "  cxltierd: " + strings.Join(lines, "\n  cxltierd: ")
}

// exited reports, once the daemon has gone without being told to, how.
func (d *daemon) exited() error {
	select {
	case <-d.done:
		return fmt.Errorf("cxltierd (pid %d) exited on its own (%v); its last lines:\n%s", d.cmd.Process.Pid, d.cmd.ProcessState, d.lastLines())
	default:
		return nil
	}
}

func (d *daemon) kill() {
	d.cmd.Process.Kill()
	<-d.done
}

func (s *soak) stopDaemon() {
	if s.daemon != nil {
		s.daemon.cmd.Process.Signal(syscall.SIGTERM)
		<-s.daemon.done
		s.daemon = nil
	}
}
