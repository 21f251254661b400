//go:build cuda

package kernels

import (
	"fmt"
	"unsafe"

	"gorgonia.org/cu"
)

// topkKernels is the CUDA engine's top-k planner: the module of topk.cu,
// a pinned staging area for each step's words and device room for its
// copy list. Used inside enter (the engine lock is held).
type topkKernels struct {
	mod                cu.Module
	check, plan, fetch cu.Function
	threads            int // per planning block
	sharedLimit        int // opt-in shared memory per block
	sharedSet          int // what plan's launches may use so far
	step               stage
	ops                cu.DevicePtr
	opsBytes           int64
}

func (t *topkKernels) load(dev cu.Device) error {
	var err error
	if t.mod, err = cu.LoadData(topkPTX); err != nil {
		return fmt.Errorf("kernels: load top-k PTX: %w", err)
	}
	for name, fn := range map[string]*cu.Function{"cxl_topk_check": &t.check, "cxl_topk_plan": &t.plan, "cxl_topk_fetch": &t.fetch} {
		if *fn, err = t.mod.Function(name); err != nil {
			return fmt.Errorf("kernels: %s: %w", name, err)
		}
	}
	most, err := t.plan.Attribute(cu.FnMaxThreadsPerBlock)
	if err != nil {
		return fmt.Errorf("kernels: cxl_topk_plan threads: %w", err)
	}
	t.threads = min(1024, most) &^ 31
	if t.sharedLimit, err = maxSharedOptin(dev); err != nil {
		return err
	}
	t.sharedSet = 48 << 10
	return nil
}

func (t *topkKernels) release() {
	t.step.free()
	if t.ops != 0 {
		cu.MemFree(t.ops)
		t.ops = 0
	}
	if t.mod != (cu.Module{}) {
		t.mod.Unload()
		t.mod = cu.Module{}
	}
}

// PlanTopK implements TopKPlanner: three launches on the engine's stream
// (check, plan, fetch; topk.cu), then one download of the step's counts.
func (e *CUDA) PlanTopK(s TopKStep) (TopKCounts, error) {
	if err := checkTopKStep(&s); err != nil {
		return TopKCounts{}, err
	}
	var bufs [4]*deviceBuffer
	for i, b := range []Buffer{s.State, s.Data, s.Sel.Buf, s.Out.Buf} {
		db, err := e.own(b)
		if err != nil {
			return TopKCounts{}, err
		}
		bufs[i] = db
	}
	l, t := s.Layout, &e.topk
	shared := l.sharedBytes()
	if shared > t.sharedLimit {
		return TopKCounts{}, fmt.Errorf("%w: planning top-k %d over %d slots needs %d bytes of shared memory per block, the device allows %d",
			ErrBadRequest, l.TopK, l.Slots, shared, t.sharedLimit)
	}
	leave, err := e.enter()
	if err != nil {
		return TopKCounts{}, err
	}
	defer leave()
	if shared > t.sharedSet {
		if err := setMaxShared(t.plan, shared); err != nil {
			return TopKCounts{}, err
		}
		t.sharedSet = shared
	}
	batch, k := len(s.Reqs), l.TopK
	if len(s.Reqs) == 0 {
		return TopKCounts{}, nil
	}
	if err := t.room(batch, k); err != nil {
		return TopKCounts{}, err
	}
	w := t.step.words()
	w[0], w[1] = ^uint64(0), 0
	for b, r := range s.Reqs {
		w[2+b] = uint64(uint32(r)) | uint64(uint32(s.Lens[b]))<<32
	}
	sel := uint64(bufs[2].ptr) + uint64(s.Sel.Offset)
	if err := e.topkLaunch(s, bufs[0], bufs[1], sel, uint64(bufs[3].ptr)+uint64(s.Out.Offset), shared); err != nil {
		return TopKCounts{}, err
	}
	if err := e.stream.Synchronize(); err != nil {
		return TopKCounts{}, fmt.Errorf("kernels: top-k step: %w", err)
	}
	if bad := w[0]; bad != ^uint64(0) {
		var pos int32
		if err := cu.MemcpyDtoH(unsafe.Pointer(&pos), cu.DevicePtr(sel+4*bad), 4); err != nil {
			return TopKCounts{}, fmt.Errorf("kernels: read bad selection: %w", err)
		}
		row := int(bad) / k
		return TopKCounts{}, &BadSelection{Row: row, Index: int(bad) % k, Pos: pos, Len: s.Lens[row]}
	}
	var c TopKCounts
	for b := range batch {
		hm, fn := w[2+batch+2*b], w[3+batch+2*b]
		c.Hits += int(uint32(hm))
		c.Misses += int(hm >> 32)
		c.Fills += int(uint32(fn))
		c.Newest += int(fn >> 32)
	}
	return c, nil
}

