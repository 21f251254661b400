// Package safetensors reads the header of a safetensors file (an 8-byte
// little-endian length, a JSON object naming each tensor's dtype, shape and
// byte range, then the data) and checks it against the file, so callers can
// read a tensor's bytes straight from the file by offset.
package safetensors

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"sort"
)

// ErrFormat reports a file that is not a well-formed safetensors file.
var ErrFormat = errors.New("safetensors: malformed file")

// maxHeader bounds the JSON header (the format's reference reader allows
// 100 MB).
const maxHeader = 100 << 20

// Tensor is one tensor of a file; Offset is where its bytes start in the
// file (not in the data section).
type Tensor struct {
	Name   string
	DType  string
	Shape  []int64
	Offset int64
	Bytes  int64
}

// Rows is the first dimension (1 for a scalar), RowBytes the bytes of one
// row: the tensor seen as a row-major table.
func (t Tensor) Rows() int64 {
	if len(t.Shape) == 0 {
		return 1
	}
	return t.Shape[0]
}

// RowBytes is Bytes / Rows (0 for an empty tensor).
func (t Tensor) RowBytes() int64 {
	if t.Rows() == 0 {
		return 0
	}
	return t.Bytes / t.Rows()
}

// DTypeSize is the size in bytes of each safetensors dtype.
var DTypeSize = map[string]int64{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

type entry struct {
	DType   string  `json:"dtype"`
	Shape   []int64 `json:"shape"`
	Offsets []int64 `json:"data_offsets"`
}

// Read reads and checks the header of a file of size bytes.
func Read(r io.ReaderAt, size int64) ([]Tensor, error) {
	var n [8]byte
	if size < 8 {
		return nil, fmt.Errorf("%w: %d bytes, shorter than the length prefix", ErrFormat, size)
	}
	if _, err := r.ReadAt(n[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors: read header length: %w", err)
	}
	hlen := binary.LittleEndian.Uint64(n[:])
	if hlen > maxHeader || int64(hlen) > size-8 {
		return nil, fmt.Errorf("%w: header of %d bytes in a %d-byte file", ErrFormat, hlen, size)
	}
	raw := make([]byte, hlen)
	if _, err := r.ReadAt(raw, 8); err != nil {
		return nil, fmt.Errorf("safetensors: read header: %w", err)
	}
	return Parse(raw, 8+int64(hlen), size)
}

// Parse checks a JSON header whose data section spans [dataStart, fileSize).
func Parse(raw []byte, dataStart, fileSize int64) ([]Tensor, error) {
	var all map[string]json.RawMessage
	if err := json.Unmarshal(raw, &all); err != nil {
		return nil, fmt.Errorf("%w: header: %v", ErrFormat, err)
	}
	dataLen := fileSize - dataStart
	var out []Tensor
	for name, msg := range all {
		if name == "__metadata__" {
			continue
		}
		var e entry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, fmt.Errorf("%w: tensor %q: %v", ErrFormat, name, err)
		}
		t, err := check(name, e, dataLen)
		if err != nil {
			return nil, err
		}
		t.Offset += dataStart
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func check(name string, e entry, dataLen int64) (Tensor, error) {
	size, ok := DTypeSize[e.DType]
	if !ok {
		return Tensor{}, fmt.Errorf("%w: tensor %q: unknown dtype %q", ErrFormat, name, e.DType)
	}
	if len(e.Offsets) != 2 || e.Offsets[0] < 0 || e.Offsets[1] < e.Offsets[0] || e.Offsets[1] > dataLen {
		return Tensor{}, fmt.Errorf("%w: tensor %q: data_offsets %v outside the %d-byte data", ErrFormat, name, e.Offsets, dataLen)
	}
	n := uint64(size)
	for _, d := range e.Shape {
		if d < 0 {
			return Tensor{}, fmt.Errorf("%w: tensor %q: negative dimension in %v", ErrFormat, name, e.Shape)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > 1<<62 {
			return Tensor{}, fmt.Errorf("%w: tensor %q: shape %v overflows", ErrFormat, name, e.Shape)
		}
		n = lo
	}
	if int64(n) != e.Offsets[1]-e.Offsets[0] {
		return Tensor{}, fmt.Errorf("%w: tensor %q: %s%v needs %d bytes, data_offsets give %d",
			ErrFormat, name, e.DType, e.Shape, n, e.Offsets[1]-e.Offsets[0])
	}
	return Tensor{Name: name, DType: e.DType, Shape: e.Shape, Offset: e.Offsets[0], Bytes: int64(n)}, nil
}
