package engram

import (
	"errors"
	"testing"

	"github.com/cxltier/cxltier/internal/safetensors"
)

// TestSGLangLayerShapes: a checkpoint's layer loads only when its scale
// plane is [rows, dim/32] of its weight plane, so a table never holds
// scales that belong to other rows or columns.
func TestSGLangLayerShapes(t *testing.T) {
	layer := func(rows, dim, scaleRows, scaleCols int64) *SGLangLayer {
		return &SGLangLayer{Layer: 3, WeightFile: "w", ScaleFile: "s",
			Weight: safetensors.Tensor{DType: "F8_E4M3", Shape: []int64{rows, dim}},
			Scale:  safetensors.Tensor{DType: "F8_E8M0", Shape: []int64{scaleRows, scaleCols}}}
	}
	for _, c := range []struct {
		name string
		l    *SGLangLayer
		ok   bool
	}{
		{"as SGLang keeps it", layer(1000, 256, 1000, 8), true},
		{"one scale column too many", layer(1000, 256, 1000, 9), false},
		{"one scale column too few", layer(1000, 256, 1000, 7), false},
		{"scales of other rows", layer(1000, 256, 999, 8), false},
		{"dim not a multiple of 32", layer(1000, 250, 1000, 8), false},
		{"no rows", layer(0, 256, 0, 8), false},
	} {
		err := c.l.check()
		if c.ok != (err == nil) || (err != nil && !errors.Is(err, ErrTable)) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	wrongType := layer(10, 64, 10, 2)
	wrongType.Scale.DType = "F32"
	if err := wrongType.check(); !errors.Is(err, ErrTable) {
		t.Errorf("an F32 scale plane: %v", err)
	}
}
