package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cxltier/cxltier/cmd/internal/adminapi"
	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/internal/tierflags"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/topk"
)

func cmdStatus(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("status", stderr, "[-addr HOST:PORT] [-json]")
	addr := fs.String("addr", adminapi.DefaultAddr, "cxltierd admin address")
	asJSON := fs.Bool("json", false, "print the daemon's JSON as is")
	if err := parse(fs, args); err != nil {
		return err
	}
	st, raw, err := adminapi.FetchStatus(*addr, 5*time.Second)
	if err != nil {
		return err
	}
	if *asJSON {
		_, err := stdout.Write(raw)
		return err
	}
	fmt.Fprintf(stdout, "daemon: node %d, lock manager %v, up %s, flush %s\n", st.Node, st.LockManager, st.Uptime, st.Flush)
	printSnapshot(stdout, st.Snapshot)
	if st.ClientSocket != "" {
		fmt.Fprintf(stdout, "client socket: %s (%d client(s) proved who they are)\n", st.ClientSocket, len(st.Proven))
	} else {
		fmt.Fprintf(stdout, "client socket: none (no client can prove who it is; the daemon ends none)\n")
	}
	switch {
	case st.Uplink.Listening:
		fmt.Fprintf(stdout, "uplink: listening at %s\n", st.Uplink.Socket)
	case st.Uplink.Socket != "":
		fmt.Fprintf(stdout, "uplink: none answers at %s (cluster pages are local misses; no uplink runs, or its directory is not shared)\n", st.Uplink.Socket)
	default:
		fmt.Fprintf(stdout, "uplink: %s\n", st.Uplink.Error)
	}
	fmt.Fprintf(stdout, "reaped clients: %d in total\n", st.ReapedTotal)
	for _, rp := range st.Reaped {
		fmt.Fprintf(stdout, "  %s  slot %d pid %d node %d %q: %s (%d locks released, %d chunks freed)\n",
			rp.At.Format(time.RFC3339), rp.Slot, rp.PID, rp.Node, rp.Name, rp.Reason, rp.Locks, rp.Chunks)
	}
	return nil
}

// cmdHealth is a liveness probe: the daemon answers /healthz (its tier's
// headers and areas still check) or the command fails.
func cmdHealth(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("health", stderr, "[-addr HOST:PORT]")
	addr := fs.String("addr", adminapi.DefaultAddr, "cxltierd admin address")
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := adminapi.FetchHealth(*addr, 5*time.Second); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "ok")
	return nil
}

func cmdInspect(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("inspect", stderr, "[-json] [-deep] PATH|SPEC...  (devices in tier order; a bare path means file:PATH)")
	asJSON := fs.Bool("json", false, "print JSON")
	deep := fs.Bool("deep", false, "also cross-check the structures (directory, allocator, locks, leases) and exit 1 on a finding")
	if err := parse(fs, args); err != nil {
		return err
	}
	r, _, err := openArgs(fs, true)
	if err != nil {
		return err
	}
	defer r.Close()
	snap := r.Snapshot()
	var findings []string
	if *deep {
		findings = r.Audit()
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if !*deep {
			return enc.Encode(snap)
		}
		if findings == nil {
			findings = []string{}
		}
		if err := enc.Encode(struct {
			tier.Snapshot
			Findings []string `json:"findings"`
		}{snap, findings}); err != nil {
			return err
		}
	} else {
		printSnapshot(stdout, snap)
		if *deep {
			fmt.Fprintf(stdout, "deep check: %d finding(s)\n", len(findings))
			for _, f := range findings {
				fmt.Fprintf(stdout, "  %s\n", f)
			}
		}
	}
	if len(findings) > 0 {
		return fmt.Errorf("inspect: %d finding(s) (prefix indexes: cxltier prefix check)", len(findings))
	}
	return nil
}

