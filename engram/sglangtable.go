package engram

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"time"

	"github.com/cxltier/cxltier/internal/safetensors"
	"github.com/cxltier/cxltier/tier"
)

// SGLang 0.5.23 keeps each DeepSeek-V4.1 Engram layer as one host table of
// two planes, the fp8 e4m3 rows [n, dim] followed by their e8m0 block
// scales [n, dim/32], and the Python package (cxltier.sglang.engram_host) puts
// that table in a named tier object. This file loads the same objects from
// a checkpoint, so that an operator fills a node's tables once, before any
// server starts, and every server then attaches them as they are.

// SGLangScaleBlock is the number of fp8 values one e8m0 scale covers.
const SGLangScaleBlock = 32

// SGLangTableName is the tier object of model's table for layer in the
// shared layout (HostTableName, which the Python package calls too).
func SGLangTableName(model string, layer int) string {
	return HostTableName(model, fmt.Sprintf("sglang_engram_%d", layer), 0, 1)
}

// SGLangLayer is one layer's two tensors in a checkpoint.
type SGLangLayer struct {
	Layer                 int
	Rows, Dim, ScaleCols  int64
	WeightFile, ScaleFile string
	Weight, Scale         safetensors.Tensor
}

// Bytes is the size of the layer's host table: both planes.
func (l SGLangLayer) Bytes() int64 { return l.Rows*l.Dim + l.Rows*l.ScaleCols }

var sglangTensor = regexp.MustCompile(`(?:^|\.)layers\.(\d+)\.engram\.embed\.(weight|scale)$`)

// FindSGLangLayers finds every Engram layer of a V4.1 checkpoint in files
// (safetensors, any number: a checkpoint is sharded), each layer being
// `layers.N.engram.embed.weight` (F8_E4M3 [rows, dim]) and
// `layers.N.engram.embed.scale` (F8_E8M0 [rows, dim/32]), and checks their
// shapes against each other. Layers come back in layer order.
func FindSGLangLayers(files []string) ([]SGLangLayer, error) {
	byLayer := map[int]*SGLangLayer{}
	for _, path := range files {
		ts, err := readTensors(path)
		if err != nil {
			return nil, err
		}
		for _, t := range ts {
			m := sglangTensor.FindStringSubmatch(t.Name)
			if m == nil {
				continue
			}
			id, err := strconv.Atoi(m[1])
			if err != nil || id > 1<<20 {
				return nil, fmt.Errorf("%w: %s: tensor %q: layer id out of range", ErrTable, path, t.Name)
			}
			l := byLayer[id]
			if l == nil {
				l = &SGLangLayer{Layer: id}
				byLayer[id] = l
			}
			if m[2] == "weight" {
				l.Weight, l.WeightFile = t, path
			} else {
				l.Scale, l.ScaleFile = t, path
			}
		}
	}
	if len(byLayer) == 0 {
		return nil, fmt.Errorf("%w: no tensor named layers.N.engram.embed.weight/scale in %v (not a DeepSeek-V4.1 Engram checkpoint)", ErrTable, files)
	}
	out := make([]SGLangLayer, 0, len(byLayer))
	for _, l := range byLayer {
		if err := l.check(); err != nil {
			return nil, err
		}
		out = append(out, *l)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Layer < out[j].Layer })
	return out, nil
}

func readTensors(path string) ([]safetensors.Tensor, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("engram: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("engram: %w", err)
	}
	ts, err := safetensors.Read(f, st.Size())
	if err != nil {
		return nil, fmt.Errorf("engram: %s: %w", path, err)
	}
	return ts, nil
}

func (l *SGLangLayer) check() error {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("%w: Engram layer %d: %s", ErrTable, l.Layer, fmt.Sprintf(f, a...))
	}
	switch {
	case l.WeightFile == "":
		return bad("layers.%d.engram.embed.scale has no weight tensor beside it", l.Layer)
	case l.ScaleFile == "":
		return bad("layers.%d.engram.embed.weight has no scale tensor beside it", l.Layer)
	case l.Weight.DType != "F8_E4M3" || len(l.Weight.Shape) != 2:
		return bad("weight is %s %v, not F8_E4M3 [rows, dim]", l.Weight.DType, l.Weight.Shape)
	case l.Scale.DType != "F8_E8M0" || len(l.Scale.Shape) != 2:
		return bad("scale is %s %v, not F8_E8M0 [rows, dim/%d]", l.Scale.DType, l.Scale.Shape, SGLangScaleBlock)
	}
	l.Rows, l.Dim, l.ScaleCols = l.Weight.Shape[0], l.Weight.Shape[1], l.Scale.Shape[1]
	switch {
	case l.Rows <= 0 || l.Dim <= 0 || l.Dim%SGLangScaleBlock != 0:
		return bad("weight shape %v: rows and a dim that is a multiple of %d needed", l.Weight.Shape, SGLangScaleBlock)
	case l.Scale.Shape[0] != l.Rows || l.ScaleCols != l.Dim/SGLangScaleBlock:
		return bad("scale shape %v does not match weight %v (want [%d, %d])", l.Scale.Shape, l.Weight.Shape, l.Rows, l.Dim/SGLangScaleBlock)
	}
	return nil
}

