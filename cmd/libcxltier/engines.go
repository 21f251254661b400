package main

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cxltier/cxltier/kernels"
)

// engines are the gather engines of one attached tier: one per (engine,
// stream), shared by every pool and prefetcher opened on the tier with the
// same engine and stream, with the tier's devices registered once. A CUDA
// driver refuses to page-lock a range twice, so two handles each with an
// engine of their own (a top-k pool and an Engram prefetcher, as a DeepSeek
// V4-class model needs) would fail at the second open.
type engines struct {
	mu   sync.Mutex
	open map[engineKey]*sharedEngine
}

// engineKey names an engine: its Name ("cpu", "cuda:0") and the CUDA
// stream it enqueues on (0: its own).
type engineKey struct {
	name   string
	stream uintptr
}

// sharedEngine is an engine with the tier registered, and how many handles
// use it.
type sharedEngine struct {
	key  engineKey
	eng  kernels.Engine
	ids  []kernels.RangeID
	refs int
}

// engineOf makes the engine a caller named: "cpu", "cuda", or "auto" (CUDA
// when given a stream or when the build and machine have it, else CPU).
func engineOf(kind string, stream uintptr) (kernels.Engine, error) {
	if kind == "cuda" || (kind == "auto" && stream != 0) {
		return kernels.NewCUDA(kernels.CUDAOptions{Stream: stream})
	}
	return kernels.New(kind)
}

// likelyKey is the key an engine of kind would have, so that a second
// open finds the first one's engine without making another (a CUDA engine
// retains a context and allocates); "" when it depends on the machine.
func likelyKey(kind string, stream uintptr) engineKey {
	switch {
	case kind == "cpu":
		return engineKey{name: "cpu"}
	case kind == "cuda" || kind == "auto":
		return engineKey{name: "cuda:0", stream: stream}
	}
	return engineKey{}
}

// acquire returns the tier's engine of kind on stream, making it and
// registering the tier's devices (n of them, device i's mapping mem(i)) on
// first use. Each acquire is paired with a release.
func (es *engines) acquire(kind string, stream uintptr, n int, mem func(int) []byte) (*sharedEngine, error) {
	es.mu.Lock()
	defer es.mu.Unlock()
	if se, ok := es.open[likelyKey(kind, stream)]; ok {
		se.refs++
		return se, nil
	}
	eng, err := engineOf(kind, stream)
	if err != nil {
		return nil, err
	}
	key := engineKey{name: eng.Name(), stream: stream}
	if se, ok := es.open[key]; ok { // "auto" became an engine the tier has
		eng.Close()
		se.refs++
		return se, nil
	}
	ids, err := kernels.RegisterAll(eng, n, mem)
	if err != nil {
		eng.Close()
		return nil, fmt.Errorf("engine %s: %w", key.name, err)
	}
	se := &sharedEngine{key: key, eng: eng, ids: ids, refs: 1}
	if es.open == nil {
		es.open = map[engineKey]*sharedEngine{}
	}
	es.open[key] = se
	return se, nil
}

// release drops one use of se; the last unregisters the tier and closes
// the engine.
func (es *engines) release(se *sharedEngine) error {
	es.mu.Lock()
	defer es.mu.Unlock()
	if se.refs--; se.refs > 0 {
		return nil
	}
	delete(es.open, se.key)
	return errors.Join(kernels.UnregisterAll(se.eng, se.ids), se.eng.Close())
}

// count is the number of open engines (for tests).
func (es *engines) count() int {
	es.mu.Lock()
	defer es.mu.Unlock()
	return len(es.open)
}
