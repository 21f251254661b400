package engram

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/cxltier/cxltier/internal/safetensors"
)

// A sealed table says which checkpoint it holds, so that a server of a
// revised checkpoint of the same geometry, or of another model whose path
// ends alike, does not attach it as its own: the seal's label carries the
// layer's digest ("digest <16 hex>"), made here for the CLI's loads and,
// through cxl_engram_checkpoint_digest, for the Python package's.

// digestWindow is the bytes sampled at each end and the middle of a plane.
const digestWindow = 64 << 10

// Digest identifies the checkpoint l was read from: the layer, both
// tensors' dtypes and shapes, and their bytes at the start, middle and end
// of each plane (64 KiB each). Reading them costs a few hundred KiB however
// large the table; a revision that changes no sampled byte is not told apart.
func (l SGLangLayer) Digest() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "cxltier-engram-checkpoint-v1 layer %d\n", l.Layer)
	for _, p := range []struct {
		path string
		t    safetensors.Tensor
	}{{l.WeightFile, l.Weight}, {l.ScaleFile, l.Scale}} {
		fmt.Fprintf(h, "%s %v %d\n", p.t.DType, p.t.Shape, p.t.Bytes)
		if err := sample(h, p.path, p.t); err != nil {
			return "", err
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func sample(h interface{ Write([]byte) (int, error) }, path string, t safetensors.Tensor) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("engram: digest: %w", err)
	}
	defer f.Close()
	buf := make([]byte, min(digestWindow, t.Bytes))
	for _, at := range []int64{0, t.Bytes/2 - int64(len(buf))/2, t.Bytes - int64(len(buf))} {
		at = max(0, at)
		if n, err := f.ReadAt(buf, t.Offset+at); n != len(buf) {
			return fmt.Errorf("%w: %s: tensor %q: short read at %d: %v", ErrTable, path, t.Name, at, err)
		}
		var pos [8]byte
		binary.LittleEndian.PutUint64(pos[:], uint64(at))
		h.Write(pos[:])
		h.Write(buf)
	}
	return nil
}

// CheckpointFiles lists a checkpoint's safetensors files: those named (a
// comma-separated list) or, for a folder, every *.safetensors in it.
func CheckpointFiles(spec string) ([]string, error) {
	var files []string
	for _, p := range strings.Split(spec, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("engram: checkpoint: %w", err)
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		more, err := filepath.Glob(filepath.Join(p, "*.safetensors"))
		if err != nil {
			return nil, fmt.Errorf("engram: checkpoint %s: %w", p, err)
		}
		if len(more) == 0 {
			return nil, fmt.Errorf("engram: checkpoint: %s has no .safetensors files", p)
		}
		files = append(files, more...)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("engram: checkpoint %q: no .safetensors files", spec)
	}
	sort.Strings(files)
	return files, nil
}

var labelDigest = regexp.MustCompile(`\bdigest ([0-9a-f]{16})\b`)

// LabelDigest is the checkpoint digest a seal's label records ("" when it
// records none: a table sealed before digests, or by another tool).
func LabelDigest(label string) string {
	if m := labelDigest.FindStringSubmatch(label); m != nil {
		return m[1]
	}
	return ""
}
