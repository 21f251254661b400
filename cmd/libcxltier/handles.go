package main

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cxltier/cxltier/cluster"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

// A C caller holds numbers, not Go pointers, so the library keeps the
// objects it handed out in one table for the life of the process. This is
// the library's only package-level state: a C ABI has no other place to
// keep it. The table is only a table: whether a tier's memory may be
// touched is the tier's rule (tier.Hold), which every call takes.
var handles handleTable

// handleTable maps handles to objects. Lookups, one or two a call, take no
// lock and write no shared word (a sync.Map's read path), so threads
// calling on one tier do not contend here.
type handleTable struct {
	next atomic.Uint64
	objs sync.Map // uint64 -> any
}

// attached is a tier opened and attached by the library.
type attached struct {
	r       *tier.Region
	c       *tier.Client
	engines engines // shared by the children that move data

	detaching atomic.Bool // one detach at a time

	mu       sync.Mutex
	link     *cluster.Link          // to the node's uplink; nil when switched off
	arbiter  *arbiter               // the node's link arbiter, once joined (cxl_tier_link)
	children map[uint64]func() bool // child handle -> unregisters its closer from c
}

func (a *attached) uplink() *cluster.Link {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.link
}

// child is an object opened on a tier; closing it removes it from the
// handle table and from the closers of its tier's client.
type child struct {
	tier   uint64
	handle uint64 // its own, once added
	close  func() error
}

func (c child) tierHandle() uint64 { return c.tier }

// index is an open prefix index.
type index struct {
	*prefix.Store
	child
	link *cluster.Link                    // the tier's, or nil
	auth atomic.Pointer[cluster.PageAuth] // the cluster key's, for its pages (cxl_prefix_cluster_key), or nil
}

// addChild registers o, opened on tier a, as the handle it returns. Its
// close is registered with a's client, so that a detach closes it (after
// the calls in flight, newest first, outside any lock of this table).
func (t *handleTable) addChild(a *attached, o any, c child) uint64 {
	h := t.add(o)
	unregister := a.c.OnClose(func() error {
		t.remove(h)
		a.mu.Lock()
		delete(a.children, h)
		a.mu.Unlock()
		// A load closed before its last layer says so to the caller of
		// its layers; to a detach it is one more thing to close.
		if err := c.close(); !errors.Is(err, prefix.ErrIncomplete) {
			return err
		}
		return nil
	})
	a.mu.Lock()
	a.children[h] = unregister
	a.mu.Unlock()
	return h
}

// closeChild closes handle h, a child of tier c.tier, unless a detach of
// the tier is closing it already.
func (t *handleTable) closeChild(h uint64, c child) error {
	if !t.forgetChild(h, c) {
		return nil
	}
	return c.close()
}

// forgetChild takes handle h, a child of tier c.tier, out of the table and
// its client's closers without closing it. False: a detach runs its close.
func (t *handleTable) forgetChild(h uint64, c child) bool {
	t.remove(h)
	a, err := tierOf(c.tier)
	if err != nil {
		return true
	}
	a.mu.Lock()
	unregister := a.children[h]
	delete(a.children, h)
	a.mu.Unlock()
	return unregister == nil || unregister()
}

func (t *handleTable) add(o any) uint64 {
	h := t.next.Add(1)
	t.objs.Store(h, o)
	return h
}

func (t *handleTable) remove(h uint64) (any, bool) {
	return t.objs.LoadAndDelete(h)
}

// errBadHandle is reported for a handle the table does not hold (or one of
// another kind).
var errBadHandle = fmt.Errorf("%w: unknown handle", tier.ErrNotFound)

func get[T any](t *handleTable, h uint64) (T, error) {
	v, _ := t.objs.Load(h)
	o, ok := v.(T)
	if !ok {
		return o, fmt.Errorf("handle %d: %w", h, errBadHandle)
	}
	return o, nil
}

// use is handle h as a T, with a hold on its tier taken so the tier stays
// mapped until done.Done is called (once the call is over). The hold is
// returned as a value, not a bound method: a func value would cost an
// allocation a call.
func use[T any](h uint64) (o T, done tier.Hold, err error) {
	v, _ := handles.objs.Load(h)
	o, ok := v.(T)
	var a *attached
	if ok {
		switch x := any(o).(type) {
		case *attached:
			a = x
		case interface{ tierHandle() uint64 }:
			a, _ = get[*attached](&handles, x.tierHandle())
		}
	}
	if !ok || a == nil {
		var zero T
		return zero, tier.Hold{}, fmt.Errorf("handle %d: %w", h, errBadHandle)
	}
	hold, err := a.c.Hold()
	if err != nil {
		var zero T
		return zero, hold, err
	}
	return o, hold, nil
}

func tierOf(h uint64) (*attached, error) { return get[*attached](&handles, h) }
func indexOf(h uint64) (*index, error)   { return get[*index](&handles, h) }
