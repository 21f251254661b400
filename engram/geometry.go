package engram

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/cxltier/cxltier/internal/errkind"
)

// ErrGeometry marks an invalid geometry; ErrInput an invalid id or layer.
var (
	ErrGeometry = errkind.New(errkind.Invalid, "engram: invalid geometry")
	ErrInput    = errkind.New(errkind.Invalid, "engram: invalid input")
	ErrTable    = errkind.New(errkind.Invalid, "engram: bad table")
)

// Geometry describes a model's Engram tables. Layer ids, seed and sizes
// seed the hash: they must be those the model was trained with.
type Geometry struct {
	Name      string  `json:"name"`
	LayerIDs  []int   `json:"layer_ids"`
	MaxNgram  int     `json:"max_ngram"`       // highest N-gram order (orders 2..MaxNgram)
	Heads     int     `json:"heads_per_order"` // hash heads per order
	BaseSizes []int64 `json:"base_sizes"`      // engram_vocab_size, one per order
	Seed      int64   `json:"seed"`
	Vocab     int64   `json:"vocab"`            // compressed vocabulary size V
	PadID     int64   `json:"pad_id"`           // compressed pad id (lookup[pad])
	Lookup    string  `json:"lookup,omitempty"` // raw→compressed table: a file of little-endian int64
	RowBytes  int64   `json:"row_bytes"`
	DType     string  `json:"dtype"`
}

// Presets are the geometries of engram.md. V and the pad id are those of
// DeepSeek's compressed tokenizer as engram.md gives them for V4.1; set
// them from your tokenizer's lookup table for other models.
func Presets() map[string]Geometry {
	base := func(name string, layers []int, maxN int, size, row int64, dtype string) Geometry {
		sizes := make([]int64, maxN-1)
		for i := range sizes {
			sizes[i] = size
		}
		return Geometry{Name: name, LayerIDs: layers, MaxNgram: maxN, Heads: 8, BaseSizes: sizes,
			Vocab: 99092, PadID: 2, RowBytes: row, DType: dtype}
	}
	return map[string]Geometry{
		"demo":       base("demo", []int{1, 15}, 3, 646400, 64*4, "float32"),
		"engram-27b": base("engram-27b", []int{2, 15}, 3, 2262400, 80*4, "float32"),
		"engram-40b": base("engram-40b", []int{2, 15}, 3, 7239680, 80*4, "float32"),
		"v4.1-flash": base("v4.1-flash", []int{1, 14}, 4, 16000000, 264, "fp8+scales"),
	}
}

// PresetNames lists the presets in order.
func PresetNames() []string {
	names := make([]string, 0, 4)
	for n := range Presets() {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Preset returns the named preset.
func Preset(name string) (Geometry, error) {
	g, ok := Presets()[name]
	if !ok {
		return g, fmt.Errorf("%w: no preset %q (have %v)", ErrGeometry, name, PresetNames())
	}
	return g, nil
}

// LoadGeometry reads a JSON geometry file and validates it.
func LoadGeometry(path string) (Geometry, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Geometry{}, fmt.Errorf("engram: %w", err)
	}
	g, err := ParseGeometry(raw)
	if err != nil {
		return g, fmt.Errorf("%s: %w", path, err)
	}
	if g.Lookup != "" && !filepath.IsAbs(g.Lookup) {
		g.Lookup = filepath.Join(filepath.Dir(path), g.Lookup) // beside the geometry, wherever it is read from
	}
	return g, nil
}

// ParseGeometry decodes and validates a JSON geometry. Unknown keys are
// refused: a misspelt key would otherwise silently change the hash.
func ParseGeometry(raw []byte) (Geometry, error) {
	var g Geometry
	if err := uniqueKeys(raw); err != nil {
		return g, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		return g, fmt.Errorf("%w: %v", ErrGeometry, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return g, fmt.Errorf("%w: data after the geometry object", ErrGeometry)
	}
	return g, g.Validate()
}

// uniqueKeys refuses a geometry object that names a key twice: JSON
// decoding would keep the last silently, and the hash would change
// without a word (unknown keys are refused for the same reason).
func uniqueKeys(raw []byte) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil // not an object: Decode reports it
	}
	seen := map[string]bool{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		key, _ := t.(string)
		if seen[key] {
			return fmt.Errorf("%w: key %q appears twice", ErrGeometry, key)
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
}

// Validate checks every field and every size the hash and tables derive
// from them against int64 overflow.
func (g Geometry) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s", ErrGeometry, fmt.Sprintf(format, a...))
	}
	switch {
	case g.Name == "" || strings.ContainsAny(g.Name, "/ ") || len(g.Name) > 64:
		return bad("name %q: want a short name without spaces or slashes (tables are stored as engram/NAME/layerN)", g.Name)
	case len(g.LayerIDs) == 0:
		return bad("no layer ids")
	case g.MaxNgram < 2 || g.MaxNgram > 16:
		return bad("max_ngram %d outside [2, 16]", g.MaxNgram)
	case g.Heads < 1 || g.Heads > 1024:
		return bad("heads_per_order %d outside [1, 1024]", g.Heads)
	case len(g.BaseSizes) != g.MaxNgram-1:
		return bad("%d base sizes for orders 2..%d (want %d)", len(g.BaseSizes), g.MaxNgram, g.MaxNgram-1)
	case g.Vocab < 1:
		return bad("vocab %d must be positive", g.Vocab)
	case g.PadID < 0 || g.PadID >= g.Vocab:
		return bad("pad_id %d outside [0, %d)", g.PadID, g.Vocab)
	case g.Seed < 0:
		return bad("seed %d is negative (numpy refuses it)", g.Seed)
	case g.RowBytes <= 0:
		return bad("row_bytes %d must be positive", g.RowBytes)
	}
	seen := map[int]bool{}
	for i, l := range g.LayerIDs {
		if l < 0 || seen[l] {
			return bad("layer id %d at position %d is negative or repeated", l, i)
		}
		seen[l] = true
		if int64(l) > (math.MaxInt64-g.Seed)/10007 {
			return bad("seed + 10007*layer overflows for layer %d", l)
		}
	}
	for i, b := range g.BaseSizes {
		if b < 2 || b > 1<<56 {
			return bad("base size %d of order %d outside [2, 2^56]", b, i+2)
		}
	}
	// Each layer's table holds heads*(MaxNgram-1) moduli, each a little
	// above its base size; bound the sum and the bytes with room to spare.
	var rows float64
	for _, b := range g.BaseSizes {
		rows += float64(g.Heads) * (float64(b) * 1.01)
	}
	if rows*float64(g.RowBytes) > math.MaxInt64/2 {
		return bad("a layer's table (%.3g rows of %d bytes) overflows int64", rows, g.RowBytes)
	}
	return nil
}

// HasLayer reports whether layer is one of g's Engram layers.
func (g Geometry) HasLayer(layer int) bool { return slices.Contains(g.LayerIDs, layer) }

// HashesPerToken is how many rows one token reads per layer.
func (g Geometry) HashesPerToken() int { return (g.MaxNgram - 1) * g.Heads }
