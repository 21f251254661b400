package topk

import (
	_ "embed"
	"fmt"
	"unsafe"

	"github.com/cxltier/cxltier/kernels"
)

// topkPTX is topk.cu compiled by scripts/genptx.sh.
//
//go:embed topk.ptx
var topkPTX string

// checkAllMaxBatch is CHECK_ALL_MAX_BATCH in topk.cu: up to this batch
// (and kernelStepper.checkAllMax selections) each plan block checks the
// whole batch's selections itself and the check launch is skipped.
const checkAllMaxBatch = 64

// kernelStepper plans steps with the kernels of topk.cu on an engine
// that launches them: the module is the engine's (loaded once however
// many pools use it); the step's words (pinned host memory the kernels
// read and write in place), the check word and the copy list are this
// stepper's.
type kernelStepper struct {
	e               kernels.Launcher
	fnCheck, fnPlan kernels.Function
	threads         int // per planning block
	sharedLimit     int // opt-in shared memory per block
	sharedSet       int // what plan's launches may use so far
	checkAllMax     int // selections up to which plan blocks check the batch themselves
	words           *kernels.Mapped
	mark            kernels.Buffer // cxl_topk_check's verdict, epoch-stamped
	epoch           uint64         // of the current step, in [1, 1<<24)
	ops             kernels.Buffer
}

// load finds the kernels and the device's limits, once.
func (t *kernelStepper) load() error {
	if !t.fnPlan.IsZero() {
		return nil
	}
	mark, err := t.e.Alloc(8)
	if err != nil {
		return fmt.Errorf("topk: check word: %w", err)
	}
	if err := t.e.Upload(mark, 0, make([]byte, 8)); err != nil {
		mark.Free()
		return err
	}
	_, err = t.e.Run(func(l kernels.Launch) error {
		var err error
		if t.fnCheck, err = l.Function("topk", topkPTX, "cxl_topk_check"); err != nil {
			return err
		}
		if t.fnPlan, err = l.Function("topk", topkPTX, "cxl_topk_plan"); err != nil {
			return err
		}
		most, err := l.MaxThreads(t.fnPlan)
		if err != nil {
			return err
		}
		t.threads = min(1024, most) &^ 31
		t.sharedLimit, err = l.SharedLimit()
		return err
	})
	if err != nil {
		mark.Free()
		t.fnPlan = kernels.Function{}
		return fmt.Errorf("topk: load kernels on %s: %w", t.e.Name(), err)
	}
	t.mark, t.sharedSet, t.checkAllMax = mark, 48<<10, 1<<16
	return nil
}

func (t *kernelStepper) fits(l engineLayout) error {
	if err := t.load(); err != nil {
		return err
	}
	if need := l.sharedBytes(); need > t.sharedLimit {
		return fmt.Errorf("%w: planning top-k %d over %d slots needs %d bytes of shared memory per block, the device allows %d",
			ErrBadConfig, l.TopK, l.Slots, need, t.sharedLimit)
	}
	return nil
}

func (t *kernelStepper) close() error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	keep(t.words.Free())
	for _, b := range []kernels.Buffer{t.mark, t.ops} {
		if b != nil {
			keep(b.Free())
		}
	}
	t.words, t.mark, t.ops = nil, nil, nil
	return first
}

// room sizes the step words and the copy list for a batch.
func (t *kernelStepper) room(batch, k int) error {
	if need := 8 * (1 + 3*batch); t.words == nil || len(t.words.Host) < need {
		if err := t.words.Free(); err != nil {
			return err
		}
		t.words = nil
		w, err := t.e.Mapped(max(need, 4096))
		if err != nil {
			return fmt.Errorf("topk: step words: %w", err)
		}
		t.words = w
	}
	need := int64(16) * int64(batch) * int64(k)
	if t.ops != nil && t.ops.Len() >= need {
		return nil
	}
	if t.ops != nil {
		t.ops.Free()
		t.ops = nil
	}
	ops, err := t.e.Alloc(need)
	if err != nil {
		return fmt.Errorf("topk: copy list of %d bytes: %w", need, err)
	}
	t.ops = ops
	return nil
}

// plan runs the plan-and-fetch kernel on the engine's stream (after a
// check kernel for large batches); the kernels read and write the step's
// words in mapped host memory, so once the stream is done the counts are
// there.
func (t *kernelStepper) plan(s *engineStep) (engineCounts, error) {
	l := s.layout
	if err := t.fits(l); err != nil {
		return engineCounts{}, err
	}
	batch, k := len(s.reqs), l.TopK
	if err := t.room(batch, k); err != nil {
		return engineCounts{}, err
	}
	var c engineCounts
	_, err := t.e.Run(func(lc kernels.Launch) error {
		var err error
		c, err = t.run(lc, s)
		return err
	})
	return c, err
}

