package engram

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestGeometryFile(t *testing.T) {
	g, _ := Preset("engram-27b")
	raw, _ := json.Marshal(g)
	path := filepath.Join(t.TempDir(), "g.json")
	os.WriteFile(path, raw, 0o600)
	back, err := LoadGeometry(path)
	if err != nil || back.Name != g.Name || back.BaseSizes[1] != g.BaseSizes[1] {
		t.Fatalf("round trip: %+v, %v", back, err)
	}
	for _, bad := range []string{
		`{"name":"x","layer_ids":[1],"max_ngram":3,"heads_per_order":8,"base_sizes":[10,10],"vocab":5,"row_bytes":4,"seeed":3}`,
		`{"layer_ids":[1],"max_ngram":3,"heads_per_order":0,"base_sizes":[10,10],"vocab":5,"row_bytes":4}`,
		`[1,2]`,
		``,
	} {
		if _, err := ParseGeometry([]byte(bad)); !errors.Is(err, ErrGeometry) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func FuzzParseGeometry(f *testing.F) {
	for _, name := range PresetNames() {
		g, _ := Preset(name)
		raw, _ := json.Marshal(g)
		f.Add(raw)
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		g, err := ParseGeometry(raw)
		if err != nil {
			if !errors.Is(err, ErrGeometry) {
				t.Fatalf("error without ErrGeometry: %v", err)
			}
			return
		}
		if len(g.BaseSizes) != g.MaxNgram-1 || g.Heads < 1 || g.PadID >= g.Vocab {
			t.Fatalf("invalid geometry accepted: %+v", g)
		}
	})
}