// LoadSGLangLayer writes layer l into model's table object in the tier,
// creating it (contiguous: SGLang reads it through one pointer) and sealing
// it with a checksum and the checkpoint's name. A table sealed already at
// this size is left alone (loaded false) unless force; a table of another
// size under the name is refused. Progress goes to progress (nil: silent).
func LoadSGLangLayer(c *tier.Client, model string, l SGLangLayer, force bool, progress io.Writer) (o tier.Object, loaded bool, err error) {
	r := c.Region()
	name := SGLangTableName(model, l.Layer)
	o, err = r.OpenObject(name)
	if err != nil && !errors.Is(err, tier.ErrNotFound) {
		if !force || !(errors.Is(err, tier.ErrCorrupt) || errors.Is(err, tier.ErrChecksum)) {
			return o, false, err
		}
		// A damaged table under the name: --force replaces it.
		if err := c.RemoveObject(name, true); err != nil {
			return o, false, err
		}
		err = tier.ErrNotFound
	}
	switch {
	case err == nil && o.Size != l.Bytes():
		return o, false, fmt.Errorf("%w: %s holds %d bytes, layer %d needs %d: another model or geometry under this name (remove it with `cxltier engram destroy`)",
			ErrTable, name, o.Size, l.Layer, l.Bytes())
	case err == nil && o.State == tier.ObjectSealed && !force:
		return o, false, sameCheckpoint(o, l)
	case err == nil:
		if o, err = c.UnsealObject(name); err != nil {
			return o, false, err
		}
	default:
		if o, err = c.CreateObject(name, l.Bytes(), tier.ObjectOptions{Contiguous: true}); err != nil {
			return o, false, err
		}
	}
	if err := c.HoldObject(name); err != nil {
		return o, false, err
	}
	defer c.ReleaseObject(name)
	dst, err := r.ObjectBytes(o)
	if err != nil {
		return o, false, err
	}
	p := newCopyProgress(progress, name, l.Bytes())
	if err := copyTensor(dst[:l.Rows*l.Dim], l.WeightFile, l.Weight, p); err != nil {
		return o, false, err
	}
	if err := copyTensor(dst[l.Rows*l.Dim:], l.ScaleFile, l.Scale, p); err != nil {
		return o, false, err
	}
	p.done()
	digest, err := l.Digest()
	if err != nil {
		return o, false, err
	}
	label := fmt.Sprintf("%s layers.%d.engram.embed (%d rows × %d fp8 + %d e8m0) digest %s", filepath.Base(l.WeightFile), l.Layer, l.Rows, l.Dim, l.ScaleCols, digest)
	o, err = c.SealObject(name, label)
	return o, err == nil, err
}

// sameCheckpoint refuses a sealed table that holds another checkpoint's
// layer than l (its seal's digest differs): left as it is, servers of this
// model would read the other checkpoint's rows. A seal without a digest
// (an older loader's) cannot be told apart and passes.
func sameCheckpoint(o tier.Object, l SGLangLayer) error {
	have := LabelDigest(o.Label)
	if have == "" {
		return nil
	}
	want, err := l.Digest()
	if err != nil {
		return err
	}
	if have != want {
		return fmt.Errorf("%w: %s holds checkpoint digest %s (%s), %s has %s: another checkpoint under this model name; "+
			"--force loads this one over it (servers reading it must be stopped), or give this checkpoint its own --model",
			ErrTable, o.Name, have, o.Label, filepath.Base(l.WeightFile), want)
	}
	return nil
}

// copyTensor reads tensor t of file path into dst (exactly its size).
func copyTensor(dst []byte, path string, t safetensors.Tensor, p *copyProgress) error {
	if int64(len(dst)) != t.Bytes {
		return fmt.Errorf("%w: %s: tensor %q is %d bytes, its plane %d", ErrTable, path, t.Name, t.Bytes, len(dst))
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("engram: %w", err)
	}
	defer f.Close()
	const step = 64 << 20
	for at := int64(0); at < t.Bytes; at += step {
		part := dst[at:min(at+step, t.Bytes)]
		if n, err := f.ReadAt(part, t.Offset+at); n != len(part) {
			return fmt.Errorf("%w: %s: tensor %q: short read at %d: %v", ErrTable, path, t.Name, at, err)
		}
		p.add(int64(len(part)))
	}
	return nil
}

// copyProgress prints a line at most once a second.
type copyProgress struct {
	w             io.Writer
	name          string
	total, copied int64
	start, last   time.Time
}

func newCopyProgress(w io.Writer, name string, total int64) *copyProgress {
	now := time.Now()
	return &copyProgress{w: w, name: name, total: total, start: now, last: now}
}

func (p *copyProgress) add(n int64) {
	p.copied += n
	if p.w != nil && time.Since(p.last) > time.Second {
		p.last = time.Now()
		fmt.Fprintf(p.w, "\r%s: %d of %d MiB (%.0f%%) %s", p.name, p.copied>>20, p.total>>20,
			float64(p.copied)*100/float64(p.total), time.Since(p.start).Round(time.Second))
	}
}

func (p *copyProgress) done() {
	if p.w != nil {
		fmt.Fprintf(p.w, "\r%s: %d MiB in %s\n", p.name, p.total>>20, time.Since(p.start).Round(time.Millisecond))
	}
}
