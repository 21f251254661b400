package topk

import (
	"encoding/binary"
	"errors"
	"math/bits"
	"testing"

	"github.com/cxltier/cxltier/internal/ptxcheck"
	"github.com/cxltier/cxltier/kernels"
)

func TestEngineLayoutCheck(t *testing.T) {
	good := engineLayout{Slots: 4096, TopK: 2048, Layers: 61, MaxExtents: 657, ExtentEntries: 1598, EntryBytes: 656}
	if err := good.check(); err != nil {
		t.Fatal(err)
	}
	for name, mod := range map[string]func(*engineLayout){
		"no slots":         func(l *engineLayout) { l.Slots = 0 },
		"slots past int16": func(l *engineLayout) { l.Slots = 1 << 15 },
		"top-k over slots": func(l *engineLayout) { l.TopK = l.Slots + 1 },
		"no layers":        func(l *engineLayout) { l.Layers = 0 },
		"no extents":       func(l *engineLayout) { l.MaxExtents = 0 },
		"ragged entries":   func(l *engineLayout) { l.EntryBytes = 650 },
		"step too large":   func(l *engineLayout) { l.EntryBytes = 1 << 26 },
	} {
		l := good
		mod(&l)
		if err := l.check(); !errors.Is(err, ErrBadConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestInitialRegion pins the region layout topk.cu reads.
func TestInitialRegion(t *testing.T) {
	l := engineLayout{Slots: 3, TopK: 2, Layers: 1, MaxExtents: 2, ExtentEntries: 10, EntryBytes: 16}
	b := l.initialRegion([]kernels.Addr{kernels.At(1, 4096)})
	word := func(i int) int32 { return int32(binary.LittleEndian.Uint32(b[4*i:])) }
	want := []int32{0, 1, 2, -1, -1, -1, -1, -1, 0, 1, 2} // tokens[S+1], loaded[S+1], lru[S]
	for i, w := range want {
		if word(i) != w {
			t.Fatalf("word %d = %d, want %d (region %v)", i, word(i), w, b[:44])
		}
	}
	if l.extentsOffset() != 48 || int64(len(b)) != l.regionBytes() || l.regionBytes() != 48+16 {
		t.Fatalf("extents at %d, region %d bytes", l.extentsOffset(), len(b))
	}
	if got := kernels.Addr(binary.LittleEndian.Uint64(b[48:])); got != kernels.At(1, 4096) {
		t.Fatalf("extent 0 = %v", got)
	}
}

func TestPTXMatchesSource(t *testing.T) {
	if err := ptxcheck.Check("topk.cu", topkPTX, "cxl_topk_check", "cxl_topk_plan"); err != nil {
		t.Error(err)
	}
	rangeShift := uint64(bits.Len64(uint64(kernels.MaxRangeBytes)) - 1)
	if err := ptxcheck.Agree("topk.cu", map[string]uint64{"CHECK_ALL_MAX_BATCH": checkAllMaxBatch, "ADDR_RANGE_SHIFT": rangeShift,
		"NO_SLOT": hashNoSlot}); err != nil {
		t.Error(err)
	}
}
