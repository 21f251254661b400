package engram

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
)

type vector struct {
	Geometry    Geometry    `json:"geometry"`
	Layer       int         `json:"layer"`
	Multipliers []int64     `json:"multipliers"`
	Moduli      [][]int64   `json:"moduli"`
	IDs         [][]int64   `json:"ids"`
	Local       [][][]int64 `json:"local"`
	Rows        [][][]int64 `json:"rows"`
}

// TestNumpyVectors compares against rows computed by numpy itself
// (testdata/gen_vectors.py): multipliers, the prime walk, and the hash,
// across geometries that reach every branch of numpy's bounded draw.
func TestNumpyVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vs []vector
	if err := json.Unmarshal(raw, &vs); err != nil {
		t.Fatal(err)
	}
	if len(vs) < 10 {
		t.Fatalf("only %d vectors", len(vs))
	}
	for _, v := range vs {
		h, err := NewHasher(v.Geometry)
		if err != nil {
			t.Fatalf("%s: %v", v.Geometry.Name, err)
		}
		m, _ := h.Multipliers(v.Layer)
		if !slices.Equal(m, v.Multipliers) {
			t.Errorf("%s layer %d: multipliers %v, numpy %v", v.Geometry.Name, v.Layer, m, v.Multipliers)
		}
		mods, _ := h.Moduli(v.Layer)
		for o := range mods {
			if !slices.Equal(mods[o], v.Moduli[o]) {
				t.Errorf("%s layer %d order %d: moduli %v, numpy %v", v.Geometry.Name, v.Layer, o+2, mods[o], v.Moduli[o])
			}
		}
		got, err := h.HashBatch(nil, v.Layer, v.IDs)
		if err != nil {
			t.Fatal(err)
		}
		var want []int64
		for _, seq := range v.Rows {
			for _, pos := range seq {
				want = append(want, pos...)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s layer %d: rows differ from numpy", v.Geometry.Name, v.Layer)
		}
	}
}

func TestEngramMDCheckVector(t *testing.T) {
	g, _ := Preset("v4.1-flash")
	h, err := NewHasher(g)
	if err != nil {
		t.Fatal(err)
	}
	mods, _ := h.Moduli(1)
	if !slices.Equal(mods[0][:3], []int64{16000057, 16000079, 16000081}) {
		t.Errorf("layer 1 first moduli %v", mods[0][:3])
	}
	rows, err := h.Hash(nil, 1, nil, []int64{0, 1, 2})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rows[:3], []int64{5702652, 24393184, 39183301}) {
		t.Errorf("global rows of t=0: %v", rows[:3])
	}
	local := []int64{5702652, 8393127, 7183165, 13503566}
	for j, want := range local {
		if got := rows[j] - offsetOf(mods, j); got != want {
			t.Errorf("local index %d = %d, want %d", j, got, want)
		}
	}
	// Layer 14 continues the prime walk after layer 1's last prime.
	mods14, _ := h.Moduli(14)
	if mods14[0][0] <= mods[0][len(mods[0])-1] {
		t.Errorf("layer 14 reuses layer 1's primes: %d", mods14[0][0])
	}
}

func offsetOf(mods [][]int64, j int) int64 {
	var off int64
	for _, m := range slices.Concat(mods...)[:j] {
		off += m
	}
	return off
}

func TestHashProperties(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, name := range PresetNames() {
		g, _ := Preset(name)
		h, err := NewHasher(g)
		if err != nil {
			t.Fatal(err)
		}
		per := g.HashesPerToken()
		for _, l := range g.LayerIDs {
			mods, _ := h.Moduli(l)
			flat := slices.Concat(mods...)
			batch := make([][]int64, 4)
			for b := range batch {
				batch[b] = make([]int64, 50)
				for i := range batch[b] {
					batch[b][i] = rng.Int64N(g.Vocab)
				}
			}
			all, err := h.HashBatch(nil, l, batch)
			if err != nil {
				t.Fatal(err)
			}
			if len(all) != 4*50*per {
				t.Fatalf("%d rows for 200 tokens × %d", len(all), per)
			}
			total, _ := h.Rows(l)
			// Order-major: head j of every token lands in head j's slice of
			// the table, [offset_j, offset_j + modulus_j).
			for i, row := range all {
				j := i % per
				lo := offsetOf(mods, j)
				if row < lo || row >= lo+flat[j] || row >= total {
					t.Fatalf("%s layer %d: row %d of head %d outside [%d, %d)", name, l, row, j, lo, lo+flat[j])
				}
			}
			// A batch equals its sequences one by one, and a sequence equals
			// its decode steps one by one with history.
			for b, seq := range batch {
				one, _ := h.Hash(nil, l, nil, seq)
				if !slices.Equal(one, all[b*50*per:(b+1)*50*per]) {
					t.Fatalf("%s: sequence %d hashed alone differs from the batch", name, b)
				}
				var steps []int64
				for i := range seq {
					steps, err = h.Hash(steps, l, seq[:i], seq[i:i+1])
					if err != nil {
						t.Fatal(err)
					}
				}
				if !slices.Equal(steps, one) {
					t.Fatalf("%s: decode steps with history differ from prefill", name)
				}
			}
		}
	}
}

