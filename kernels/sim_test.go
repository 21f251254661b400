//go:build !race

package kernels

import "testing"

// The interpreter engine joins every engine test: the committed gather
// kernels run on the deterministic schedule and on three shuffled ones, with
// the shared-memory race check on, and paced. Not under -race, where the interpreter
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
	// And paced, a page a piece: every block call of every engine test
	// runs as many kernels, two queued at a time, as on a paced GPU.
	engineMakers = append(engineMakers, struct {
		name string
		make func(t testing.TB) Engine
	}{"ptxsim-paced", func(t testing.TB) Engine {
		e, err := NewSim(SimOptions{RaceCheck: true})
		if err != nil {
			t.Fatal(err)
		}
		e.SetPacer(&countingPacer{}, 1)
		return e
	}})
}

// TestSimMappedEndsAtItsLength: mapped memory of n bytes (page-aligned on
// the host) ends at n for kernels, not at the page: reading past it faults.
func TestSimMappedEndsAtItsLength(t *testing.T) {
	e, err := NewSim(SimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	m, err := e.Mapped(100)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Free()
	if len(m.Host) != 100 {
		t.Fatalf("host side: %d bytes, want 100", len(m.Host))
	}
	if _, err := e.space.Bytes(m.Dev+96, 4); err != nil {
		t.Fatalf("the last word: %v", err)
	}
	if _, err := e.space.Bytes(m.Dev+100, 4); err == nil {
		t.Fatal("4 bytes past the mapped 100 read as memory")
	}
}
