package kernels

import (
	"encoding/binary"
	"errors"
	"testing"
)

func TestTopKLayoutCheck(t *testing.T) {
	good := TopKLayout{Slots: 4096, TopK: 2048, Layers: 61, MaxExtents: 657, ExtentEntries: 1598, EntryBytes: 656}
	if err := good.Check(); err != nil {
		t.Fatal(err)
	}
	cpu := NewCPU(1)
	defer cpu.Close()
	for name, mod := range map[string]func(*TopKLayout){
		"no slots":         func(l *TopKLayout) { l.Slots = 0 },
		"slots past int16": func(l *TopKLayout) { l.Slots = 1 << 15 },
		"top-k over slots": func(l *TopKLayout) { l.TopK = l.Slots + 1 },
		"no layers":        func(l *TopKLayout) { l.Layers = 0 },
		"no extents":       func(l *TopKLayout) { l.MaxExtents = 0 },
		"ragged entries":   func(l *TopKLayout) { l.EntryBytes = 650 },
		"step too large":   func(l *TopKLayout) { l.EntryBytes = 1 << 26 },
	} {
		l := good
		mod(&l)
		if err := l.Check(); !errors.Is(err, ErrBadRequest) {
			t.Errorf("%s: %v", name, err)
		}
		if err := cpu.CanPlanTopK(l); err == nil {
			t.Errorf("%s: the CPU planner accepts it", name)
		}
	}
}

// TestInitialRegion pins the region layout topk.cu reads.
func TestInitialRegion(t *testing.T) {
	l := TopKLayout{Slots: 3, TopK: 2, Layers: 1, MaxExtents: 2, ExtentEntries: 10, EntryBytes: 16}
	b := l.InitialRegion([]Addr{At(1, 4096)})
	word := func(i int) int32 { return int32(binary.LittleEndian.Uint32(b[4*i:])) }
	want := []int32{0, 1, 2, -1, -1, -1, -1, -1, 0, 1, 2} // tokens[S+1], loaded[S+1], lru[S]
	for i, w := range want {
		if word(i) != w {
			t.Fatalf("word %d = %d, want %d (region %v)", i, word(i), w, b[:44])
		}
	}
	if l.ExtentsOffset() != 48 || int64(len(b)) != l.RegionBytes() || l.RegionBytes() != 48+16 {
		t.Fatalf("extents at %d, region %d bytes", l.ExtentsOffset(), len(b))
	}
	if got := Addr(binary.LittleEndian.Uint64(b[48:])); got != At(1, 4096) {
		t.Fatalf("extent 0 = %v", got)
	}
}
