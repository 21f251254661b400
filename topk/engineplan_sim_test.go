//go:build !race

package topk

import (
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/kernels"
)

// The committed kernels join the planner tests through the PTX
// interpreter: the deterministic schedule and three shuffled ones, with
// the shared-memory race check on. Not under -race, where the interpreter
// is too slow: .ci/run runs these packages once more without it.
func init() {
	for _, s := range tiertest.SimSchedules() {
		planEngines = append(planEngines, struct {
			name string
			make func(t testing.TB) kernels.Engine
		}{s.Name, func(t testing.TB) kernels.Engine { return tiertest.Sim(t, s.Seed) }})
	}
}
