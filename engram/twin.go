package engram

import (
	"unsafe"

	"github.com/cxltier/cxltier/kernels"
)

// twinStepper is the CPU engine's stepper: the Go twin of cxl_engram_rows,
// with the host's own hash (hashRule) and victim rule (probeLine) over the
// tags in the engine's buffer. It plans at once, in row order (one of the
// orders the kernel's threads may take), and queues one gather of the rows
// to fetch.
type twinStepper struct{ e *kernels.CPU }

func (t *twinStepper) plan(s *engineStep) (kernels.Handle, error) {
	_, n, err := s.checkShapes(t.e.CheckSpan)
	if err != nil {
		return nil, err
	}
	outBuf, err := t.e.Bytes(s.out.Buf)
	if err != nil {
		return nil, err
	}
	l := s.layout
	out := outBuf[s.out.Offset : s.out.Offset+outBytes(n)]
	counts := unsafe.Slice((*uint64)(unsafe.Pointer(&out[0])), countWords)
	slots := kernels.Int32s(out[8*countWords:], n)
	clear(counts)
	var c twinCache
	if l.sets > 0 {
		tags, err := t.e.Bytes(s.tags)
		if err != nil {
			return nil, err
		}
		c.begin(l, unsafe.Slice((*uint64)(unsafe.Pointer(&tags[0])), l.sets*ways), s.epoch)
	}
	rows := kernels.Rows{RowBytes: l.table.rowBytes, Buf: s.cache}
	perTok := l.rowsPerToken()
	hashed := make([]int64, 0, perTok)
	for i := range n {
		if i%perTok == 0 {
			hashed = l.hash.appendRows(hashed[:0], s.windows[i/perTok*l.maxN():][:l.maxN()])
		}
		row := hashed[i%perTok]
		slot, fetch := int32(i), true
		if l.sets > 0 {
			slot, fetch = c.probe(row, counts)
		}
		slots[i] = slot
		if fetch {
			rows.Tier = append(rows.Tier, l.table.addr(row))
			rows.Slots = append(rows.Slots, int64(slot))
		}
	}
	counts[1] = uint64(len(rows.Tier))
	counts[0] = uint64(n) - counts[1] - counts[3]
	return t.e.Gather(rows)
}

// twinCache is the cache as cxl_engram_rows sees it during one call.
type twinCache struct {
	l        *engineLayout
	tags     []uint64
	now      uint64
	bankLo   int
	bankSize int
}

func (c *twinCache) begin(l *engineLayout, tags []uint64, epoch uint64) {
	c.l, c.tags, c.now = l, tags, epoch&stampMask
	b := int(epoch % uint64(l.protect))
	lo, hi := l.spillSlots*b/l.protect, l.spillSlots*(b+1)/l.protect
	c.bankLo, c.bankSize = l.sets*ways+lo, hi-lo
}

// probe returns row's slot and whether to fetch it, counting spills and
// rows without room in counts[2] and counts[3] (slot -1).
func (c *twinCache) probe(row int64, counts []uint64) (int32, bool) {
	set := setOf(row, c.l.sets)
	if w, fetch := probeLine(c.tags[set*ways:set*ways+ways], row, c.now, uint64(c.l.protect)); w >= 0 {
		return int32(set*ways) + int32(w), fetch
	}
	if counts[2] < uint64(c.bankSize) {
		counts[2]++
		return int32(c.bankLo) + int32(counts[2]-1), true
	}
	counts[3]++
	return -1, false
}