func cmdFormat(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("format", stderr, "[-device SPEC]... [-size N] [flags]")
	cfg := tierflags.Default()
	cfg.Register(fs)
	force := fs.Bool("force", false, "replace existing backing files (destroys their content)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	opts, err := cfg.Options()
	if err != nil {
		return err
	}
	opts.Overwrite = *force
	if *force {
		// Formatting under a live daemon or client pulls the memory from
		// under it (SIGBUS, or silently wrong data). A tier that does not
		// open (damaged, or not a tier) has no clients to protect.
		if old, err := tier.Open(tier.Options{Devices: opts.Devices, ReadOnly: true}); err == nil {
			live := liveClients(old)
			old.Close()
			if len(live) > 0 {
				return fmt.Errorf("the tier on %v has %d live client(s) (%s): stop them (and cxltierd) first; -force replaces only a tier nothing uses",
					opts.Devices, len(live), strings.Join(live, ", "))
			}
		}
	}
	start := time.Now()
	fmt.Fprintf(stderr, "formatting %d device(s) of %s...\n", len(opts.Devices), tierflags.HumanSize(opts.Geometry.DeviceSize))
	r, err := tier.Format(opts)
	if errors.Is(err, tier.ErrExists) {
		return fmt.Errorf("a tier (or another file) is there already: %w\n  (format -force replaces it, refused while clients are attached; cxltier destroy removes it)", err)
	}
	if err != nil {
		return err
	}
	defer r.Close()
	inf := r.Info()
	fmt.Fprintf(stdout, "formatted %v in %v: %d chunks of %s, %s of data\n", inf.Devices,
		time.Since(start).Round(time.Millisecond), inf.ChunkCount, tierflags.HumanSize(inf.Geometry.ChunkSize),
		tierflags.HumanSize(inf.Size-inf.ControlSize))
	return nil
}

func printSnapshot(w io.Writer, s tier.Snapshot) {
	fs := tierflags.HumanSize
	fmt.Fprintf(w, "tier %s (format v%d), created %s\n", s.UUID, s.FormatVersion, s.Created.Format(time.RFC3339))
	fmt.Fprintf(w, "devices: %s, %s each, stripe %s; %d node(s); coherence %s (formatted for %s); lease timeout %s\n",
		strings.Join(s.Devices, ", "), fs(s.DeviceSize), fs(s.Stripe), s.Nodes, s.Coherence, s.FormattedAs, s.LeaseTimeout)
	fmt.Fprintf(w, "size %s: control area %s, data %d chunks × %s\n", fs(s.Size), fs(s.ControlSize), s.Chunks.Total, fs(s.Chunks.Size))
	pct := 0.0
	if s.Chunks.Total > 0 {
		pct = 100 * float64(s.Chunks.Used) / float64(s.Chunks.Total)
	}
	fmt.Fprintf(w, "used %d chunks (%.1f%%, %d shared), free %d chunks (%s)\n", s.Chunks.Used, pct, s.Chunks.Shared, s.Chunks.Free, fs(s.Free))
	fmt.Fprintf(w, "clients: %d (capacity %d per node)\n", len(s.Clients), s.Geometry.ClientsPerNode)
	for _, c := range s.Clients {
		role := ""
		if c.Daemon {
			role = " [daemon]"
		}
		if c.ElsewhereNS {
			role += " (pid in its own PID namespace: a container)"
		}
		if c.Gone {
			role += " — its process is gone: dead, not yet reaped (cxltier repair, or the daemon, reaps it)"
		}
		fmt.Fprintf(w, "  slot %-4d %-5s pid %-8d node %d %q%s, %d heartbeats, last %s\n",
			c.Slot, c.State, c.PID, c.Node, c.Name, role, c.Beat, c.LastBeat.Format(time.RFC3339))
	}
	fmt.Fprintf(w, "locks held or requested: %d\n", len(s.Locks))
	for _, l := range s.Locks {
		orphan := ""
		if l.Orphan {
			orphan = " — ORPHANED: the holder is no live client (the next waiter or the daemon's reaper releases it)"
		}
		fmt.Fprintf(w, "  lock %d: holder slot %d, granted to node %d, nodes %s%s\n", l.ID, l.Holder, l.Node, l.Nodes, orphan)
	}
	fmt.Fprintf(w, "directory: %d of %d entries\n", len(s.Directory), s.Geometry.DirEntries)
	for _, e := range s.Directory {
		fmt.Fprintf(w, "  %-24q %-16s at %v, %s\n", e.Name, kindName(e.Kind), e.Offset, fs(e.Size))
	}
	for _, t := range s.Torn {
		fmt.Fprintf(w, "warning: %s\n", t)
	}
}

// openArgs opens the tier whose devices are fs's arguments.
func openArgs(fs *flag.FlagSet, readOnly bool) (*tier.Region, []tier.Backing, error) {
	if fs.NArg() == 0 {
		noDevice(fs)
		return nil, nil, errUsage
	}
	return openDevices(fs.Args(), readOnly)
}

// openDevices opens the tier on device arguments (see deviceArgs).
func openDevices(args []string, readOnly bool) (*tier.Region, []tier.Backing, error) {
	devs, err := deviceArgs(args)
	if err != nil {
		return nil, nil, err
	}
	r, err := tier.Open(tier.Options{Devices: devs, ReadOnly: readOnly})
	if err != nil && len(devs) > 1 {
		if whole := wholeTiers(devs); len(whole) > 0 {
			what := " is a whole tier of its own"
			if len(whole) > 1 {
				what = " are each a whole tier of their own"
			}
			return nil, devs, fmt.Errorf("%w: %s%s, not a device of one tier striped over the %d given: name one tier per command",
				errArgs, strings.Join(whole, " and "), what, len(devs))
		}
	}
	return r, devs, err
}

// wholeTiers names the devices among devs that are each a whole tier of
// one device: several separate tiers given as the devices of one, which a
// command must refuse rather than act on (destroy -force removed them all,
// as the parts of one damaged tier).
func wholeTiers(devs []tier.Backing) []string {
	var whole []string
	for _, d := range devs {
		if r, err := tier.Open(tier.Options{Devices: []tier.Backing{d}, ReadOnly: true}); err == nil {
			r.Close()
			whole = append(whole, d.String())
		}
	}
	return whole
}

// kindName names a directory kind: the packages' own kinds by what they
// hold, others by their four characters when printable, else the number.
func kindName(k uint32) string {
	switch k {
	case prefix.DirKind:
		return "prefix index"
	case engram.DirKind:
		return "engram table"
	case topk.StatsKind:
		return "top-k stats"
	case tier.ObjectKind:
		return "named object"
	}
	if tag := (tier.DirEntry{Kind: k}).KindTag(); tag != "" {
		return fmt.Sprintf("kind %q", tag)
	}
	return fmt.Sprintf("kind %d", k)
}

// deviceArgs parses a command's device arguments, in tier order; a bare
// path means file:PATH.
func deviceArgs(args []string) ([]tier.Backing, error) {
	var devs []tier.Backing
	for _, a := range args {
		if !strings.Contains(a, ":") {
			a = "file:" + a
		}
		b, err := tier.ParseBacking(a)
		if err != nil {
			return nil, err
		}
		devs = append(devs, b)
	}
	return devs, nil
}

// noDevice says what is missing before the usage: a newcomer who typed
// the command alone should not have to find DEVICE in the synopsis.
func noDevice(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), "%s: no DEVICE: name the tier's devices in tier order (cxltierd's default tier is shm:cxltier)\n\n", fs.Name())
	fs.Usage()
}
