package engram

import (
	"fmt"
	"os"
	"strings"

	"github.com/cxltier/cxltier/internal/safetensors"
)

// safetensorsDType names the safetensors dtype of a geometry dtype where
// the two must agree; geometry dtypes not listed (e.g. "fp8+scales", rows
// that pack values and scales) are checked by row size only.
var safetensorsDType = map[string]string{
	"float32": "F32", "fp32": "F32", "float16": "F16", "fp16": "F16", "bfloat16": "BF16", "bf16": "BF16",
	"float8_e4m3": "F8_E4M3", "fp8": "F8_E4M3", "int8": "I8", "uint8": "U8",
}

// SafetensorsFill returns a fill function reading rows from tensor (empty:
// the file's only tensor) of a safetensors file, after checking that the
// tensor is rows × rowBytes and, where the geometry's dtype names one,
// of that dtype.
func SafetensorsFill(path, tensor string, rows, rowBytes int64, dtype string) (fill func(int64, []byte) error, closeFn func() error, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("engram: %w", err)
	}
	fail := func(err error) (func(int64, []byte) error, func() error, error) {
		f.Close()
		return nil, nil, err
	}
	st, err := f.Stat()
	if err != nil {
		return fail(err)
	}
	ts, err := safetensors.Read(f, st.Size())
	if err != nil {
		return fail(fmt.Errorf("engram: %s: %w", path, err))
	}
	t, err := pickTensor(path, ts, tensor)
	if err != nil {
		return fail(err)
	}
	if want, ok := safetensorsDType[strings.ToLower(dtype)]; ok && t.DType != want {
		return fail(fmt.Errorf("%w: %s: tensor %q is %s, the geometry's dtype %q is %s", ErrTable, path, t.Name, t.DType, dtype, want))
	}
	if t.Rows() != rows || t.RowBytes() != rowBytes {
		return fail(fmt.Errorf("%w: %s: tensor %q is %v %s (%d rows of %d B); the table needs %d rows of %d B",
			ErrTable, path, t.Name, t.Shape, t.DType, t.Rows(), t.RowBytes(), rows, rowBytes))
	}
	br := &readerAt{f: f}
	return func(i int64, b []byte) error { return br.read(b, t.Offset+i*rowBytes) }, f.Close, nil
}

func pickTensor(path string, ts []safetensors.Tensor, name string) (safetensors.Tensor, error) {
	var names []string
	for _, t := range ts {
		if t.Name == name || (name == "" && len(ts) == 1) {
			return t, nil
		}
		names = append(names, t.Name)
	}
	if name == "" {
		return safetensors.Tensor{}, fmt.Errorf("%w: %s holds %d tensors %v: name one", ErrTable, path, len(ts), names)
	}
	return safetensors.Tensor{}, fmt.Errorf("%w: %s has no tensor %q (has %v)", ErrTable, path, name, names)
}
