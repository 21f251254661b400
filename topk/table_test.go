package topk

import (
	"math/rand/v2"
	"testing"
)

// TestSlotMapAgainstMap runs random puts and deletes (with heavy
// collisions: keys from a narrow range) against a Go map.
func TestSlotMapAgainstMap(t *testing.T) {
	for _, keyRange := range []int32{64, 5000, 1 << 30} {
		empty := make([]int32, 64) // 64 slots holding nothing
		for i := range empty {
			empty[i] = -1
		}
		var m slotMap
		m.build(empty)
		want := map[int32]int16{}
		rng := rand.New(rand.NewPCG(uint64(keyRange), 1))
		for op := range 20000 {
			k := rng.Int32N(keyRange)
			switch {
			case len(want) < 64 && rng.IntN(2) == 0:
				m.put(k, int16(op))
				want[k] = int16(op)
			default:
				m.del(k)
				delete(want, k)
			}
			if op%97 == 0 {
				for wk, wv := range want {
					if v, ok := m.get(wk); !ok || v != wv {
						t.Fatalf("range %d op %d: get(%d) = %d, %v; want %d", keyRange, op, wk, v, ok, wv)
					}
				}
				if _, ok := m.get(keyRange + 1); ok {
					t.Fatal("absent key found")
				}
			}
		}
	}
}
