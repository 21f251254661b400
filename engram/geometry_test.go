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
		// The same key twice: decoding keeps the last, so the hash would
		// change silently.
		string(raw[:len(raw)-1]) + `,"seed":99}`,
		string(raw) + ` {}`, // trailing data
		string(raw) + `x`,
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

// TestLookupOnlyRegularFiles: a lookup path naming a device or a file
// beyond any vocabulary is refused, not read forever.
func TestLookupOnlyRegularFiles(t *testing.T) {
	g, _ := Preset("demo")
	for _, path := range []string{"/dev/zero", t.TempDir()} {
		g.Lookup = path
		if _, err := LoadCompressor(g); !errors.Is(err, ErrGeometry) {
			t.Errorf("lookup %s: %v", path, err)
		}
	}
	big := filepath.Join(t.TempDir(), "big")
	f, _ := os.Create(big)
	f.Truncate(maxLookupBytes + 8)
	f.Close()
	g.Lookup = big
	if _, err := LoadCompressor(g); !errors.Is(err, ErrGeometry) {
		t.Errorf("a %d-byte lookup: %v", maxLookupBytes+8, err)
	}
}
