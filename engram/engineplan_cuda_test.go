//go:build cuda

package engram

import (
	"errors"
	"testing"

	"github.com/cxltier/cxltier/kernels"
)

// The CUDA kernel joins the planner tests; without a device they skip.
func init() {
	planEngines = append(planEngines, struct {
		name  string
		exact bool
		make  func(t testing.TB) kernels.Engine
	}{"cuda", false, func(t testing.TB) kernels.Engine {
		e, err := kernels.NewCUDA(kernels.CUDAOptions{})
		if errors.Is(err, kernels.ErrNoDevice) {
			t.Skip(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}})
}
