//go:build cuda

package tiertest

import (
	"errors"
	"testing"

	"github.com/cxltier/cxltier/kernels"
)

// CUDA starts a CUDA engine on device 0 for t, closed when t ends; without
// a device t is skipped.
func CUDA(t testing.TB) kernels.Engine {
	e, err := kernels.NewCUDA(kernels.CUDAOptions{})
	if errors.Is(err, kernels.ErrNoDevice) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}
