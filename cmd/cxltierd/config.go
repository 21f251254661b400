package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"

	"github.com/cxltier/cxltier/internal/tierflags"
	"github.com/cxltier/cxltier/tier"
)

// config is the daemon's configuration: the tier's, plus the daemon's own.
// A JSON config file uses the flag names as keys; flags override it.
type config struct {
	tierflags.Config
	Node         int    `json:"node"`
	ManagerNode  int    `json:"manager-node"`
	Listen       string `json:"listen"`
	TokenFile    string `json:"token-file"`
	SkipPIDCheck bool   `json:"skip-pid-check"`
	// The prefix index the daemon makes sure exists (sized when the tier
	// is formatted; PrefixBlocks 0 creates none).
	PrefixName       string         `json:"prefix-name"`
	PrefixBlocks     int64          `json:"prefix-blocks"`
	PrefixBlockBytes tierflags.Size `json:"prefix-block-bytes"`
	// AdminRate bounds admin requests per second (0: no bound), so a
	// runaway scraper cannot starve the daemon's own work.
	AdminRate  float64 `json:"admin-rate"`
	configFile string
	sizeGiven  bool // -size on the command line or "size" in the file
	checkOnly  bool // -check-config: check the configuration and exit
}

const tokenEnv = "CXLTIER_TOKEN"

func defaultConfig() config {
	return config{Config: tierflags.Default(), Listen: "127.0.0.1:7070",
		PrefixName: "default", PrefixBlocks: 32, PrefixBlockBytes: 1 << 20, AdminRate: 100}
}

func (c *config) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("cxltierd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: cxltierd [flags]\n\nWith no flags: a 256MiB shm:cxltier tier, local coherence, one node, admin API on 127.0.0.1:7070.\nThe tier is created if missing and attached if present; its content outlives the daemon.\n\n")
		fs.PrintDefaults()
	}
	c.Register(fs)
	fs.StringVar(&c.configFile, "config", "", "JSON config file (keys are flag names); flags override it")
	fs.BoolVar(&c.checkOnly, "check-config", false, "check the flags and config file, say what they give, and exit (nothing is started)")
	fs.IntVar(&c.Node, "node", c.Node, "this host's node id")
	fs.IntVar(&c.ManagerNode, "manager-node", c.ManagerNode, "node whose daemon grants global locks and reaps dead nodes")
	fs.StringVar(&c.Listen, "listen", c.Listen, "admin API address (host:port); keep it on loopback")
	fs.StringVar(&c.TokenFile, "token-file", c.TokenFile, "file holding the bearer token for mutating endpoints (or set "+tokenEnv+")")
	fs.BoolVar(&c.SkipPIDCheck, "skip-pid-check", c.SkipPIDCheck, "judge local clients by heartbeat only")
	fs.StringVar(&c.PrefixName, "prefix-name", c.PrefixName, "prefix index created if missing")
	fs.Int64Var(&c.PrefixBlocks, "prefix-blocks", c.PrefixBlocks, "payload blocks of that index (0: create none)")
	fs.Var(&c.PrefixBlockBytes, "prefix-block-bytes", "largest payload per prefix entry (one KV page)")
	fs.Float64Var(&c.AdminRate, "admin-rate", c.AdminRate, "admin requests per second, bursts of as many (0: unbounded); more get 429")
	return fs
}

// loadConfig parses flags, reads the config file if one is named, and parses
// the flags again over it so that flags win.
func loadConfig(args []string, stderr io.Writer) (config, error) {
	cfg := defaultConfig()
	fs := cfg.flagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))
	}
	sizeGiven := false
	fs.Visit(func(f *flag.Flag) { sizeGiven = sizeGiven || f.Name == "size" })
	if cfg.configFile != "" {
		raw, err := readRegular(cfg.configFile, maxConfigBytes)
		if err != nil {
			return cfg, fmt.Errorf("config: %w", err)
		}
		fromFile := defaultConfig()
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&fromFile); err != nil {
			return cfg, fmt.Errorf("config %s: %w", cfg.configFile, err)
		}
		if err := fromFile.flagSet(io.Discard).Parse(args); err != nil {
			return cfg, err
		}
		var keys map[string]json.RawMessage
		if json.Unmarshal(raw, &keys) == nil {
			_, inFile := keys["size"]
			sizeGiven = sizeGiven || inFile
		}
		fromFile.configFile = cfg.configFile
		fromFile.checkOnly = cfg.checkOnly
		cfg = fromFile
	}
	cfg.sizeGiven = sizeGiven
	switch {
	case cfg.AdminRate < 0:
		return cfg, fmt.Errorf("-admin-rate %v: must not be negative", cfg.AdminRate)
	case cfg.PrefixBlocks < 0:
		return cfg, fmt.Errorf("-prefix-blocks %d: must not be negative", cfg.PrefixBlocks)
	}
	return cfg, nil
}

