package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cxltier/cxltier/cmd/internal/adminapi"
	"github.com/cxltier/cxltier/internal/tierflags"
	"github.com/cxltier/cxltier/tier"
	"golang.org/x/sys/unix"
)

// cmdTop shows the daemon's view live: tier use, clients, prefix indexes
// with hit rate and lookups per second, the top-k pools' steps per second.
func cmdTop(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("top", stderr, "[-addr HOST:PORT] [-interval 1s] [-n COUNT]")
	addr := fs.String("addr", adminapi.DefaultAddr, "cxltierd admin address")
	every := fs.Duration("interval", time.Second, "refresh period")
	count := fs.Int("n", 0, "refreshes before exiting (0: until interrupted)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *every < 100*time.Millisecond {
		return fmt.Errorf("-interval %v: at least 100ms", *every)
	}
	var prev *adminapi.Status
	var prevAt time.Time
	for i := 0; *count == 0 || i < *count; i++ {
		if i > 0 {
			time.Sleep(*every)
		}
		st, _, err := adminapi.FetchStatus(*addr, 5*time.Second)
		if err != nil {
			return err
		}
		now := time.Now()
		switch {
		case *count != 1 && isTerminal(stdout):
			fmt.Fprint(stdout, "\033[H\033[2J") // home, clear: a terminal view
		case i > 0:
			fmt.Fprintln(stdout) // a pipe or file gets plain screens, one after another
		}
		printTop(stdout, &st, prev, now.Sub(prevAt))
		prev, prevAt = &st, now
	}
	return nil
}

// isTerminal reports whether w is a terminal (a tty answers TCGETS), so
// that `cxltier top | tee log` gets plain lines, not clear-screen codes.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// printTop renders one screen; rates need the previous status (nil: none).
func printTop(w io.Writer, st, prev *adminapi.Status, dt time.Duration) {
	hs := tierflags.HumanSize
	rate := func(now, before int64) string {
		if prev == nil || dt <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.0f/s", float64(now-before)/dt.Seconds())
	}
	live := 0
	for _, c := range st.Clients {
		if c.State == "live" {
			live++
		}
	}
	fmt.Fprintf(w, "cxltier top — node %d, up %s, %s\n", st.Node, st.Uptime, time.Now().Format(time.TimeOnly))
	fmt.Fprintf(w, "tier: %s used of %s (%d of %d chunks), %d clients live, %d locks held, %d reaped\n",
		hs(st.Used), hs(st.Size-st.ControlSize), st.Chunks.Used, st.Chunks.Total, live, len(st.Locks), st.ReapedTotal)
	fmt.Fprintln(w, "\nprefix index        ready/blocks  hit rate  lookups     inserts     evictions")
	for _, p := range st.Prefix {
		var before [3]int64
		if prev != nil {
			for _, q := range prev.Prefix {
				if q.Name == p.Name {
					before = [3]int64{int64(q.Hits + q.Misses), int64(q.Inserts), int64(q.Evictions)}
				}
			}
		}
		fmt.Fprintf(w, "%-18s %6d/%-6d %8.1f%%  %-10s  %-10s  %s\n", p.Name, p.Ready, p.Blocks, 100*p.HitRate(),
			rate(int64(p.Hits+p.Misses), before[0]), rate(int64(p.Inserts), before[1]), rate(int64(p.Evictions), before[2]))
	}
	t := st.Topk
	var steps int64
	if prev != nil {
		steps = prev.Topk.Steps
	}
	fmt.Fprintf(w, "\ntop-k: %d sequences, %s steps, hit rate %.1f%%, %s fetched\n",
		t.Sequences, rate(t.Steps, steps), 100*t.HitRate(), hs(t.BytesFetched))
}

