package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
)

// file builds a safetensors file from a JSON header and data.
func file(header string, data []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(header)))
	b.WriteString(header)
	b.Write(data)
	return b.Bytes()
}

func TestRead(t *testing.T) {
	raw := file(`{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[3,2],"data_offsets":[0,12]},"a":{"dtype":"F32","shape":[],"data_offsets":[12,16]}}`, make([]byte, 16))
	ts, err := Read(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	hdr := int64(len(raw) - 16)
	if len(ts) != 2 || ts[0].Name != "a" || ts[1].Name != "b" || ts[1].Offset != hdr || ts[1].Rows() != 3 || ts[1].RowBytes() != 4 ||
		ts[0].Offset != hdr+12 || ts[0].Rows() != 1 || ts[0].Bytes != 4 {
		t.Fatalf("tensors %+v", ts)
	}
	for _, tc := range []struct {
		name string
		raw  []byte
	}{
		{"short", []byte{1, 2, 3}},
		{"header past the end", file(`{}`, nil)[:9]},
		{"not json", file(`{"a":`, nil)},
		{"unknown dtype", file(`{"a":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}`, make([]byte, 1))},
		{"bytes mismatch", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, make([]byte, 8))},
		{"past data", file(`{"a":{"dtype":"U8","shape":[9],"data_offsets":[0,9]}}`, make([]byte, 8))},
		{"negative dim", file(`{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}`, nil)},
		{"overflow", file(`{"a":{"dtype":"F64","shape":[4611686018427387904,4],"data_offsets":[0,0]}}`, nil)},
		{"reversed offsets", file(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, make([]byte, 4))},
		{"one offset", file(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[0]}}`, nil)},
	} {
		if _, err := Read(bytes.NewReader(tc.raw), int64(len(tc.raw))); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// FuzzRead: any bytes give tensors that lie inside the file with sizes that
// match their shapes, or ErrFormat; never a panic.
func FuzzRead(f *testing.F) {
	f.Add(file(`{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}`, make([]byte, 16)))
	f.Add(file(`{"__metadata__":{},"x":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]}}`, make([]byte, 2)))
	f.Fuzz(func(t *testing.T, raw []byte) {
		ts, err := Read(bytes.NewReader(raw), int64(len(raw)))
		if err != nil {
			return
		}
		for _, x := range ts {
			if x.Offset < 8 || x.Offset+x.Bytes > int64(len(raw)) || x.Bytes < 0 {
				t.Fatalf("tensor %+v outside a %d-byte file", x, len(raw))
			}
		}
	})
}
