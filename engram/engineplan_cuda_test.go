//go:build cuda

package engram

import (
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/kernels"
)

// The CUDA kernel joins the planner tests; without a device they skip.
func init() {
	planEngines = append(planEngines, struct {
		name  string
		exact bool
		make  func(t testing.TB) kernels.Engine
	}{"cuda", false, tiertest.CUDA})
}
