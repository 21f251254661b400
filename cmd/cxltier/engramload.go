package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/internal/tierflags"
)

func engramLoad(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("engram load", stderr, "--preset NAME|--config FILE --layer L (--file PATH [--tensor NAME] | --synthetic) DEVICE...\n"+
		"       cxltier engram load --model NAME --file CHECKPOINT[,CHECKPOINT...|DIR] [--layer L] [--force] DEVICE...   (DeepSeek-V4.1: SGLang's host tables)")
	gf := addGeometryFlags(fs)
	file := fs.String("file", "", "rows to load: a raw row-major file, or a .safetensors file; for a V4.1 checkpoint, its files (comma-separated) or folder")
	tensor := fs.String("tensor", "", "the tensor to load from a safetensors file (default: its only one)")
	synthetic := fs.Bool("synthetic", false, "fill the table with synthetic rows (tests and demos)")
	model := fs.String("model", "", "V4.1 checkpoints: the model name SGLang's tables go under (its CXLTIER_ENGRAM_MODEL, default the model path's last component)")
	force := fs.Bool("force", false, "V4.1 checkpoints: load tables that are sealed already again")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *model != "" || (*file != "" && *gf.preset == "" && *gf.config == "") {
		return engramLoadSGLang(fs, *file, *model, *gf.layer, *force, stdout, stderr)
	}
	if (*file == "") == !*synthetic {
		return errors.New("give exactly one of --file and --synthetic")
	}
	h, err := gf.hasher()
	if err != nil {
		return err
	}
	g, layer := h.Geometry(), *gf.layer
	rows, err := h.Rows(layer)
	if err != nil {
		return err
	}
	fill := func(i int64, b []byte) error { engram.SyntheticRow(layer, i, b); return nil }
	if *file != "" {
		var closeFn func() error
		if strings.HasSuffix(*file, ".safetensors") {
			fill, closeFn, err = engram.SafetensorsFill(*file, *tensor, rows, g.RowBytes, g.DType)
		} else {
			fill, closeFn, err = engram.RawFileFill(*file, rows, g.RowBytes)
		}
		if err != nil {
			return err
		}
		defer closeFn()
	}
	c, done, err := tierArgs(fs)
	if err != nil {
		return err
	}
	defer done()
	fmt.Fprintf(stderr, "loading %s: %d rows × %d B (%s)\n", engram.TableName(g, layer), rows, g.RowBytes, tierflags.HumanSize(rows*g.RowBytes))
	t, err := engram.CreateTable(c, g, h, layer, fill, stderr)
	if err != nil {
		return err
	}
	// Read it back from the tier: what readers will see is what was loaded.
	if _, err := engram.OpenTable(c.Region(), g, h, layer, true); err != nil {
		return fmt.Errorf("verify after load: %w", err)
	}
	fmt.Fprintf(stdout, "loaded %s: %d rows × %d B, crc32c %08x, verified\n", t.Name, t.Rows, t.RowBytes, t.CRC)
	return nil
}

func engramVerify(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("engram verify", stderr, "--preset NAME|--config FILE --layer L DEVICE...")
	gf := addGeometryFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	h, err := gf.hasher()
	if err != nil {
		return err
	}
	c, done, err := tierArgs(fs)
	if err != nil {
		return err
	}
	defer done()
	t, err := engram.OpenTable(c.Region(), h.Geometry(), h, *gf.layer, true)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %d rows × %d B, crc32c %08x, ok\n", t.Name, t.Rows, t.RowBytes, t.CRC)
	return nil
}

// engramLoadSGLang loads a DeepSeek-V4.1 checkpoint's Engram layers into
// the named tables SGLang's host table (cxltier.sglang.engram_host) attaches.
func engramLoadSGLang(fs *flag.FlagSet, file, model string, layer int, force bool, stdout, stderr io.Writer) error {
	if model == "" {
		return errors.New("a V4.1 checkpoint loads into SGLang's host tables: name the model with --model (what servers set as CXLTIER_ENGRAM_MODEL, or their model path's last component)")
	}
	if file == "" {
		return errors.New("--model needs --file: the checkpoint's .safetensors files or its folder")
	}
	files, err := engram.CheckpointFiles(file)
	if err != nil {
		return err
	}
	layers, err := engram.FindSGLangLayers(files)
	if err != nil {
		return err
	}
	c, done, err := tierArgs(fs)
	if err != nil {
		return err
	}
	defer done()
	found := 0
	for _, l := range layers {
		if layer >= 0 && l.Layer != layer {
			continue
		}
		found++
		fmt.Fprintf(stderr, "layer %d: %d rows × (%d fp8 + %d e8m0) = %s\n", l.Layer, l.Rows, l.Dim, l.ScaleCols, tierflags.HumanSize(l.Bytes()))
		o, loaded, err := engram.LoadSGLangLayer(c, model, l, force, stderr)
		if err != nil {
			return err
		}
		if !loaded {
			fmt.Fprintf(stdout, "%s: sealed already (%s), left as it is (--force loads it again)\n", o.Name, o.Label)
			continue
		}
		fmt.Fprintf(stdout, "loaded %s: %s, crc32c %08x, sealed\n", o.Name, tierflags.HumanSize(o.Size), o.Sum)
	}
	if found == 0 {
		return fmt.Errorf("the checkpoint has no Engram layer %d (it has %v)", layer, layerIDs(layers))
	}
	return nil
}

func layerIDs(ls []engram.SGLangLayer) []int {
	var ids []int
	for _, l := range ls {
		ids = append(ids, l.Layer)
	}
	return ids
}

// checkpointFiles expands --file: comma-separated files, or a folder's
// .safetensors files.
