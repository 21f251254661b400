package main

import (
	"errors"
	"testing"
	"unsafe"

	"github.com/cxltier/cxltier/kernels"
)

// TestKVPoolSpecRefusals: every malformed pool a caller can describe is
// refused before a buffer is wrapped, and a buffer of the wrong memory
// kind for the engine is refused when wrapped.
func TestKVPoolSpecRefusals(t *testing.T) {
	mem := make([]byte, 4096)
	p := unsafe.Pointer(&mem[0])
	good := func() kvPoolSpec {
		return kvPoolSpec{ptrs: []unsafe.Pointer{p, p}, lens: []int64{4096, 4096}, perLayer: 2, chunkBytes: 256, pageStride: 256}
	}
	cases := []struct {
		name string
		edit func(*kvPoolSpec)
	}{
		{"no buffers", func(s *kvPoolSpec) { s.ptrs, s.lens = nil, nil }},
		{"layers of 0", func(s *kvPoolSpec) { s.perLayer = 0 }},
		{"2 buffers in layers of 3", func(s *kvPoolSpec) { s.perLayer = 3 }},
		{"empty chunks", func(s *kvPoolSpec) { s.chunkBytes = 0 }},
		{"chunks overlapping", func(s *kvPoolSpec) { s.pageStride = 128 }},
		{"huge stride", func(s *kvPoolSpec) { s.pageStride = maxBuffer + 1 }},
		{"nil buffer", func(s *kvPoolSpec) { s.ptrs[1] = nil }},
		{"buffer smaller than a chunk", func(s *kvPoolSpec) { s.lens[0] = 100 }},
		{"negative length", func(s *kvPoolSpec) { s.lens[1] = -1 }},
		{"memory kind 2", func(s *kvPoolSpec) { s.where = 2 }},
	}
	if err := good().check(); err != nil {
		t.Fatalf("a good spec: %v", err)
	}
	for _, c := range cases {
		s := good()
		c.edit(&s)
		if err := s.check(); !errors.Is(err, errBadArg) {
			t.Errorf("%s: %v, want errBadArg", c.name, err)
		}
	}
	cpu := kernels.NewCPU(1)
	defer cpu.Close()
	dev := good()
	dev.where = onDevice
	if _, err := dev.wrap(cpu); !errors.Is(err, errBadArg) {
		t.Errorf("device memory on the cpu engine: %v", err)
	}
	spans, err := good().wrap(cpu)
	if err != nil || len(spans) != 2 || spans[0].Buf.Len() != 4096 {
		t.Fatalf("host memory on the cpu engine: %v, %v", spans, err)
	}
}
