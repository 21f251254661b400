//go:build cuda

package topk

import (
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/kernels"
)

// The CUDA kernels join the planner tests; without a device they skip.
func init() {
	planEngines = append(planEngines, struct {
		name string
		make func(t testing.TB) kernels.Engine
	}{"cuda", tiertest.CUDA})
}
