package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/tier"
)

const engramUsage = `usage: cxltier engram SUBCOMMAND [flags]

subcommands:
  hash         print the global table rows of each position of --ids, one JSON array per line
  multipliers  print a layer's hash multipliers as a JSON array
  presets      list the built-in geometries
  load         load a layer's table into a tier (raw rows, safetensors, or synthetic), or a
               DeepSeek-V4.1 checkpoint's layers into SGLang's host tables (--model)
  verify       check a loaded table's header and every row against its checksum
  destroy      remove tables: a geometry's (--preset/--config, --layer) or SGLang's (--model)

load, verify and destroy take the tier's devices as arguments, in tier order.
`

func cmdEngram(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, engramUsage)
		return errUsage
	}
	switch args[0] {
	case "hash":
		return engramHash(args[1:], stdout, stderr)
	case "multipliers":
		return engramMultipliers(args[1:], stdout, stderr)
	case "load":
		return engramLoad(args[1:], stdout, stderr)
	case "verify":
		return engramVerify(args[1:], stdout, stderr)
	case "destroy":
		return engramDestroy(args[1:], stdout, stderr)
	case "presets":
		return engramPresets(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stderr, engramUsage)
		return nil
	}
	fmt.Fprintf(stderr, "cxltier engram: unknown subcommand %q\n\n%s", args[0], engramUsage)
	return errUsage
}

// geometryFlags adds --preset, --config and --layer to fs.
type geometryFlags struct {
	preset, config *string
	layer          *int
}

func addGeometryFlags(fs *flag.FlagSet) geometryFlags {
	return geometryFlags{
		preset: fs.String("preset", "", "built-in geometry: "+strings.Join(engram.PresetNames(), ", ")),
		config: fs.String("config", "", "geometry JSON file"),
		layer:  fs.Int("layer", -1, "Engram layer id"),
	}
}

func (gf geometryFlags) hasher() (*engram.Hasher, error) {
	g, err := gf.geometry()
	if err != nil {
		return nil, err
	}
	if *gf.layer < 0 {
		return nil, fmt.Errorf("--layer is required (one of %v)", g.LayerIDs)
	}
	return engram.NewHasher(g)
}

// geometry is the --preset or --config geometry (no --layer needed).
func (gf geometryFlags) geometry() (engram.Geometry, error) {
	switch {
	case (*gf.preset == "") == (*gf.config == ""):
		return engram.Geometry{}, errors.New("give exactly one of --preset and --config")
	case *gf.preset != "":
		return engram.Preset(*gf.preset)
	default:
		return engram.LoadGeometry(*gf.config)
	}
}

func engramHash(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("engram hash", stderr, "--preset NAME|--config FILE --layer L --ids 0,1,2")
	gf := addGeometryFlags(fs)
	idList := fs.String("ids", "", "comma-separated compressed token ids of one sequence, from its start")
	raw := fs.Bool("raw", false, "the ids are raw tokenizer ids: map them through the geometry's lookup table first")
	if err := parse(fs, args); err != nil {
		return err
	}
	ids, err := parseIDs(*idList)
	if err != nil {
		return err
	}
	h, err := gf.hasher()
	if err != nil {
		return err
	}
	if *raw {
		c, err := engram.LoadCompressor(h.Geometry())
		if err != nil {
			return err
		}
		if err := c.Compress(ids, ids); err != nil {
			return err
		}
	}
	rows, err := h.Hash(nil, *gf.layer, nil, ids)
	if err != nil {
		return err
	}
	per := h.Geometry().HashesPerToken()
	for t := range ids {
		line, _ := json.Marshal(rows[t*per : (t+1)*per])
		fmt.Fprintf(stdout, "%s\n", line)
	}
	return nil
}