// check refuses, before anything starts, every setting the daemon would
// refuse at start: the geometry a format would refuse (whether or not the
// tier exists: a bad flag is a mistake either way), and node ids outside
// the tier's nodes (the existing tier's, read without attaching, or the
// flags' for one to be formatted). -check-config and the daemon share it,
// so what one accepts the other starts with. It returns the tier's node
// count and whether the tier exists.
func (c config) check(opts tier.Options) (nodes int, existing bool, err error) {
	g := opts.Geometry
	if g.DeviceSize == 0 && allDax(opts.Devices) {
		g.DeviceSize = 1 << 40 // size 0: the whole DAX device, read when formatting; the rest is checked here
	}
	if err := tier.CheckGeometry(g); err != nil {
		return 0, false, fmt.Errorf("%w (see -size, -chunk, -stripe, -nodes, -clients-per-node, -locks, -dir-entries, -lease-timeout)", err)
	}
	nodes = opts.Geometry.Nodes
	if r, err := tier.Open(opts); err == nil {
		nodes, existing = r.Info().Geometry.Nodes, true
		r.Close()
	} else if !errors.Is(err, tier.ErrNoBacking) {
		return 0, false, err
	}
	which := fmt.Sprintf("the tier to be formatted has nodes 0 to %d (-nodes %d)", nodes-1, nodes)
	if existing {
		which = fmt.Sprintf("the tier %v has nodes 0 to %d", opts.Devices, nodes-1)
	}
	switch {
	case c.Node < 0 || c.Node >= nodes:
		return nodes, existing, fmt.Errorf("-node %d: %s", c.Node, which)
	case c.ManagerNode < 0 || c.ManagerNode >= nodes:
		return nodes, existing, fmt.Errorf("-manager-node %d: %s", c.ManagerNode, which)
	case c.PrefixBlocks > 0 && (c.PrefixBlockBytes <= 0 || int64(c.PrefixBlockBytes) > g.DeviceSize):
		return nodes, existing, fmt.Errorf("-prefix-block-bytes %d: want more than 0 and at most the tier's size", int64(c.PrefixBlockBytes))
	}
	return nodes, existing, nil
}

func allDax(devs []tier.Backing) bool {
	for _, d := range devs {
		if d.Kind != tier.BackingDax {
			return false
		}
	}
	return len(devs) > 0
}

// Token length bounds: shorter is guessable; longer is no token anyone
// meant (it used to be cut to 4096 bytes without a word).
const (
	minTokenBytes = 16
	maxTokenBytes = 4096
)

// loadToken reads the admin token from the token file or the environment.
// The token guards mutations, so a token file is refused unless it is a
// regular file (opened without following a link), owned by the daemon's
// user and unreadable by group and others.
func loadToken(path string) ([]byte, error) {
	if path == "" {
		tok := []byte(strings.TrimSpace(os.Getenv(tokenEnv)))
		if len(tok) == 0 {
			return nil, nil
		}
		return tok, checkToken(tok, tokenEnv)
	}
	// Non-blocking: a FIFO planted here must be refused below, not hold
	// the daemon before it listens.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("token file (not followed if a link): %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	switch sys, _ := st.Sys().(*syscall.Stat_t); {
	case !st.Mode().IsRegular():
		return nil, fmt.Errorf("token file %s is not a regular file", path)
	case st.Mode().Perm()&0o077 != 0:
		return nil, fmt.Errorf("token file %s has mode %v: it must not be readable by group or others", path, st.Mode().Perm())
	case sys != nil && int(sys.Uid) != os.Geteuid():
		return nil, fmt.Errorf("token file %s is owned by uid %d, the daemon runs as %d: another user could have planted it", path, sys.Uid, os.Geteuid())
	}
	raw, err := io.ReadAll(io.LimitReader(f, maxTokenBytes+64))
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	tok := bytes.TrimSpace(raw)
	return tok, checkToken(tok, "token file "+path)
}

func checkToken(tok []byte, where string) error {
	switch {
	case len(tok) == 0:
		return fmt.Errorf("%s is empty", where)
	case len(tok) < minTokenBytes:
		return fmt.Errorf("%s: a token of %d bytes is too short (at least %d; e.g. openssl rand -hex 32)", where, len(tok), minTokenBytes)
	case len(tok) > maxTokenBytes:
		return fmt.Errorf("%s: a token of more than %d bytes", where, maxTokenBytes)
	}
	return nil
}

// maxConfigBytes bounds a config file: it is a page of JSON.
const maxConfigBytes = 1 << 20

// readRegular reads a regular file of at most limit bytes. It opens
// without blocking, so a FIFO at path is refused instead of waiting for a
// writer.
func readRegular(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (a %v)", path, st.Mode().Type())
	}
	raw, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(raw)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, limit)
	}
	return raw, nil
}
