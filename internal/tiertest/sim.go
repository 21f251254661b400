package tiertest

import (
	"fmt"
	"testing"

	"github.com/cxltier/cxltier/kernels"
)

// SimSchedule is a schedule the PTX interpreter engine runs kernels on in
// tests: Seed 0 is the deterministic one.
type SimSchedule struct {
	Name string // "ptxsim", "ptxsim-seed1", ...
	Seed uint64
}

// SimSchedules are the schedules engine tests run the committed kernels
// on: the deterministic one and three shuffled ones.
func SimSchedules() []SimSchedule {
	out := []SimSchedule{{"ptxsim", 0}}
	for seed := uint64(1); seed <= 3; seed++ {
		out = append(out, SimSchedule{fmt.Sprintf("ptxsim-seed%d", seed), seed})
	}
	return out
}

// Sim starts an interpreter engine on schedule seed with the shared-memory
// race check on; the caller closes it.
func Sim(t testing.TB, seed uint64) kernels.Engine {
	t.Helper()
	e, err := kernels.NewSim(kernels.SimOptions{Seed: seed, RaceCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	return e
}