// room sizes the step words and the copy list for a batch.
func (t *topkKernels) room(batch, k int) error {
	if err := t.step.ensure(8 * (2 + 3*batch)); err != nil {
		return err
	}
	need := int64(16) * int64(batch) * int64(k)
	if need <= t.opsBytes {
		return nil
	}
	if t.ops != 0 {
		cu.MemFree(t.ops)
		t.ops, t.opsBytes = 0, 0
	}
	var err error
	if t.ops, err = cu.MemAlloc(need); err != nil {
		return fmt.Errorf("kernels: top-k copy list of %d bytes: %w", need, err)
	}
	t.opsBytes = need
	return nil
}

// topkLaunch queues the step's upload, three kernels and the download of
// its counts. Called inside enter.
func (e *CUDA) topkLaunch(s TopKStep, state, data *deviceBuffer, sel, out uint64, shared int) error {
	t, l := &e.topk, s.Layout
	batch, k := len(s.Reqs), l.TopK
	dev := uint64(t.step.dev)
	if err := cu.MemcpyHtoDAsync(t.step.dev, unsafe.Pointer(&t.step.host[0]), int64(8*(2+batch)), e.stream); err != nil {
		return fmt.Errorf("kernels: upload top-k step: %w", err)
	}
	checkBlocks := min((batch*k+threadsPerBlock-1)/threadsPerBlock, e.maxBlocks)
	if err := launch(t.check, checkBlocks, threadsPerBlock, 0, e.stream, sel, dev, uint64(batch), uint64(k)); err != nil {
		return fmt.Errorf("kernels: cxl_topk_check: %w", err)
	}
	if err := launch(t.plan, batch, t.threads, shared, e.stream, dev+16, sel, out, uint64(state.ptr), dev, uint64(t.ops),
		uint64(batch), uint64(k), uint64(l.Slots), uint64(l.RegionBytes()), uint64(l.ExtentsOffset()),
		uint64(l.ExtentEntries), uint64(l.EntryBytes), uint64(l.Layers), uint64(s.Layer), uint64(l.hashBits())); err != nil {
		return fmt.Errorf("kernels: cxl_topk_plan: %w", err)
	}
	lanes := lanesPerRow(l.EntryBytes)
	fetchBlocks := min((batch*k*lanes+threadsPerBlock-1)/threadsPerBlock, e.maxBlocks)
	if err := launch(t.fetch, fetchBlocks, threadsPerBlock, 0, e.stream, uint64(e.bases), uint64(t.ops), dev,
		uint64(data.ptr), uint64(l.EntryBytes), uint64(lanes)); err != nil {
		return fmt.Errorf("kernels: cxl_topk_fetch: %w", err)
	}
	if err := cu.MemcpyDtoHAsync(unsafe.Pointer(&t.step.host[0]), t.step.dev, int64(8*(2+3*batch)), e.stream); err != nil {
		return fmt.Errorf("kernels: download top-k counts: %w", err)
	}
	return nil
}

// launch runs fn with 8-byte parameters (gorgonia.org/cu passes each
// parameter by address; every kernel here takes 64-bit values).
func launch(fn cu.Function, blocks, threads, shared int, stream cu.Stream, params ...uint64) error {
	ptrs := make([]unsafe.Pointer, len(params))
	for i := range params {
		ptrs[i] = unsafe.Pointer(&params[i])
	}
	return fn.Launch(blocks, 1, 1, threads, 1, 1, shared, stream, ptrs)
}
