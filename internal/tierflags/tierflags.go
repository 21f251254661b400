// Package tierflags turns command-line flags and JSON config files into tier
// options, for the commands that create or attach a tier.
package tierflags

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cxltier/cxltier/tier"
)

// DefaultDevice is the embedded default backing.
const DefaultDevice = "shm:cxltier"

// Config is the tier part of a command's configuration. JSON field names are
// the flag names.
type Config struct {
	Devices        Devices `json:"device"`
	Size           Size    `json:"size"`
	Stripe         Size    `json:"stripe"`
	Chunk          Size    `json:"chunk"`
	Nodes          int     `json:"nodes"`
	ClientsPerNode int     `json:"clients-per-node"`
	Locks          int     `json:"locks"`
	DirEntries     int     `json:"dir-entries"`
	LeaseTimeout   Dur     `json:"lease-timeout"`
	Coherence      string  `json:"coherence"`
	Prefault       bool    `json:"prefault"`
}

// Default is the embedded default: one 256 MiB shm device, one node, local.
func Default() Config {
	g := tier.DefaultGeometry()
	return Config{
		Devices:        Devices{List: []string{DefaultDevice}},
		Size:           Size(g.DeviceSize),
		Stripe:         Size(g.Stripe),
		Chunk:          Size(g.ChunkSize),
		Nodes:          g.Nodes,
		ClientsPerNode: g.ClientsPerNode,
		Locks:          g.LockSlots,
		DirEntries:     g.DirEntries,
		LeaseTimeout:   Dur(g.LeaseTimeout),
		Coherence:      "local",
	}
}

// Register binds the config's fields to flags, with the config's current
// values as defaults (so flags given after a config file override it).
func (c *Config) Register(fs *flag.FlagSet) {
	fs.Var(&c.Devices, "device", "backing of one tier device: shm:NAME, file:PATH, dax:PATH or anon; repeat for a striped tier")
	fs.Var(&c.Size, "size", "bytes per device when formatting (e.g. 256MiB, 64GiB); 0 takes a dax device whole")
	fs.Var(&c.Stripe, "stripe", "bytes placed on one device before the next")
	fs.Var(&c.Chunk, "chunk", "global allocator unit")
	fs.IntVar(&c.Nodes, "nodes", c.Nodes, "hosts that share the tier")
	fs.IntVar(&c.ClientsPerNode, "clients-per-node", c.ClientsPerNode, "client lease slots per host")
	fs.IntVar(&c.Locks, "locks", c.Locks, "global lock slots")
	fs.IntVar(&c.DirEntries, "dir-entries", c.DirEntries, "root directory capacity")
	fs.Var(&c.LeaseTimeout, "lease-timeout", "a client silent this long is reaped")
	fs.StringVar(&c.Coherence, "coherence", c.Coherence, "local (one coherent host) or shared (non-coherent CXL across hosts)")
	fs.BoolVar(&c.Prefault, "prefault", c.Prefault, "touch every page at start, in parallel")
}

// Options builds tier options from the config.
func (c Config) Options() (tier.Options, error) {
	var opts tier.Options
	if len(c.Devices.List) == 0 {
		return opts, errors.New("no -device given")
	}
	for _, d := range c.Devices.List {
		b, err := tier.ParseBacking(d)
		if err != nil {
			return opts, err
		}
		opts.Devices = append(opts.Devices, b)
	}
	coh, ok := tier.ParseCoherence(c.Coherence)
	if !ok {
		return opts, fmt.Errorf("-coherence %q: want local or shared", c.Coherence)
	}
	opts.Coherence = coh
	opts.Prefault = c.Prefault
	opts.Geometry = tier.Geometry{
		DeviceSize:     int64(c.Size),
		Devices:        len(opts.Devices),
		Stripe:         int64(c.Stripe),
		ChunkSize:      int64(c.Chunk),
		Nodes:          c.Nodes,
		ClientsPerNode: c.ClientsPerNode,
		LockSlots:      c.Locks,
		DirEntries:     c.DirEntries,
		LeaseTimeout:   time.Duration(c.LeaseTimeout),
	}
	return opts, nil
}

// Devices is a repeatable flag whose first use on a command line replaces
// the default (or the config file's list).
type Devices struct {
	List    []string
	fromCLI bool
}

func (d *Devices) String() string { return strings.Join(d.List, ",") }

func (d *Devices) Set(s string) error {
	if _, err := tier.ParseBacking(s); err != nil {
		return err
	}
	if !d.fromCLI {
		d.List, d.fromCLI = nil, true
	}
	d.List = append(d.List, s)
	return nil
}

