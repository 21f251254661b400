package engram

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
)

// maxLookup bounds a raw vocabulary (2^28 ids, a 2 GiB table file).
const maxLookup = 1 << 28

// Compressor maps raw tokenizer ids to the compressed ids the hash takes:
// DeepSeek's reference looks every id up in a tokenizer-derived table
// before hashing, and so must anyone who starts from a model's input ids.
type Compressor struct {
	table []int64
	vocab int64
}

// NewCompressor checks that every entry of table is a compressed id in
// [0, vocab).
func NewCompressor(table []int64, vocab int64) (*Compressor, error) {
	if len(table) == 0 || len(table) > maxLookup {
		return nil, fmt.Errorf("%w: lookup table of %d ids (want 1 to %d)", ErrGeometry, len(table), maxLookup)
	}
	for i, v := range table {
		if v < 0 || v >= vocab {
			return nil, fmt.Errorf("%w: lookup entry %d is %d, outside the compressed vocabulary [0, %d)", ErrGeometry, i, v, vocab)
		}
	}
	return &Compressor{table: table, vocab: vocab}, nil
}

// LoadCompressor reads g's lookup file: little-endian int64, one per raw id.
func LoadCompressor(g Geometry) (*Compressor, error) {
	if g.Lookup == "" {
		return nil, fmt.Errorf("%w: geometry %q has no lookup table", ErrGeometry, g.Name)
	}
	raw, err := readLookup(g.Lookup)
	if err != nil {
		return nil, err
	}
	if len(raw)%8 != 0 {
		return nil, fmt.Errorf("%w: lookup table %s has %d bytes, not a whole number of int64", ErrGeometry, g.Lookup, len(raw))
	}
	table := make([]int64, len(raw)/8)
	for i := range table {
		table[i] = int64(binary.LittleEndian.Uint64(raw[8*i:]))
	}
	c, err := NewCompressor(table, g.Vocab)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", g.Lookup, err)
	}
	return c, nil
}

// maxLookupBytes bounds a lookup table: 8 M raw ids, far beyond any
// tokenizer, so that a path naming a device (/dev/zero) or a huge file is
// refused instead of read forever.
const maxLookupBytes = 64 << 20

// readLookup reads a lookup file that must be a regular file of at most
// maxLookupBytes.
func readLookup(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("engram: lookup table: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("engram: lookup table: %w", err)
	}
	if !st.Mode().IsRegular() || st.Size() > maxLookupBytes {
		return nil, fmt.Errorf("%w: lookup table %s: want a regular file of at most %d bytes (%v, %d bytes)", ErrGeometry, path, maxLookupBytes, st.Mode().Type(), st.Size())
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxLookupBytes+1))
	if err != nil {
		return nil, fmt.Errorf("engram: lookup table: %w", err)
	}
	if len(raw) > maxLookupBytes {
		return nil, fmt.Errorf("%w: lookup table %s grew past %d bytes while read", ErrGeometry, path, maxLookupBytes)
	}
	return raw, nil
}

// RawVocab is the number of raw ids the table maps.
func (c *Compressor) RawVocab() int { return len(c.table) }

// Compress writes the compressed id of each raw id to dst (len(raw) long;
// dst may be raw itself). An id outside the table is an error naming its
// position, and dst is then left unchanged.
func (c *Compressor) Compress(dst, raw []int64) error {
	if len(dst) != len(raw) {
		return fmt.Errorf("%w: %d outputs for %d ids", ErrInput, len(dst), len(raw))
	}
	for i, r := range raw {
		if r < 0 || r >= int64(len(c.table)) {
			return fmt.Errorf("%w: raw id %d at position %d outside [0, %d)", ErrInput, r, i, len(c.table))
		}
	}
	for i, r := range raw {
		dst[i] = c.table[r]
	}
	return nil
}
