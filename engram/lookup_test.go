package engram

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func writeLookup(t testing.TB, dir string, table []int64) string {
	t.Helper()
	raw := make([]byte, 8*len(table))
	for i, v := range table {
		binary.LittleEndian.PutUint64(raw[8*i:], uint64(v))
	}
	path := filepath.Join(dir, "lookup.bin")
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCompressorMapsAndRefuses(t *testing.T) {
	c, err := NewCompressor([]int64{4, 0, 2, 2, 1}, 5)
	if err != nil {
		t.Fatal(err)
	}
	ids := []int64{0, 4, 2, 3, 1}
	if err := c.Compress(ids, ids); err != nil {
		t.Fatal(err)
	}
	if want := []int64{4, 1, 2, 2, 0}; !slices.Equal(ids, want) {
		t.Fatalf("compressed %v, want %v", ids, want)
	}
	for _, tc := range []struct {
		name string
		raw  []int64
	}{{"beyond the table", []int64{1, 5}}, {"negative", []int64{-1}}} {
		t.Run(tc.name, func(t *testing.T) {
			dst := []int64{7, 7}[:len(tc.raw)]
			err := c.Compress(dst, tc.raw)
			if !errors.Is(err, ErrInput) {
				t.Fatalf("got %v, want ErrInput", err)
			}
			if dst[0] != 7 {
				t.Fatalf("a refused call changed the output: %v", dst)
			}
		})
	}
	if err := c.Compress(make([]int64, 1), []int64{1, 2}); !errors.Is(err, ErrInput) {
		t.Fatalf("mis-sized output: %v", err)
	}
}

func TestNewCompressorRefusesBadTables(t *testing.T) {
	for _, tc := range []struct {
		name  string
		table []int64
	}{{"empty", nil}, {"entry at vocab", []int64{0, 5}}, {"negative entry", []int64{-1}}} {
		if _, err := NewCompressor(tc.table, 5); !errors.Is(err, ErrGeometry) {
			t.Errorf("%s: got %v, want ErrGeometry", tc.name, err)
		}
	}
}

func TestLoadGeometryFindsLookupBesideIt(t *testing.T) {
	dir := t.TempDir()
	writeLookup(t, dir, []int64{3, 2, 1, 0})
	g, err := Preset("demo")
	if err != nil {
		t.Fatal(err)
	}
	g.Vocab, g.PadID, g.Lookup = 4, 1, "lookup.bin"
	raw, _ := json.Marshal(g)
	geo := filepath.Join(dir, "geometry.json")
	if err := os.WriteFile(geo, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir()) // the relative path must not depend on the working directory
	g, err = LoadGeometry(geo)
	if err != nil {
		t.Fatal(err)
	}
	c, err := LoadCompressor(g)
	if err != nil {
		t.Fatal(err)
	}
	if c.RawVocab() != 4 {
		t.Fatalf("raw vocabulary %d, want 4", c.RawVocab())
	}
	if err := os.WriteFile(filepath.Join(dir, "lookup.bin"), make([]byte, 12), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCompressor(g); !errors.Is(err, ErrGeometry) {
		t.Fatalf("a 12-byte table: got %v, want ErrGeometry", err)
	}
	g.Lookup = ""
	if _, err := LoadCompressor(g); !errors.Is(err, ErrGeometry) {
		t.Fatalf("no table: got %v, want ErrGeometry", err)
	}
}

// FuzzCompressor feeds arbitrary table files and ids: loading either refuses
// the table or every id it accepts maps into the vocabulary.
func FuzzCompressor(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, int64(0), int64(3))
	f.Add([]byte{0xff}, int64(-1), int64(1))
	f.Fuzz(func(t *testing.T, file []byte, id, vocab int64) {
		dir := t.TempDir()
		path := filepath.Join(dir, "l")
		if err := os.WriteFile(path, file, 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := LoadCompressor(Geometry{Name: "fuzz", Lookup: path, Vocab: vocab})
		if err != nil {
			return
		}
		out := []int64{0}
		if err := c.Compress(out, []int64{id}); err != nil {
			return
		}
		if out[0] < 0 || out[0] >= vocab {
			t.Fatalf("id %d compressed to %d outside [0, %d)", id, out[0], vocab)
		}
	})
}
