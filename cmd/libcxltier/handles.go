package main

import (
	"fmt"
	"sync"

	"github.com/cxltier/cxltier/cluster"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

// A C caller holds numbers, not Go pointers, so the library keeps the
// objects it handed out in one table for the life of the process. This is
// the library's only package-level state: a C ABI has no other place to
// keep it.
var handles = handleTable{objs: map[uint64]any{}}

type handleTable struct {
	mu   sync.Mutex
	next uint64
	objs map[uint64]any
}

// attached is a tier opened and attached by the library, with the objects
// opened on it (prefix indexes, Engram prefetchers) and how to close each:
// they read the mapping and must close before it goes.
type attached struct {
	r        *tier.Region
	c        *tier.Client
	children map[uint64]func() error
	engines  engines       // shared by the children that move data
	guard    callGuard     // the calls in flight, which detach waits for
	link     *cluster.Link // to the node's uplink; nil when switched off
}

// child is an object opened on a tier; closing it removes it from both
// the handle table and its tier's children.
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
	link *cluster.Link // the tier's, or nil
}

// addChild registers o, opened on tier a, as the handle it returns.
func (t *handleTable) addChild(a *attached, o any, c child) uint64 {
	h := t.add(o)
	t.mu.Lock()
	a.children[h] = c.close
	t.mu.Unlock()
	return h
}

// closeChild closes handle h, a child of tier c.tier.
func (t *handleTable) closeChild(h uint64, c child) error {
	t.forgetChild(h, c)
	return c.close()
}

// forgetChild takes handle h, a child of tier c.tier, out of the table and
// its tier's children without closing it.
func (t *handleTable) forgetChild(h uint64, c child) {
	t.remove(h)
	if a, err := tierOf(c.tier); err == nil {
		t.mu.Lock()
		delete(a.children, h)
		t.mu.Unlock()
	}
}

func (t *handleTable) add(o any) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	t.objs[t.next] = o
	return t.next
}

func (t *handleTable) remove(h uint64) (any, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o, ok := t.objs[h]
	delete(t.objs, h)
	return o, ok
}

// errBadHandle is reported for a handle the table does not hold (or one of
// another kind).
var errBadHandle = fmt.Errorf("%w: unknown handle", tier.ErrNotFound)

func get[T any](t *handleTable, h uint64) (T, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	o, ok := t.objs[h].(T)
	if !ok {
		return o, fmt.Errorf("handle %d: %w", h, errBadHandle)
	}
	return o, nil
}

// use is handle h as a T, with its tier's guard entered so the tier stays
// mapped until done is called (once the call is over).
func use[T any](h uint64) (o T, done func(), err error) {
	handles.mu.Lock()
	o, ok := handles.objs[h].(T)
	var a *attached
	if ok {
		switch x := any(o).(type) {
		case *attached:
			a = x
		case interface{ tierHandle() uint64 }:
			a, _ = handles.objs[x.tierHandle()].(*attached)
		}
	}
	handles.mu.Unlock()
	if !ok || a == nil {
		var zero T
		return zero, nil, fmt.Errorf("handle %d: %w", h, errBadHandle)
	}
	if err := a.guard.enter(); err != nil {
		var zero T
		return zero, nil, err
	}
	return o, a.guard.leave, nil
}

func tierOf(h uint64) (*attached, error) { return get[*attached](&handles, h) }
func indexOf(h uint64) (*index, error)   { return get[*index](&handles, h) }
