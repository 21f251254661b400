package main

// #include <stdint.h>
import "C"

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier/link"
)

// A tier's process joins its node's link arbiter (tier/link) with
// cxl_tier_link: from then on the bulk copies of its engines (a KV
// pool's stores and loads, a prefill's pages, a fill) move in pieces that
// wait while another transfer's deadline is due, and its Engram
// prefetchers with a deadline claim the link until their rows are in. A
// process that never joins moves as it likes, as before.

// arbiter is the attached tier's seat on its node's link and the piece its
// bulk copies move in.
type arbiter struct {
	l     *link.Link
	name  string
	piece int64
}

// joinArbiter joins tier h to the link table cfg names (the node's by
// default), pacing its engines in pieces of piece bytes (0: each
// engine's default). Joining again under the same name is a no-op; under
// another, an error. The seat is given back when the tier detaches.
func joinArbiter(h uint64, cfg link.Config, piece int64) (string, error) {
	if piece < 0 || piece > maxBuffer {
		return "", fmt.Errorf("link: %w: piece of %d bytes", errBadArg, piece)
	}
	a, done, err := use[*attached](h)
	if err != nil {
		return "", err
	}
	defer done.Done()
	a.mu.Lock()
	defer a.mu.Unlock()
	want := cfg.Name
	if want == "" {
		want = fmt.Sprintf("node%d", a.c.Node())
	}
	if a.arbiter != nil {
		if a.arbiter.name != want || a.arbiter.piece != piece {
			return "", fmt.Errorf("link: %w: this tier already joined %q in pieces of %d bytes", errBadArg, a.arbiter.name, a.arbiter.piece)
		}
		return a.arbiter.name, nil
	}
	l, err := link.Open(a.c, cfg)
	if err != nil {
		return "", err
	}
	a.arbiter = &arbiter{l: l, name: want, piece: piece}
	// The closers run after the calls in flight, so no copy of this tier
	// paces on a seat given back; those opened later close first.
	a.c.OnClose(l.Close)
	a.engines.pace(l, piece)
	a.engines.lowerBulk()
	return want, nil
}

// claimer is the link an Engram prefetcher with a deadline claims, or nil.
func (a *attached) claimer() *link.Link {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.arbiter == nil {
		return nil
	}
	return a.arbiter.l
}

// firstTokenBudget is the deadline of a first-token transfer (a KV pool's
// load, a prefill's stores for its decode): a time to first token an
// operator would call late. A transfer that runs past it stops holding up
// the bulk traffic and is counted late (cxltier_link_first_token_misses).
const firstTokenBudget = 2 * time.Second

// firstToken begins a first-token transfer on the link the tier joined,
// for a KV pool's mover (prefix.Mover.FirstToken); with no link, nothing.
func (a *attached) firstToken() (kernels.Pacer, func()) {
	l := a.claimer()
	if l == nil {
		return nil, func() {}
	}
	f := l.BeginFirst(time.Now().Add(firstTokenBudget))
	return f, f.End
}

// pace makes p the pacer of the tier's engines, those open and those
// made from now on.
func (es *engines) pace(p kernels.Pacer, piece int64) {
	es.mu.Lock()
	defer es.mu.Unlock()
	es.pacer, es.piece = p, piece
	for key, se := range es.open {
		if !key.rows {
			paceEngine(se.eng, p, piece)
		}
	}
}

// paceEngine paces eng's block calls: a CPU engine's in pieces its
// workers take turns for, a device engine's as kernels over a piece of
// pages each, at most two of a call queued, so a row gather queued behind
// them on the same stream waits for two pieces, not for the whole call.
func paceEngine(eng kernels.Engine, p kernels.Pacer, piece int64) {
	if pe, ok := eng.(kernels.Paced); ok && p != nil {
		pe.SetPacer(p, piece)
	}
}

// cxl_tier_link joins tier h to the link arbiter called name (NULL or "":
// the node's, "node<N>") and writes the table's name into buf: its
// engines' bulk copies then move in pieces of piece bytes (0: 256 KiB on
// the CPU engine, 1 MiB on a GPU's) that give way to deadlines, and its Engram prefetchers opened from now
// on claim the link for their deadlines.
//
//export cxl_tier_link
func cxl_tier_link(h C.uint64_t, name *C.char, piece C.int64_t, buf *C.char, bufCap C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_tier_link", errbuf, errlen, &code)
	err := func() error {
		var n string
		if name != nil {
			n = C.GoString(name)
		}
		got, err := joinArbiter(uint64(h), link.Config{Name: n}, int64(piece))
		if err != nil {
			return err
		}
		return copyString([]byte(got), buf, bufCap)
	}()
	return report(err, errbuf, errlen)
}

// cxl_link_stats writes the link table name's sums (link.Stats) as JSON
// into buf: what the processes on the link say of themselves.
//
//export cxl_link_stats
func cxl_link_stats(h C.uint64_t, name *C.char, buf *C.char, bufCap C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_link_stats", errbuf, errlen, &code)
	err := func() error {
		if name == nil {
			return fmt.Errorf("link stats: %w: no table name", errBadArg)
		}
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		st, err := link.ReadStats(a.r, C.GoString(name))
		if err != nil {
			return err
		}
		raw, err := json.Marshal(st)
		if err != nil {
			return err
		}
		return copyString(raw, buf, bufCap)
	}()
	return report(err, errbuf, errlen)
}

// cxl_link_turn is a bulk mover's turn of n bytes on the link tier h
// joined (cxl_tier_link): it returns at once unless a deadline transfer of
// some process on the link is due, and otherwise once none it obeys is
// left. For bulk copies the library does not make itself (a cluster fill
// that another transfer engine writes into the tier): call it before each
// piece. A tier that joined no link returns at once.
//
//export cxl_link_turn
func cxl_link_turn(h C.uint64_t, n C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_link_turn", errbuf, errlen, &code)
	err := func() error {
		if n < 0 {
			return fmt.Errorf("link turn: %w: %d bytes", errBadArg, n)
		}
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if l := a.claimer(); l != nil {
			l.Turn(int64(n))
		}
		return nil
	}()
	return report(err, errbuf, errlen)
}
