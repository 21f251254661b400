//go:build cuda

package kernels

import (
	"fmt"
	"unsafe"

	"gorgonia.org/cu"
)

// engramKernels is the CUDA engine's Engram planner: the module of
// engram.cu, loaded by the first call that needs it, so that an engine
// that never plans Engram rows does not depend on it. Used inside enter.
type engramKernels struct {
	mod  cu.Module
	rows cu.Function
}

func (k *engramKernels) load() error {
	if k.mod != (cu.Module{}) {
		return nil
	}
	var err error
	if k.mod, err = cu.LoadData(engramPTX); err != nil {
		return fmt.Errorf("kernels: load Engram PTX: %w", err)
	}
	if k.rows, err = k.mod.Function("cxl_engram_rows"); err != nil {
		k.mod.Unload()
		k.mod = cu.Module{}
		return fmt.Errorf("kernels: cxl_engram_rows: %w", err)
	}
	return nil
}

func (k *engramKernels) release() {
	if k.mod != (cu.Module{}) {
		k.mod.Unload()
		k.mod = cu.Module{}
	}
}

// CanPlanEngram implements EngramPlanner.
func (e *CUDA) CanPlanEngram(l *EngramLayout) error { return l.Check() }

// PlanEngram implements EngramPlanner: the windows go up through a
// staging area, the output's counts are cleared, and one cxl_engram_rows
// launch hashes, probes and fetches; all on the engine's stream.
func (e *CUDA) PlanEngram(s EngramStep) (Handle, error) {
	tokens, n, err := checkEngramStep(&s, &e.ranges)
	if err != nil {
		return nil, err
	}
	var ptrs [4]uint64 // params, tags, cache, out
	for i, b := range []Buffer{s.Params, s.Tags, s.Cache, s.Out.Buf} {
		if b == nil { // tags without a cache
			continue
		}
		db, err := e.own(b)
		if err != nil {
			return nil, err
		}
		ptrs[i] = uint64(db.ptr)
	}
	out := ptrs[3] + uint64(s.Out.Offset)
	leave, err := e.enter()
	if err != nil {
		return nil, err
	}
	defer leave()
	if err := e.engram.load(); err != nil {
		return nil, err
	}
	if err := cu.MemsetD32Async(cu.DevicePtr(out), 0, 2*engramCountWords, e.stream); err != nil {
		return nil, fmt.Errorf("kernels: clear Engram counts: %w", err)
	}
	if n == 0 {
		return &cudaSynced{e: e}, nil
	}
	st, err := e.stage(len(s.Windows))
	if err != nil {
		return nil, err
	}
	copy(st.words(), asWords(s.Windows))
	if err := cu.MemcpyHtoDAsync(st.dev, unsafe.Pointer(&st.host[0]), int64(len(s.Windows))*8, e.stream); err != nil {
		return nil, fmt.Errorf("kernels: upload Engram windows: %w", err)
	}
	threads := (n + 31) &^ 31
	blocks := min((threads+threadsPerBlock-1)/threadsPerBlock, e.maxBlocks)
	if err := launch(e.engram.rows, blocks, threadsPerBlock, 0, e.stream, uint64(e.bases), ptrs[0], uint64(st.dev),
		uint64(tokens), ptrs[1], ptrs[2], out, s.Epoch); err != nil {
		return nil, fmt.Errorf("kernels: cxl_engram_rows: %w", err)
	}
	if err := st.ev.Record(e.stream); err != nil {
		return nil, fmt.Errorf("kernels: record event: %w", err)
	}
	st.used = true
	return &cudaHandle{e: e, ev: st.ev}, nil
}

// cudaSynced waits for everything queued on the engine so far.
type cudaSynced struct{ e *CUDA }

func (h *cudaSynced) Wait() error { return h.e.Sync() }
