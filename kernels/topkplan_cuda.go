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
	mod         cu.Module
	check, plan cu.Function
	threads     int          // per planning block
	sharedLimit int          // opt-in shared memory per block
	sharedSet   int          // what plan's launches may use so far
	step        stage        // the step's words, read and written by the kernels in place (hostDev)
	mark        cu.DevicePtr // cxl_topk_check's verdict, epoch-stamped
	epoch       uint64       // of the current step, in [1, 1<<24)
	ops         cu.DevicePtr
	opsBytes    int64
	events      []cu.Event // tests: three events recorded around the two kernels
	checkAllMax int        // selections up to which plan blocks check the batch themselves
}

func (t *topkKernels) load(dev cu.Device) error {
	var err error
	if t.mod, err = cu.LoadData(topkPTX); err != nil {
		return fmt.Errorf("kernels: load top-k PTX: %w", err)
	}
	for name, fn := range map[string]*cu.Function{"cxl_topk_check": &t.check, "cxl_topk_plan": &t.plan} {
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
	t.checkAllMax = 1 << 16
	if t.mark, err = cu.MemAlloc(8); err != nil {
		return fmt.Errorf("kernels: top-k check word: %w", err)
	}
	return cu.MemsetD32(t.mark, 0, 2)
}

func (t *topkKernels) release() {
	t.step.free()
	if t.mark != 0 {
		cu.MemFree(t.mark)
		t.mark = 0
	}
	if t.ops != 0 {
		cu.MemFree(t.ops)
		t.ops = 0
	}
	if t.mod != (cu.Module{}) {
		t.mod.Unload()
		t.mod = cu.Module{}
	}
}

// CanPlanTopK implements TopKPlanner.
func (e *CUDA) CanPlanTopK(l TopKLayout) error {
	if err := l.Check(); err != nil {
		return err
	}
	return e.topk.fits(l)
}

// fits reports a layout whose plan blocks need more shared memory than
// the device gives one block.
func (t *topkKernels) fits(l TopKLayout) error {
	if need := l.sharedBytes(); need > t.sharedLimit {
		return fmt.Errorf("%w: planning top-k %d over %d slots needs %d bytes of shared memory per block, the device allows %d",
			ErrBadRequest, l.TopK, l.Slots, need, t.sharedLimit)
	}
	return nil
}

// PlanTopK implements TopKPlanner: the plan-and-fetch kernel on the
// engine's stream (after a check kernel for large batches; topk.cu); the
// kernels read and write the step's words in mapped host memory, so once
// the stream is done the counts are there.
func (e *CUDA) PlanTopK(s TopKStep) (TopKCounts, error) {
	if err := checkTopKStep(&s); err != nil || len(s.Reqs) == 0 {
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
	if err := t.fits(l); err != nil {
		return TopKCounts{}, err
	}
	shared := l.sharedBytes()
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
	if err := t.room(batch, k); err != nil {
		return TopKCounts{}, err
	}
	w := t.step.words()
	w[0] = ^uint64(0)
	for b, r := range s.Reqs {
		w[1+b] = uint64(uint32(r)) | uint64(uint32(s.Lens[b]))<<32
	}
	sel := uint64(bufs[2].ptr) + uint64(s.Sel.Offset)
	if err := e.topkLaunch(s, bufs[0], uint64(bufs[1].ptr), sel, uint64(bufs[3].ptr)+uint64(s.Out.Offset), shared); err != nil {
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
		hm, fn := w[1+batch+2*b], w[2+batch+2*b]
		c.Hits += int(uint32(hm))
		c.Misses += int(hm >> 32)
		c.Fills += int(uint32(fn))
		c.Newest += int(fn >> 32)
	}
	return c, nil
}

// room sizes the step words and the copy list for a batch.
func (t *topkKernels) room(batch, k int) error {
	if err := t.step.ensure(8 * (1 + 3*batch)); err != nil {
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

// topkLaunch queues the step's kernels: the plan-and-fetch kernel, after a
// check kernel for large batches. They read and write the step's words in
// place, so no copy is queued. Called inside enter.
func (e *CUDA) topkLaunch(s TopKStep, state *deviceBuffer, data, sel, out uint64, shared int) error {
	t, l := &e.topk, s.Layout
	batch, k := len(s.Reqs), l.TopK
	if err := t.nextEpoch(); err != nil {
		return err
	}
	words := t.step.hostDev
	t.record(0, e.stream)
	// A separate check launch costs more than every plan block reading a
	// small batch's selections; selections the caller checked need neither.
	check := uint64(2)
	switch n := batch * k; {
	case s.Checked:
		check = 0
	case n <= t.checkAllMax && batch <= checkAllMaxBatch:
		check = 1
	default:
		blocks := min(batch, e.maxBlocks)
		if err := launch(t.check, blocks, threadsPerBlock, 0, e.stream, sel, words+8, uint64(t.mark), uint64(batch), uint64(k), t.epoch); err != nil {
			return fmt.Errorf("kernels: cxl_topk_check: %w", err)
		}
	}
	t.record(1, e.stream)
	if err := launch(t.plan, batch, t.threads, shared, e.stream, sel, out, uint64(state.ptr), words, uint64(t.mark), uint64(t.ops),
		uint64(batch), uint64(k), uint64(l.Slots), uint64(l.RegionBytes()), uint64(l.ExtentsOffset()),
		uint64(l.ExtentEntries), uint64(l.EntryBytes), uint64(l.Layers), uint64(s.Layer), uint64(l.hashBits()),
		uint64(e.bases), data, check, t.epoch); err != nil {
		return fmt.Errorf("kernels: cxl_topk_plan: %w", err)
	}
	t.record(2, e.stream)
	return nil
}

// checkAllMaxBatch is CHECK_ALL_MAX_BATCH in topk.cu.
const checkAllMaxBatch = 64

// nextEpoch stamps a new step. The check word keeps the epoch in 24 bits;
// when they run out it is cleared and counting starts over (no step is in
// flight: PlanTopK waits for its own).
func (t *topkKernels) nextEpoch() error {
	t.epoch++
	if t.epoch < 1<<24 {
		return nil
	}
	t.epoch = 1
	return cu.MemsetD32(t.mark, 0, 2)
}

// record records test event i, when a test set them.
func (t *topkKernels) record(i int, stream cu.Stream) {
	if i < len(t.events) {
		t.events[i].Record(stream)
	}
}
