//go:build !race

package topk

import (
	"fmt"
	"testing"

	"github.com/cxltier/cxltier/kernels"
)

// The committed kernels join the planner tests through the PTX
// interpreter: the deterministic schedule and three shuffled ones, with
// the shared-memory race check on. Not under -race, where the interpreter
// is too slow: .ci/run runs these packages once more without it.
func init() {
	for _, seed := range []uint64{0, 1, 2, 3} {
		name := "ptxsim"
		if seed != 0 {
			name = fmt.Sprintf("ptxsim-seed%d", seed)
		}
		planEngines = append(planEngines, struct {
			name string
			make func(t testing.TB) kernels.Engine
		}{name, func(t testing.TB) kernels.Engine {
			e, err := kernels.NewSim(kernels.SimOptions{Seed: seed, RaceCheck: true})
			if err != nil {
				t.Fatal(err)
			}
			return e
		}})
	}
}
