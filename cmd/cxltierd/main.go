// Command cxltierd owns a host's view of the cxltier shared memory tier: it
// creates or attaches the tier, runs the lock manager (on the manager node)
// and the lease reaper, and serves the admin API.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/cxltier/cxltier/tier"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "cxltierd: %v\n", err)
		os.Exit(1)
	}
}

// run starts the daemon and serves until ctx ends.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	logger := log.New(stderr, "cxltierd: ", log.LstdFlags|log.Lmsgprefix)
	cfg, err := loadConfig(args, stderr)
	if err != nil {
		return err
	}
	token, err := loadToken(cfg.TokenFile)
	if err != nil {
		return err
	}
	opts, err := cfg.Options()
	if err != nil {
		return err
	}
	nodes, existing, err := cfg.check(opts)
	if err != nil {
		return err
	}
	if cfg.checkOnly {
		state := "to be formatted"
		if existing {
			state = "exists"
		}
		fmt.Fprintf(stderr, "cxltierd: configuration ok: devices %v (%s, %d node(s)), node %d, admin API on %s\n",
			opts.Devices, state, nodes, cfg.Node, cfg.Listen)
		return nil
	}
	// The port first: a daemon that cannot serve must not leave a freshly
	// formatted tier behind.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("admin listen: %w (another cxltierd? choose a port with -listen)", err)
	}
	defer ln.Close()
	if host, _, _ := net.SplitHostPort(cfg.Listen); !isLoopback(host) {
		logger.Printf("warning: the admin API listens on %s, beyond this host; keep -listen on loopback unless a firewall guards it", cfg.Listen)
	}
	r, created, err := openOrFormat(opts)
	if err != nil {
		return err
	}
	defer r.Close()
	inf := r.Info()
	verb := "attached"
	if created {
		verb = "formatted"
	}
	logger.Printf("%s tier %v: %d device(s), %s data in %d chunks, %s coherence, flush=%s",
		verb, inf.Devices, len(inf.Devices), sizeText(inf.Size-inf.ControlSize), inf.ChunkCount, inf.Coherence, tier.FlushInstruction())
	if want := opts.Geometry.DeviceSize; !created && cfg.sizeGiven && want > 0 && want != inf.Geometry.DeviceSize {
		logger.Printf("note: the tier exists with %s per device; -size %s applies only when formatting (to resize: stop the daemons, cxltier format -force ... -size %s)",
			sizeText(inf.Geometry.DeviceSize), sizeText(want), sizeText(want))
	}

	m, err := tier.NewManager(r, tier.ManagerOptions{
		Node:         cfg.Node,
		GrantLocks:   cfg.Node == cfg.ManagerNode,
		SkipPIDCheck: cfg.SkipPIDCheck,
		Logf:         logger.Printf,
	})
	if err != nil {
		return err
	}
	if p := m.SocketPath(); p != "" {
		logger.Printf("clients prove who they are at %s (share its directory with client containers)", p)
	}
	mctx, stopManager := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	managerErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := m.Run(mctx); err != nil {
			logger.Printf("manager: %v", err)
			managerErr <- err
		}
	}()
	defer func() { stopManager(); wg.Wait() }()

	px, err := startPrefixes(mctx, m.Client(), cfg, logger, &wg)
	if err != nil {
		return err
	}
	defer px.close()

	a := newAdmin(r, m, px, cfg, token, logger)
	srv := a.server()
	gate := newConnGate(ln, adminConnsPeer, adminConnsTotal, adminConnsFresh)
	srv.ConnState = gate.state
	srv.Handler = gate.wrap(srv.Handler)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(gate) }()
	logger.Printf("node %d (lock manager: %v); admin API on http://%s", cfg.Node, cfg.Node == cfg.ManagerNode, ln.Addr())

	var stopErr error
	select {
	case <-ctx.Done():
		logger.Printf("shutting down")
	case err := <-serveErr:
		return fmt.Errorf("admin server: %w", err)
	case stopErr = <-managerErr:
		// Not the node's daemon any more: stop serving, and leave the
		// tier to the daemon that is.
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.ShutdownWithContext(sctx); err != nil {
		logger.Printf("admin shutdown: %v", err)
	}
	stopManager()
	wg.Wait()
	if stopErr != nil {
		return stopErr
	}
	logger.Printf("stopped; the tier's content stays in %v", inf.Devices)
	return nil
}

// openOrFormat attaches the tier, or creates it if none of its devices exist.
func openOrFormat(opts tier.Options) (*tier.Region, bool, error) {
	r, err := tier.Open(opts)
	if err == nil {
		return r, false, nil
	}
	if !errors.Is(err, tier.ErrNoBacking) {
		return nil, false, err
	}
	for _, d := range opts.Devices {
		if d.Kind == tier.BackingDax {
			return nil, false, err // a missing dax device is not ours to create
		}
		if _, statErr := os.Stat(d.Path); d.Kind != tier.BackingAnon && statErr == nil {
			return nil, false, fmt.Errorf("%w (and %s exists: refusing to format a partial tier)", err, d)
		}
	}
	r, err = tier.Format(opts)
	return r, err == nil, err
}

// isLoopback reports whether host (of -listen) only reaches this host.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func sizeText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%d B", n)
}