// run is plan inside the engine's Run.
func (t *kernelStepper) run(lc kernels.Launch, s *engineStep) (engineCounts, error) {
	l := s.layout
	batch, k := len(s.reqs), l.TopK
	n := int64(batch) * int64(k) * 4
	var ptrs [4]uint64
	for i, op := range []struct {
		b       kernels.Buffer
		off, sz int64
	}{{s.state, 0, s.state.Len()}, {s.data, 0, s.data.Len()}, {s.sel.Buf, s.sel.Offset, n}, {s.out.Buf, s.out.Offset, n}} {
		p, err := lc.Ptr(op.b, op.off, op.sz)
		if err != nil {
			return engineCounts{}, err
		}
		ptrs[i] = p
	}
	state, data, sel, out := ptrs[0], ptrs[1], ptrs[2], ptrs[3]
	if shared := l.sharedBytes(); shared > t.sharedSet {
		if err := lc.AllowShared(t.fnPlan, shared); err != nil {
			return engineCounts{}, err
		}
		t.sharedSet = shared
	}
	w := t.words.Words()
	w[0] = ^uint64(0)
	for b, r := range s.reqs {
		w[1+b] = uint64(uint32(r)) | uint64(uint32(s.lens[b]))<<32
	}
	if err := t.launch(lc, s, state, data, sel, out); err != nil {
		return engineCounts{}, err
	}
	if err := lc.Sync(); err != nil {
		return engineCounts{}, fmt.Errorf("topk: engine step: %w", err)
	}
	if bad := w[0]; bad != ^uint64(0) {
		if bad >= uint64(batch*k) {
			return engineCounts{}, fmt.Errorf("%w: the kernel reports selection %d of %d", ErrBadInput, bad, batch*k)
		}
		var pos int32
		if err := lc.Read(unsafe.Slice((*byte)(unsafe.Pointer(&pos)), 4), sel+4*bad); err != nil {
			return engineCounts{}, fmt.Errorf("topk: read bad selection: %w", err)
		}
		row := int(bad) / k
		return engineCounts{}, &badSelection{row: row, index: int(bad) % k, pos: pos, len: s.lens[row]}
	}
	var c engineCounts
	for b := range batch {
		hm, fn := w[1+batch+2*b], w[2+batch+2*b]
		c.hits += int(uint32(hm))
		c.misses += int(hm >> 32)
		c.fills += int(uint32(fn))
		c.newest += int(fn >> 32)
	}
	return c, nil
}

// launch queues the step's kernels: the plan-and-fetch kernel, after a
// check kernel for large batches.
func (t *kernelStepper) launch(lc kernels.Launch, s *engineStep, state, data, sel, out uint64) error {
	l := s.layout
	batch, k := len(s.reqs), l.TopK
	if err := t.nextEpoch(lc); err != nil {
		return err
	}
	mark, err := lc.Ptr(t.mark, 0, 8)
	if err != nil {
		return err
	}
	ops, err := lc.Ptr(t.ops, 0, 16*int64(batch)*int64(k))
	if err != nil {
		return err
	}
	words := t.words.Dev
	// A separate check launch costs more than every plan block reading a
	// small batch's selections; selections the pool checked need neither.
	check := uint64(2)
	switch n := batch * k; {
	case s.checked:
		check = 0
	case n <= t.checkAllMax && batch <= checkAllMaxBatch:
		check = 1
	default:
		blocks := min(batch, lc.MaxBlocks())
		if err := lc.Kernel(t.fnCheck, blocks, 256, 0, sel, words+8, mark, uint64(batch), uint64(k), t.epoch); err != nil {
			return fmt.Errorf("topk: cxl_topk_check: %w", err)
		}
	}
	if err := lc.Kernel(t.fnPlan, batch, t.threads, l.sharedBytes(), sel, out, state, words, mark, ops,
		uint64(batch), uint64(k), uint64(l.Slots), uint64(l.regionBytes()), uint64(l.extentsOffset()),
		uint64(l.ExtentEntries), uint64(l.EntryBytes), uint64(l.Layers), uint64(s.layer), uint64(l.hashBits()),
		lc.Bases(), data, check, t.epoch); err != nil {
		return fmt.Errorf("topk: cxl_topk_plan: %w", err)
	}
	return nil
}

// nextEpoch stamps a new step. The check word keeps the epoch in 24 bits;
// when they run out it is cleared and counting starts over (no step is in
// flight: plan waits for its own).
func (t *kernelStepper) nextEpoch(lc kernels.Launch) error {
	t.epoch++
	if t.epoch < 1<<24 {
		return nil
	}
	t.epoch = 1
	mark, err := lc.Ptr(t.mark, 0, 8)
	if err != nil {
		return err
	}
	return lc.Memset32(mark, 0, 2)
}
