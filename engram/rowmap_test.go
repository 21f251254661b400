package engram

import (
	"math/rand/v2"
	"testing"
)

// TestRowMapAgainstMap drives rowMap and a Go map with the same random
// puts and deletes, as the cache does (bounded population, heavy churn).
func TestRowMapAgainstMap(t *testing.T) {
	const slots = 300
	m := newRowMap(slots)
	ref := map[int64]int32{}
	rng := rand.New(rand.NewPCG(1, 1))
	var keys []int64
	for step := range 200000 {
		if len(ref) < slots && rng.IntN(2) == 0 {
			k := rng.Int64N(5000) * 1021 // collide on purpose
			if _, ok := ref[k]; !ok {
				m.put(k, int32(step))
				ref[k] = int32(step)
				keys = append(keys, k)
			}
		} else if len(keys) > 0 {
			i := rng.IntN(len(keys))
			k := keys[i]
			keys[i] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			m.delete(k)
			delete(ref, k)
		}
		if step%1000 == 0 {
			for k, v := range ref {
				if got, ok := m.get(k); !ok || got != v {
					t.Fatalf("step %d: key %d = %d, %v; want %d", step, k, got, ok, v)
				}
			}
			if _, ok := m.get(-5); ok {
				t.Fatal("absent key found")
			}
		}
	}
}
