package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/cxltier/cxltier/kernels"
)

// engines are the gather engines of one attached tier: one per (engine,
// device, stream), shared by every pool and prefetcher opened on the tier
// with the same engine and stream, with the tier's devices registered
// once. A CUDA driver refuses to page-lock a range twice, so two handles
// each with an engine of their own (a top-k pool and an Engram
// prefetcher, as a DeepSeek V4-class model needs) would fail at the second
// open. SGLang runs one process per GPU, and a process may drive several:
// each device gets its own engine, in that device's context.
type engines struct {
	mu   sync.Mutex
	open map[engineKey]*sharedEngine
	// devices finds the device of a stream or of the calling thread
	// (kernels.StreamDevice and kernels.CurrentDevice; tests replace it).
	devices deviceFinder
	// pacer, once the tier joined its node's link, paces the engines'
	// bulk copies in pieces of piece bytes (see arbiter.go).
	pacer kernels.Pacer
	piece int64
	// bulk is where the CPU engines copy their background calls (a KV
	// pool's stores): lowered once the tier joined its link, or as
	// cxl_tier_bulk_priority set it (see bulk.go).
	bulk bulkPriority
}

// deviceFinder tells which GPU a caller means when it does not say.
type deviceFinder interface {
	StreamDevice(stream uintptr) (int, error)
	CurrentDevice() (int, bool)
}

type driverDevices struct{}

func (driverDevices) StreamDevice(s uintptr) (int, error) { return kernels.StreamDevice(s) }
func (driverDevices) CurrentDevice() (int, bool)          { return kernels.CurrentDevice() }

// engineKey names an engine: its Name ("cpu", "cuda:1", "ptxsim:0") and
// the CUDA stream it enqueues on (0: its own).
type engineKey struct {
	name   string
	stream uintptr
	// rows: the CPU engine of the row calls (Engram prefetches, top-k
	// fetches), apart from the bulk copies': a CPU engine runs its calls in
	// order, so a row call with a deadline would wait out every bulk call
	// queued before it (and, with the tier on its node's link, for a bulk
	// piece that itself waits for that very deadline).
	rows bool
}

// sharedEngine is an engine with the tier registered, and how many handles
// use it.
type sharedEngine struct {
	key  engineKey
	eng  kernels.Engine
	ids  []kernels.RangeID
	refs int
}

// engineSpec is the engine a caller named, resolved to its device: the key
// it has once made, and how to make it.
type engineSpec struct {
	key      engineKey
	make     func() (kernels.Engine, error)
	fallback bool // "auto" without a stream: the CPU engine if CUDA fails
}

// resolve reads an engine kind:
//
//	cpu        the CPU engine
//	cuda:N     the CUDA engine on device N
//	cuda       the CUDA engine on the device of stream, else of the calling
//	           thread's current context (torch's current device), else 0
//	auto       cuda when given a stream; without one, cuda if it starts,
//	           else cpu
//	ptxsim[:N] the PTX interpreter standing in for device N (slow: for
//	           tests and for debugging kernels where there is no GPU)
func (es *engines) resolve(kind string, stream uintptr) (engineSpec, error) {
	name, ord, hasOrd := strings.Cut(kind, ":")
	dev := 0
	if hasOrd {
		n, err := strconv.Atoi(ord)
		if err != nil || n < 0 || n > 1<<16 || (name != "cuda" && name != "ptxsim") {
			return engineSpec{}, fmt.Errorf("%w: engine %q (want cpu, cuda, cuda:N, auto, ptxsim or ptxsim:N)", kernels.ErrBadRequest, kind)
		}
		dev = n
	}
	switch {
	case name == "cpu" && !hasOrd:
		return engineSpec{key: engineKey{name: "cpu"}, make: func() (kernels.Engine, error) { return kernels.NewCPU(0), nil }}, nil
	case name == "ptxsim":
		return engineSpec{key: engineKey{name: fmt.Sprintf("ptxsim:%d", dev), stream: stream}, make: func() (kernels.Engine, error) {
			return kernels.NewSim(kernels.SimOptions{Device: dev})
		}}, nil
	case name == "cuda" || name == "auto":
		if !hasOrd {
			var err error
			if dev, err = es.callerDevice(stream); err != nil {
				return engineSpec{}, err
			}
		}
		opts := kernels.CUDAOptions{Device: dev, Stream: stream}
		return engineSpec{key: engineKey{name: fmt.Sprintf("cuda:%d", dev), stream: stream},
			make:     func() (kernels.Engine, error) { return kernels.NewCUDA(opts) },
			fallback: name == "auto" && stream == 0}, nil
	}
	return engineSpec{}, fmt.Errorf("%w: engine %q (want cpu, cuda, cuda:N, auto, ptxsim or ptxsim:N)", kernels.ErrBadRequest, kind)
}

// callerDevice is the device a caller that named none means: its stream's,
// else its thread's current context's, else 0.
func (es *engines) callerDevice(stream uintptr) (int, error) {
	f := es.devices
	if f == nil {
		f = driverDevices{}
	}
	if stream != 0 {
		d, err := f.StreamDevice(stream)
		if errors.Is(err, kernels.ErrNoCUDA) {
			return 0, nil // NewCUDA will say so
		}
		return d, err
	}
	if d, ok := f.CurrentDevice(); ok {
		return d, nil
	}
	return 0, nil
}

// acquire returns the tier's engine of kind on stream for bulk copies (KV
// pages, blocks), making it and registering the tier's devices (n of them,
// device i's mapping mem(i)) on first use. Each acquire is paired with a
// release.
func (es *engines) acquire(kind string, stream uintptr, n int, mem func(int) []byte) (*sharedEngine, error) {
	return es.acquireFor(kind, stream, false, n, mem)
}

// acquireRows is acquire for row calls (Engram, top-k): on the CPU an
// engine of their own, beside the bulk one; a GPU's engine is shared (its
// driver page-locks the tier once per process).
func (es *engines) acquireRows(kind string, stream uintptr, n int, mem func(int) []byte) (*sharedEngine, error) {
	return es.acquireFor(kind, stream, true, n, mem)
}

func (es *engines) acquireFor(kind string, stream uintptr, rows bool, n int, mem func(int) []byte) (*sharedEngine, error) {
	spec, err := es.resolve(kind, stream)
	if err != nil {
		return nil, err
	}
	if spec.key.name == "cpu" {
		spec.key.rows = rows
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	if se, ok := es.open[spec.key]; ok {
		se.refs++
		return se, nil
	}
	eng, err := spec.make()
	if err != nil && spec.fallback {
		eng, err = kernels.NewCPU(0), nil
	}
	if err != nil {
		return nil, err
	}
	key := engineKey{name: eng.Name(), stream: stream}
	if key.name == "cpu" {
		key.stream, key.rows = 0, rows
	}
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
	if !key.rows {
		paceEngine(eng, es.pacer, es.piece)
		es.bulk.apply(eng)
	}
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