// UnmarshalJSON takes a list of backings, or one as a string (comma
// separated, as on the command line): "device": "shm:small" is a tier of
// one device, not an error about Go types.
func (d *Devices) UnmarshalJSON(b []byte) error {
	d.fromCLI = false
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		d.List = nil
		for _, s := range strings.Split(one, ",") {
			if s = strings.TrimSpace(s); s != "" {
				d.List = append(d.List, s)
			}
		}
		if len(d.List) == 0 {
			return fmt.Errorf(`"device": %q names no backing (want "shm:NAME", or a list of backings)`, one)
		}
		return nil
	}
	if err := json.Unmarshal(b, &d.List); err != nil {
		return fmt.Errorf(`"device": want a backing ("shm:cxltier") or a list of them (["dax:/dev/dax0.0", "dax:/dev/dax1.0"]), got %s`, b)
	}
	return nil
}

func (d Devices) MarshalJSON() ([]byte, error) { return json.Marshal(d.List) }

// Size is a byte count flag accepting binary suffixes: 4096, 64KiB, 2MiB, 1GiB, 1TiB
// (K/M/G/T mean the same binary units; KB/MB/GB/TB are refused as ambiguous).
type Size int64

func (s *Size) String() string { return FormatSize(int64(*s)) }

func (s *Size) Set(v string) error {
	n, err := ParseSize(v)
	if err != nil {
		return err
	}
	*s = Size(n)
	return nil
}

func (s *Size) UnmarshalText(b []byte) error { return s.Set(string(b)) }
func (s Size) MarshalText() ([]byte, error)  { return []byte(FormatSize(int64(s))), nil }

// UnmarshalJSON takes a size as a string ("256MiB") or as a JSON number of
// bytes (268435456), as people write either in a config file.
func (s *Size) UnmarshalJSON(b []byte) error {
	var text string
	if err := json.Unmarshal(b, &text); err == nil {
		return s.Set(text)
	}
	var n json.Number
	if err := json.Unmarshal(b, &n); err == nil {
		if err := s.Set(n.String()); err == nil {
			return nil
		}
	}
	return fmt.Errorf("size %s: want a byte count (268435456) or a string with a binary suffix (\"256MiB\")", b)
}

// ParseSize parses a byte count with an optional binary suffix.
func ParseSize(v string) (int64, error) {
	t := strings.TrimSpace(v)
	mult := int64(1)
	for _, u := range []string{"TB", "GB", "MB", "KB"} {
		if strings.HasSuffix(t, u) {
			// GB is 10^9 to some and 2^30 to others: a tier's sizes must
			// not depend on which the reader assumed.
			return 0, fmt.Errorf("size %q: %s is ambiguous; write %siB (binary) or a byte count", v, u, u[:1])
		}
	}
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10},
		{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("size %q: want a non-negative integer with an optional KiB/MiB/GiB/TiB suffix", v)
	}
	if n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q: too large", v)
	}
	return n * mult, nil
}

// FormatSize prints a byte count in the largest binary unit that divides it.
func FormatSize(n int64) string {
	for _, u := range []struct {
		name string
		mult int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult && n%u.mult == 0 {
			return fmt.Sprintf("%d%s", n/u.mult, u.name)
		}
	}
	return strconv.FormatInt(n, 10)
}

// HumanSize prints a byte count for people: exact in the largest unit
// that divides it (as FormatSize), else to a tenth of the largest unit it
// reaches ("2.5GiB", not "2586041KiB"), and bytes as "525B". Unlike
// FormatSize it does not round-trip as a flag value.
func HumanSize(n int64) string {
	if n < 1<<10 {
		return strconv.FormatInt(n, 10) + "B"
	}
	for _, u := range []struct {
		name string
		mult int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult {
			if n%u.mult == 0 {
				return fmt.Sprintf("%d%s", n/u.mult, u.name)
			}
			return fmt.Sprintf("%.1f%s", float64(n)/float64(u.mult), u.name)
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// Dur is a duration flag that also reads from JSON strings ("5s").
type Dur time.Duration

func (d *Dur) String() string { return time.Duration(*d).String() }

func (d *Dur) Set(v string) error {
	x, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("duration %q: %w", v, err)
	}
	if x <= 0 {
		return fmt.Errorf("duration %q must be positive", v)
	}
	*d = Dur(x)
	return nil
}

func (d *Dur) UnmarshalText(b []byte) error { return d.Set(string(b)) }
func (d Dur) MarshalText() ([]byte, error)  { return []byte(time.Duration(d).String()), nil }
