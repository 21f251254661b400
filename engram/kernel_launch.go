package engram

import (
	_ "embed"
	"fmt"

	"github.com/cxltier/cxltier/kernels"
)

// engramPTX is engram.cu compiled by scripts/genptx.sh.
//
//go:embed engram.ptx
var engramPTX string

// kernelStepper plans calls with cxl_engram_rows on an engine that
// launches kernels: the windows go up through the engine's staging, the
// output's counts are cleared, and one launch hashes, probes and fetches,
// all on the engine's stream. The module is the engine's, loaded by the
// first call.
type kernelStepper struct {
	e  kernels.Launcher
	fn kernels.Function
}

func (k *kernelStepper) plan(s *engineStep) (kernels.Handle, error) {
	return k.e.Run(func(lc kernels.Launch) error {
		// Checked inside Run: the table's ranges stay registered until
		// the kernel that reads them is queued.
		tokens, n, err := s.checkShapes(lc.CheckSpan)
		if err != nil {
			return err
		}
		if k.fn.IsZero() {
			if k.fn, err = lc.Function("engram", engramPTX, "cxl_engram_rows"); err != nil {
				return err
			}
		}
		var ptrs [4]uint64 // params, tags, cache, out
		l := s.layout
		for i, b := range []struct {
			buf     kernels.Buffer
			off, sz int64
		}{{s.params, 0, l.paramBytes()}, {s.tags, 0, l.tagBytes()}, {s.cache, 0, s.cache.Len()}, {s.out.Buf, s.out.Offset, outBytes(n)}} {
			if b.buf == nil { // tags without a cache
				continue
			}
			if ptrs[i], err = lc.Ptr(b.buf, b.off, b.sz); err != nil {
				return err
			}
		}
		if err := lc.Memset32(ptrs[3], 0, 2*countWords); err != nil {
			return fmt.Errorf("engram: clear counts: %w", err)
		}
		if n == 0 {
			return nil
		}
		windows, err := lc.Stage(asWords(s.windows))
		if err != nil {
			return err
		}
		threads := (n + 31) &^ 31
		blocks := min((threads+255)/256, lc.MaxBlocks())
		if err := lc.Kernel(k.fn, blocks, 256, 0, lc.Bases(), ptrs[0], windows, uint64(tokens), ptrs[1], ptrs[2], ptrs[3], s.epoch); err != nil {
			return fmt.Errorf("engram: cxl_engram_rows: %w", err)
		}
		return nil
	})
}
