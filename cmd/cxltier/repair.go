package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/cxltier/cxltier/internal/tierflags"
	"github.com/cxltier/cxltier/tier"
)

// cmdRepair fixes what is safe to fix on a tier no daemon serves: it reaps
// dead clients (their locks released, their chunks freed, as the daemon
// would) and releases locks held by no live client. Damage to the
// directory or the allocator is reported, not changed: guessing which of
// two disagreeing words is right could hand live memory to another owner.
func cmdRepair(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("repair", stderr, "[-dry-run] [-node N] PATH|SPEC...")
	dry := fs.Bool("dry-run", false, "report what would be repaired, change nothing")
	node := fs.Int("node", 0, "the node whose clients to reap (a daemon's -node)")
	slot := fs.Int("slot", -1, "reap this client slot now, whatever its heartbeat says: for a client you know is gone that this host cannot prove gone (a container's, its PID namespace not visible here)")
	if err := parse(fs, args); err != nil {
		return err
	}
	r, _, err := openArgs(fs, *dry)
	if err != nil {
		return err
	}
	defer r.Close()
	if *dry {
		if inf, ok := r.RunningDaemon(*node); ok {
			fmt.Fprintf(stdout, "note: a daemon serves node %d of this tier (slot %d, pid %d, %q): repair would refuse to run, and the daemon repairs as it goes.\n"+
				"  What follows is a view of a tier in use: a finding may be a change in flight, not damage.\n", *node, inf.Slot, inf.PID, inf.Name)
		}
		printRepairPlan(stdout, r.AuditFindings())
		return nil
	}
	// No client socket: no client would prove itself to a pass of a few
	// seconds, and a stalled one is left for a daemon to end.
	m, err := tier.NewManager(r, tier.ManagerOptions{Node: *node, NoClientSocket: true})
	if errors.Is(err, tier.ErrExists) {
		return fmt.Errorf("%w\n  (a running daemon repairs as it goes; POST /v1/reap to its admin API forces a pass, POST /v1/reap?slot=N reaps one client)", err)
	}
	if err != nil {
		return err
	}
	var reaped []tier.Reaped
	if *slot >= 0 {
		rp, err := m.Reap(*slot, "reaped by an operator (cxltier repair -slot)")
		if err != nil {
			m.Close()
			return err
		}
		reaped = append(reaped, rp)
	}
	// A lease is judged dead by its process (same node) at once, by a
	// heartbeat that stays still for a lease timeout otherwise: two passes.
	reaped = append(reaped, m.ReapOnce()...)
	time.Sleep(r.Info().Geometry.LeaseTimeout + 100*time.Millisecond)
	reaped = append(reaped, m.ReapOnce()...)
	m.Close()
	for _, rp := range reaped {
		fmt.Fprintf(stdout, "reaped slot %d (pid %d, %q): %s; %d locks released, %d chunks freed\n", rp.Slot, rp.PID, rp.Name, rp.Reason, rp.Locks, rp.Chunks)
	}
	left := r.Audit()
	fmt.Fprintf(stdout, "repaired: %d client(s) reaped; %d finding(s) left\n", len(reaped), len(left))
	for _, f := range left {
		fmt.Fprintf(stdout, "  %s\n", f)
	}
	if len(left) > 0 {
		return fmt.Errorf("%d finding(s) need a person: snapshot what can be read (cxltier prefix snapshot), then format anew", len(left))
	}
	return nil
}

// printRepairPlan sorts audit findings into what repair fixes and what it
// leaves alone.
func printRepairPlan(w io.Writer, findings []tier.Finding) {
	var fix, leave []string
	for _, f := range findings {
		if f.Kind.Repairable() {
			fix = append(fix, f.Msg)
		} else {
			leave = append(leave, f.Msg)
		}
	}
	list := func(head string, fs []string) {
		if len(fs) == 0 {
			fmt.Fprintf(w, "%s.\n", head) // no colon before nothing
			return
		}
		fmt.Fprintf(w, "%s:\n", head)
		for _, f := range fs {
			fmt.Fprintf(w, "  %s\n", f)
		}
	}
	list(fmt.Sprintf("repair would fix %d finding(s)", len(fix)), fix)
	list(fmt.Sprintf("and leave %d for a person", len(leave)), leave)
}

// cmdResize refuses, and says how: a region's layout (chunk count, the
// areas sized from it, every structure's offsets) is fixed when it is
// formatted, and moving live chunks under clients is not something to do
// in place.
func cmdResize(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("resize", stderr, "-size N PATH|SPEC...")
	size := fs.String("size", "", "the size wanted")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *size == "" {
		*size = "SIZE"
	} else if _, err := tierflags.ParseSize(*size); err != nil {
		return fmt.Errorf("-size: %w", err)
	}
	return fmt.Errorf(`a tier's size is fixed when it is formatted, so it cannot be resized in place (wanted -size %s). To move to a new size:
  1. cxltier prefix snapshot --name NAME --out NAME.zst DEVICE...   (each prefix index)
  2. stop the daemons and clients; cxltier destroy DEVICE...
  3. cxltier format -device DEVICE -size %s   (or start cxltierd with -size %s)
  4. cxltier engram load ... again; cxltier prefix restore --name NAME --in NAME.zst --blocks N --block-bytes SIZE DEVICE...`,
		*size, *size, *size)
}