// cmdDestroy removes a tier: its backing files, or for a DAX device its
// header (the device stays). A tier with live clients is refused unless
// forced: they would go on writing memory nobody owns.
func cmdDestroy(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("destroy", stderr, "[-force] PATH|SPEC...")
	force := fs.Bool("force", false, "destroy even with live clients attached")
	if err := parse(fs, args); err != nil {
		return err
	}
	r, devs, err := openArgs(fs, true)
	var sockets []string
	switch {
	case err == nil:
		live := liveClients(r)
		sockets = r.SocketFiles()
		r.Close()
		if len(live) > 0 && !*force {
			return fmt.Errorf("%d live client(s) attached (%s): stop them (and cxltierd) first, or -force", len(live), strings.Join(live, ", "))
		}
	case errors.Is(err, tier.ErrBadMagic):
		return fmt.Errorf("%w\n  (not removed: it may not be a tier at all; if it was one, cxltier format -force reuses it, or remove it yourself)", err)
	case damagedHeader(err) && *force:
		fmt.Fprintf(stderr, "destroy: the header is damaged (%v): removing the tier without reading it, so its clients cannot be checked\n", err)
	case damagedHeader(err):
		return fmt.Errorf("%w\n  (the header is damaged, so nothing in the tier can be read: stop its clients and cxltierd, then cxltier destroy -force removes it without reading it)", err)
	default:
		return err
	}
	for _, d := range devs {
		switch d.Kind {
		case tier.BackingDax:
			f, err := os.OpenFile(d.Path, os.O_WRONLY, 0)
			if err != nil {
				return err
			}
			_, err = f.WriteAt(make([]byte, 4096), 0) // the header: the device no longer holds a tier
			f.Close()
			if err != nil {
				return fmt.Errorf("clear %s: %w", d, err)
			}
		case tier.BackingAnon:
		default:
			if err := os.Remove(d.Path); err != nil {
				return err
			}
		}
		fmt.Fprintf(stdout, "destroyed %s\n", d)
	}
	// The sockets a daemon or uplink killed without closing left beside it.
	for _, p := range sockets {
		if err := os.Remove(p); err == nil {
			fmt.Fprintf(stdout, "removed %s\n", p)
		}
	}
	return nil
}

// damagedHeader reports an error of a tier whose magic is there but whose
// header or areas are damaged.
func damagedHeader(err error) bool {
	for _, e := range []error{tier.ErrChecksum, tier.ErrVersion, tier.ErrCorrupt, tier.ErrTruncated, tier.ErrSizeMismatch, tier.ErrDeviceOrder} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// liveClients names the clients of r whose lease still beats and, on a
// tier of one host, whose process is still there (a client killed a moment
// ago leaves a fresh heartbeat behind; it is no user of the tier).
func liveClients(r *tier.Region) []string {
	var live []string
	for _, c := range r.Leases() {
		if c.State == "live" && !c.Gone && time.Since(c.LastBeat) < r.Info().Geometry.LeaseTimeout {
			live = append(live, clientLabel(c, "/proc"))
		}
	}
	return live
}

// clientLabel names a live client so that an operator recognises it: its
// slot, pid and lease name (8 bytes, so "cxltier-" for most), and what the
// process with that pid runs now, from procfs, where the lease was taken
// in this PID namespace. That last part is only shown, never acted on.
func clientLabel(c tier.LeaseInfo, procfs string) string {
	label := fmt.Sprintf("slot %d pid %d %q", c.Slot, c.PID, c.Name)
	if c.ElsewhereNS {
		return label + " (in another PID namespace)"
	}
	raw, err := os.ReadFile(filepath.Join(procfs, strconv.Itoa(c.PID), "cmdline"))
	if err != nil || len(raw) == 0 {
		return label
	}
	cmd := strings.Join(strings.Fields(strings.ReplaceAll(string(raw), "\x00", " ")), " ")
	if len(cmd) > 80 {
		cmd = cmd[:77] + "..."
	}
	return fmt.Sprintf("%s, running %q", label, cmd)
}
