package main

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/topk"
)

// loop kills and restarts on schedule and reports every -report until
// -duration is up or a check fails.
func (s *soak) loop(c *tier.Client, out io.Writer) error {
	start := time.Now()
	end := start.Add(s.o.duration)
	nextReport, nextKill, nextRestart := start.Add(s.o.report), start.Add(s.o.killEvery), start.Add(s.o.restartEvery)
	nextDamage := start.Add(s.o.damageEvery)
	last, lastAt := map[string]int64{}, start
	fmt.Fprintf(out, "%8s  %12s  %12s  %12s  %5s  %8s  %s\n", "elapsed", "prefix ops/s", "topk steps/s", "engram rows/s", "kills", "restarts", "checks")
	for time.Now().Before(end) {
		time.Sleep(50 * time.Millisecond)
		if err := s.daemon.exited(); err != nil {
			return err
		}
		now := time.Now()
		if s.o.killEvery > 0 && now.After(nextKill) {
			if err := s.killOne(); err != nil {
				return err
			}
			nextKill = now.Add(s.o.killEvery)
		}
		if s.o.damageEvery > 0 && now.After(nextDamage) {
			s.damage(c)
			nextDamage = now.Add(s.o.damageEvery)
		}
		if s.o.restartEvery > 0 && now.After(nextRestart) {
			if err := s.restartDaemon(); err != nil {
				return err
			}
			nextRestart = now.Add(s.o.restartEvery)
		}
		if now.After(nextReport) || !now.Before(end) {
			tot, fail := s.totals()
			problems := s.check(c)
			if fail != "" {
				problems = append(problems, fail)
			}
			secs := now.Sub(lastAt).Seconds()
			rate := func(role string) float64 { return float64(tot[role]-last[role]) / secs }
			verdict := "ok"
			if len(problems) > 0 {
				verdict = "FAILED: " + strings.Join(problems, "; ")
			}
			s.mu.Lock()
			kills, restarts := s.kills, s.restarts
			s.mu.Unlock()
			fmt.Fprintf(out, "%8s  %12.0f  %12.0f  %12.0f  %5d  %8d  %s\n", now.Sub(start).Round(time.Second),
				rate("prefix"), rate("topk"), rate("engram"), kills, restarts, verdict)
			if len(problems) > 0 {
				return fmt.Errorf("checks failed after %v", now.Sub(start).Round(time.Second))
			}
			last, lastAt, nextReport = tot, now, now.Add(s.o.report)
		}
	}
	return nil
}

func (s *soak) restartDaemon() error {
	s.daemon.kill()
	s.daemon = nil
	s.mu.Lock()
	s.restarts++
	s.mu.Unlock()
	return s.startDaemon()
}

// damage flips one random byte of the prefix index: its metadata (header,
// entries, owners, pins) or, as often, its payloads.
func (s *soak) damage(c *tier.Client) {
	px, err := prefix.Maintain(c, prefixIndex)
	if err != nil {
		return
	}
	meta, metaBytes, payload, payloadBytes := px.Extent()
	px.Close()
	off := meta + tier.Offset(s.rng.Int64N(metaBytes))
	if s.rng.IntN(2) == 0 {
		off = payload + tier.Offset(s.rng.Int64N(payloadBytes))
	}
	var b [1]byte
	r := c.Region()
	if r.ReadAt(b[:], off) == nil {
		b[0] ^= byte(1 + s.rng.IntN(255))
		r.WriteAt(b[:], off)
		s.mu.Lock()
		s.damages++
		s.mu.Unlock()
	}
}

// check runs the invariant checks that hold at any moment (under damage:
// only what damage must not break — dead clients reaped, the tier clean).
func (s *soak) check(c *tier.Client) []string {
	var problems []string
	r := c.Region()
	snap := r.Snapshot()
	problems = append(problems, snap.Torn...)
	// Dead clients are reaped within the lease timeout once the daemon
	// runs; allow a restart's worth of slack.
	for _, cl := range snap.Clients {
		if (cl.State != "live" || cl.Gone) && time.Since(cl.LastBeat) > 5*leaseTimeout+5*time.Second {
			problems = append(problems, fmt.Sprintf("client slot %d (%s, pid %d) %s, gone %v, not reaped since %v", cl.Slot, cl.Name, cl.PID, cl.State, cl.Gone, cl.LastBeat))
		}
	}
	if s.o.damageEvery > 0 {
		return problems
	}
	px, err := prefix.Maintain(c, prefixIndex)
	if err != nil {
		return append(problems, err.Error())
	}
	defer px.Close()
	bad, err := px.Check(true)
	if err != nil {
		bad = append(bad, err.Error())
	}
	if st := px.Stats(); st.ChecksumFailures > 0 {
		bad = append(bad, fmt.Sprintf("%d checksum failures", st.ChecksumFailures))
	}
	for _, b := range bad {
		problems = append(problems, "prefix: "+b)
	}
	if _, err := topk.ReadStats(r); err != nil {
		problems = append(problems, err.Error())
	}
	return problems
}

// finalCheck, with every worker gone and their leases reaped: the checks,
// and every chunk either shared or free.
func (s *soak) finalCheck(c *tier.Client, out io.Writer) error {
	deadline := time.Now().Add(5*leaseTimeout + 10*time.Second)
	for {
		snap := c.Region().Snapshot()
		dead := 0
		for _, cl := range snap.Clients {
			if cl.State != "live" || cl.Gone {
				dead++
			}
		}
		if dead == 0 && snap.Chunks.Used == snap.Chunks.Shared {
			break
		}
		if time.Now().After(deadline) {
			daemon := s.daemon.exited()
			if daemon == nil {
				daemon = fmt.Errorf("cxltierd runs; its last lines:\n%s", s.daemon.lastLines())
			}
			return fmt.Errorf("after the workers stopped: %d dead clients, %d chunks used of which %d shared; private chunks by owner: %s\n%w",
				dead, snap.Chunks.Used, snap.Chunks.Shared, owners(c.Region()), daemon)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if problems := s.check(c); len(problems) > 0 {
		return fmt.Errorf("final checks: %s", strings.Join(problems, "; "))
	}
	tot, _ := s.totals()
	fmt.Fprintf(out, "soak OK: %d prefix ops, %d top-k steps, %d Engram rows; %d workers killed, %d daemon restarts; no chunk left to a dead client\n",
		tot["prefix"], tot["topk"], tot["engram"], s.kills, s.restarts)
	if s.o.damageEvery > 0 {
		s.mu.Lock()
		fmt.Fprintf(out, "under damage: %d bytes of the prefix index flipped, %d errors reported to workers; no panic, no hang, no wrong payload\n", s.damages, s.errs)
		s.mu.Unlock()
	}
	return nil
}

// owners names the clients that own private chunks: slot, lease and count.
func owners(r *tier.Region) string {
	leases := map[int]tier.LeaseInfo{}
	for _, l := range r.Leases() {
		leases[l.Slot] = l
	}
	var out []string
	for slot, n := range r.PrivateChunks() {
		l, ok := leases[slot]
		desc := "free lease (leaked)"
		if ok {
			desc = fmt.Sprintf("%s, pid %d, %s", l.Name, l.PID, l.State)
			if l.Gone {
				desc += ", process gone"
			}
		}
		out = append(out, fmt.Sprintf("slot %d (%s): %d", slot, desc, n))
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}
