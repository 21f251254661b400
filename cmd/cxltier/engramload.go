package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/internal/tierflags"
)

func engramLoad(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("engram load", stderr, "--preset NAME|--config FILE --layer L (--file PATH [--tensor NAME] | --synthetic) DEVICE...")
	gf := addGeometryFlags(fs)
	file := fs.String("file", "", "rows to load: a raw row-major file, or a .safetensors file")
	tensor := fs.String("tensor", "", "the tensor to load from a safetensors file (default: its only one)")
	synthetic := fs.Bool("synthetic", false, "fill the table with synthetic rows (tests and demos)")
	if err := parse(fs, args); err != nil {
		return err
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
