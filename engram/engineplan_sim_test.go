//go:build !race

package engram

import (
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/kernels"
)

// The committed kernel joins the planner tests through the PTX
// interpreter: the deterministic schedule and three shuffled ones. Its
// threads race for ways, as on a GPU, so its slots are not held to the
// host's, only to holding their rows. Not under -race, where the
// interpreter is too slow: .ci/run runs these packages once more without
// it.
func init() {
	for _, s := range tiertest.SimSchedules() {
		planEngines = append(planEngines, struct {
			name  string
			exact bool
			make  func(t testing.TB) kernels.Engine
		}{s.Name, false, func(t testing.TB) kernels.Engine {
			e := tiertest.Sim(t, s.Seed)
			t.Cleanup(func() { e.Close() })
			return e
		}})
	}
}