func TestBadInput(t *testing.T) {
	g, _ := Preset("demo")
	h, err := NewHasher(g)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name         string
		layer        int
		history, ids []int64
		want         error
	}{
		{"negative id", 1, nil, []int64{3, -1}, ErrInput},
		{"id = V", 1, nil, []int64{g.Vocab}, ErrInput},
		{"bad history", 1, []int64{1 << 40}, []int64{1}, ErrInput},
		{"unknown layer", 2, nil, []int64{1}, ErrInput},
	} {
		if _, err := h.Hash(nil, tc.layer, tc.history, tc.ids); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	ok := g
	for _, tc := range []struct {
		name string
		edit func(*Geometry)
	}{
		{"zero heads", func(g *Geometry) { g.Heads = 0 }},
		{"no layers", func(g *Geometry) { g.LayerIDs = nil }},
		{"repeated layer", func(g *Geometry) { g.LayerIDs = []int{1, 1} }},
		{"max_ngram 1", func(g *Geometry) { g.MaxNgram = 1 }},
		{"base sizes vs orders", func(g *Geometry) { g.BaseSizes = []int64{100} }},
		{"zero vocab", func(g *Geometry) { g.Vocab = 0 }},
		{"pad outside vocab", func(g *Geometry) { g.PadID = g.Vocab }},
		{"negative seed", func(g *Geometry) { g.Seed = -1 }},
		{"seed overflow", func(g *Geometry) { g.Seed = 1<<63 - 100 }},
		{"table overflows", func(g *Geometry) { g.BaseSizes = []int64{1 << 56, 1 << 56}; g.RowBytes = 1 << 20 }},
		{"zero row", func(g *Geometry) { g.RowBytes = 0 }},
	} {
		bad := ok
		bad.LayerIDs = slices.Clone(ok.LayerIDs)
		tc.edit(&bad)
		if _, err := NewHasher(bad); !errors.Is(err, ErrGeometry) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if _, err := Preset("nope"); !errors.Is(err, ErrGeometry) {
		t.Errorf("unknown preset: %v", err)
	}
}

func TestIsPrime(t *testing.T) {
	// Against trial division below 10^5, and known large cases.
	for n := uint64(0); n < 100000; n++ {
		want := n >= 2
		for d := uint64(2); d*d <= n; d++ {
			if n%d == 0 {
				want = false
				break
			}
		}
		if isPrime(n) != want {
			t.Fatalf("isPrime(%d) = %v", n, !want)
		}
	}
	for n, want := range map[uint64]bool{
		16000057: true, 9223372036854775783: true, 9223372036854775807: false,
		3215031751: false /* strong pseudoprime to 2,3,5,7 */, 18446744073709551557: true,
	} {
		if isPrime(n) != want {
			t.Errorf("isPrime(%d) != %v", n, want)
		}
	}
}

func FuzzHash(f *testing.F) {
	f.Add(int64(0), int64(1), int64(2), 1)
	f.Fuzz(func(t *testing.T, a, b, c int64, layer int) {
		g, _ := Preset("v4.1-flash")
		h, err := NewHasher(g)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := h.Hash(nil, layer, []int64{a}, []int64{b, c})
		if err != nil {
			return // invalid ids or layers must be refused, never wrapped
		}
		total, _ := h.Rows(layer)
		for _, r := range rows {
			if r < 0 || r >= total {
				t.Fatalf("row %d outside [0, %d)", r, total)
			}
		}
	})
}
