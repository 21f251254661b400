package main

import (
	"context"
	"errors"
	"log"
	"sort"
	"sync"
	"time"

	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

// prefixes keeps every prefix index of the tier open for the daemon: it
// reclaims reservations of dead clients (after the manager reaped them) and
// reports the indexes' counters.
type prefixes struct {
	c      *tier.Client
	logger *log.Logger
	mu     sync.Mutex
	open   map[string]*prefix.Store
	failed map[string]string // name → error last logged, so a bad index is reported once
}

const prefixTick = time.Second

// startPrefixes creates the configured index if it is missing, opens every
// index in the directory and reclaims in the background until ctx ends.
func startPrefixes(ctx context.Context, c *tier.Client, cfg config, logger *log.Logger, wg *sync.WaitGroup) (*prefixes, error) {
	px := &prefixes{c: c, logger: logger, open: map[string]*prefix.Store{}, failed: map[string]string{}}
	if cfg.PrefixBlocks > 0 {
		s, err := prefix.Maintain(c, cfg.PrefixName)
		if errors.Is(err, tier.ErrNotFound) {
			s, err = prefix.Create(c, prefix.Config{Name: cfg.PrefixName, Blocks: cfg.PrefixBlocks, BlockBytes: int64(cfg.PrefixBlockBytes)})
			if err == nil {
				logger.Printf("created prefix index %q: %d blocks of %s", cfg.PrefixName, cfg.PrefixBlocks, sizeText(int64(cfg.PrefixBlockBytes)))
			}
		}
		switch {
		case errors.Is(err, prefix.ErrBadIndex):
			// A damaged or foreign index must not keep the daemon (and
			// with it reaping and lock grants) down: report it and go on.
			logger.Printf("prefix index %q unusable, not served: %v (cxltier prefix destroy --name %s removes it)", cfg.PrefixName, err, cfg.PrefixName)
		case err != nil:
			return nil, err
		default:
			px.open[cfg.PrefixName] = s
		}
	}
	px.refresh()
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(prefixTick)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				px.refresh()
				px.reclaim()
			}
		}
	}()
	return px, nil
}

// refresh drops the handles of indexes destroyed (or destroyed and created
// again) since the last look, and opens indexes other processes created.
func (px *prefixes) refresh() {
	list, err := px.c.Region().DirList()
	if err != nil {
		px.logger.Printf("prefix: list directory: %v", err)
		return
	}
	px.mu.Lock()
	defer px.mu.Unlock()
	for name, s := range px.open {
		if err := s.Valid(); err != nil {
			px.logger.Printf("prefix %q: dropped the daemon's handle: %v", name, err)
			s.Close()
			delete(px.open, name)
		}
	}
	for _, e := range list {
		if e.Kind != prefix.DirKind || len(e.Name) <= len("prefix/") {
			continue
		}
		name := e.Name[len("prefix/"):]
		if _, ok := px.open[name]; ok {
			continue
		}
		s, err := prefix.Maintain(px.c, name)
		if err != nil {
			if px.failed[name] != err.Error() {
				px.failed[name] = err.Error()
				px.logger.Printf("prefix: open %q: %v", name, err)
			}
			continue
		}
		delete(px.failed, name)
		px.open[name] = s
	}
}

func (px *prefixes) reclaim() {
	px.mu.Lock()
	defer px.mu.Unlock()
	for name, s := range px.open {
		n, err := s.Reclaim()
		if err != nil {
			px.logger.Printf("prefix %q: reclaim: %v", name, err)
		} else if n > 0 {
			px.logger.Printf("prefix %q: reclaimed %d reservations of dead clients", name, n)
		}
	}
}

func (px *prefixes) stats() []prefix.Stats {
	out := []prefix.Stats{}
	if px == nil {
		return out
	}
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, s := range px.open {
		out = append(out, s.Stats())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (px *prefixes) close() {
	px.mu.Lock()
	defer px.mu.Unlock()
	for _, s := range px.open {
		s.Close()
	}
}