func engramMultipliers(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("engram multipliers", stderr, "--preset NAME|--config FILE --layer L")
	gf := addGeometryFlags(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	h, err := gf.hasher()
	if err != nil {
		return err
	}
	m, err := h.Multipliers(*gf.layer)
	if err != nil {
		return err
	}
	line, _ := json.Marshal(m)
	fmt.Fprintf(stdout, "%s\n", line)
	return nil
}

func parseIDs(s string) ([]int64, error) { return parseList("--ids", s) }

// parseList reads a comma-separated list of integers given to flag.
func parseList(flag, s string) ([]int64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("%s is required", flag)
	}
	parts := strings.Split(s, ",")
	ids := make([]int64, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseInt(strings.TrimSpace(p), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s position %d: %q is not an integer", flag, i, p)
		}
		ids[i] = v
	}
	return ids, nil
}

// engramDestroy removes Engram tables: SGLang's host tables of a model
// (named objects), or our own tables of a geometry.
func engramDestroy(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("engram destroy", stderr, "(--model NAME | --preset NAME|--config FILE) [--layer L] [--force] DEVICE...")
	gf := addGeometryFlags(fs)
	model := fs.String("model", "", "remove SGLang's host tables of this model (loaded by a server or by engram load --model)")
	force := fs.Bool("force", false, "remove SGLang tables even while servers hold them")
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		noDevice(fs)
		return errUsage
	}
	if *model != "" {
		return destroySGLangTables(fs.Args(), *model, *gf.layer, *force, stdout)
	}
	g, err := gf.geometry()
	if err != nil {
		return fmt.Errorf("%w (or --model for SGLang's tables)", err)
	}
	layers := g.LayerIDs
	if *gf.layer >= 0 {
		layers = []int{*gf.layer}
	}
	c, done, err := tierArgs(fs)
	if err != nil {
		return err
	}
	defer done()
	removed := 0
	for _, l := range layers {
		err := engram.DestroyTable(c, g, l)
		if errors.Is(err, tier.ErrNotFound) && *gf.layer < 0 {
			continue // destroying a geometry's tables: the layers it has
		}
		if err != nil {
			return err
		}
		removed++
		fmt.Fprintf(stdout, "removed %s\n", engram.TableName(g, l))
	}
	if removed == 0 {
		return fmt.Errorf("no table of geometry %s is loaded in this tier: %w", g.Name, tier.ErrNotFound)
	}
	return nil
}

func destroySGLangTables(devs []string, model string, layer int, force bool, stdout io.Writer) error {
	r, _, err := openDevices(devs, true)
	if err != nil {
		return err
	}
	objs, err := r.Objects()
	r.Close()
	if err != nil {
		return err
	}
	prefix := "engram/" + engram.ModelKey(model) + "/"
	var names []string
	for _, o := range objs {
		rest, ok := strings.CutPrefix(o.Name, prefix)
		if !ok {
			continue
		}
		if want := fmt.Sprintf("sglang_engram_%d", layer); layer >= 0 && rest != want && !strings.HasPrefix(rest, want+".tp") {
			continue
		}
		names = append(names, o.Name)
	}
	if len(names) == 0 {
		return fmt.Errorf("no Engram table of model %q in this tier (cxltier object ls -prefix engram/ lists them): %w", model, tier.ErrNotFound)
	}
	return removeObjects(devs, names, force, stdout)
}

// engramPresets lists the built-in geometries; with -json, as one JSON
// array of geometry files (each one a valid --config as it stands).
func engramPresets(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("engram presets", stderr, "[-json] [-name PRESET]")
	asJSON := fs.Bool("json", false, "print the geometries as JSON (each element is a valid --config file)")
	name := fs.String("name", "", "print this preset alone as JSON: a geometry file to edit (cxltier engram presets -name demo > my-model.json)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *name != "" {
		g, err := engram.Preset(*name)
		if err != nil {
			return err
		}
		raw, err := json.MarshalIndent(g, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\n", raw)
		return nil
	}
	var all []engram.Geometry
	for _, n := range engram.PresetNames() {
		g, _ := engram.Preset(n)
		all = append(all, g)
	}
	if *asJSON {
		raw, err := json.MarshalIndent(all, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s\n", raw)
		return nil
	}
	for _, g := range all {
		fmt.Fprintf(stdout, "%-12s layers %v, orders 2..%d × %d heads, base %v, V %d, row %d B\n",
			g.Name, g.LayerIDs, g.MaxNgram, g.Heads, g.BaseSizes, g.Vocab, g.RowBytes)
	}
	return nil
}
