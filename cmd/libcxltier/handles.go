package main

import (
	"fmt"
	"sync"

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

// attached is a tier opened and attached by the library, with the handles
// of the indexes opened on it: they must close before the mapping goes.
type attached struct {
	r       *tier.Region
	c       *tier.Client
	indexes map[uint64]*prefix.Store
}

// index is an open prefix index and the tier handle it lives on.
type index struct {
	*prefix.Store
	tier uint64
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

func tierOf(h uint64) (*attached, error) { return get[*attached](&handles, h) }
func indexOf(h uint64) (*index, error)   { return get[*index](&handles, h) }
