//go:build cuda

package topk

import (
	"errors"
	"testing"

	"github.com/cxltier/cxltier/kernels"
)

// The CUDA kernels join the planner tests; without a device they skip.
func init() {
	planEngines = append(planEngines, struct {
		name string
		make func(t testing.TB) kernels.Engine
	}{"cuda", func(t testing.TB) kernels.Engine {
		e, err := kernels.NewCUDA(kernels.CUDAOptions{})
		if errors.Is(err, kernels.ErrNoDevice) {
			t.Skip(err)
		}
		if err != nil {
			t.Fatal(err)
		}
		return e
	}})
}
