//go:build !race

package kernels

import "testing"

// The interpreter engine joins every engine test: the committed gather
// kernels run on the deterministic schedule and on three shuffled ones, with
// the shared-memory race check on. Not under -race, where the interpreter
// is too slow: .ci/run runs these packages once more without it.
func init() {
	for _, s := range []struct {
		name string
		seed uint64
	}{{"ptxsim", 0}, {"ptxsim-shuffled7", 7}, {"ptxsim-shuffled8", 8}, {"ptxsim-shuffled9", 9}} {
		engineMakers = append(engineMakers, struct {
			name string
			make func(t testing.TB) Engine
		}{s.name, func(t testing.TB) Engine {
			e, err := NewSim(SimOptions{Seed: s.seed, RaceCheck: true})
			if err != nil {
				t.Fatal(err)
			}
			return e
		}})
	}
}
