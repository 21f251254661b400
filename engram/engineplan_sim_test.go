//go:build !race

package engram

import (
	"fmt"
	"testing"

	"github.com/cxltier/cxltier/kernels"
)

// The committed kernel joins the planner tests through the PTX
// interpreter: the deterministic schedule and three shuffled ones. Its
// threads race for ways, as on a GPU, so its slots are not held to the
// host's, only to holding their rows. Not under -race, where the
// interpreter is too slow: .ci/run runs these packages once more without
// it.
func init() {
	for _, seed := range []uint64{0, 1, 2, 3} {
		name := "ptxsim"
		if seed != 0 {
			name = fmt.Sprintf("ptxsim-seed%d", seed)
		}
		planEngines = append(planEngines, struct {
			name  string
			exact bool
			make  func(t testing.TB) kernels.Engine
		}{name, false, func(t testing.TB) kernels.Engine {
			e, err := kernels.NewSim(kernels.SimOptions{Seed: seed, RaceCheck: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { e.Close() })
			return e
		}})
	}
}
