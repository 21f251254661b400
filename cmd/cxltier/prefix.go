package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cxltier/cxltier/internal/tierflags"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

const prefixUsage = `usage: cxltier prefix SUBCOMMAND [flags]

subcommands:
  keys       print SGLang page keys of a token list, one hex digest per line
  create     create a prefix index in a tier
  stats      print an index's counts and counters
  check      verify an index's invariants and payload checksums
  put        store a file as one page's payload under its key
  get        write one page's payload (checksum verified) to a file
  snapshot   write an index to a zstd file
  restore    load a snapshot file into an index (creating it if asked)
  destroy    remove an index and free its space (no client may be using it)

Subcommands other than keys take the tier's devices as arguments, in tier
order, as 'inspect' does (a bare path means file:PATH).

An index created with a key (--key-file FILE, or $CXLTIER_PREFIX_KEY) is
read and written only with it: put, get, snapshot and restore need it;
stats and check do not (they never show entries).
`

func cmdPrefix(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, prefixUsage)
		return errUsage
	}
	sub := map[string]command{"keys": prefixKeys, "create": prefixCreate, "stats": prefixStats,
		"check": prefixCheck, "put": prefixPut, "get": prefixGet, "snapshot": prefixSnapshot, "restore": prefixRestore, "destroy": prefixDestroy}
	if cmd, ok := sub[args[0]]; ok {
		return cmd(args[1:], stdout, stderr)
	}
	if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, prefixUsage)
		return nil
	}
	fmt.Fprintf(stderr, "cxltier prefix: unknown subcommand %q\n\n%s", args[0], prefixUsage)
	return errUsage
}

func prefixKeys(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("prefix keys", stderr, "--page-size N --tokens 1,2,3[,...] [--prior HEX]")
	page := fs.Int("page-size", 0, "tokens per page (required)")
	tokens := fs.String("tokens", "", "comma-separated token ids (required)")
	prior := fs.String("prior", "", "hex key of the page before the first (default: start of a sequence)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *page <= 0 {
		return fmt.Errorf("--page-size must be positive, got %d", *page)
	}
	ids, err := parseList("--tokens", *tokens)
	if err != nil {
		return err
	}
	var parent *prefix.Key
	if *prior != "" {
		k, err := prefix.ParseKey(*prior)
		if err != nil {
			return fmt.Errorf("--prior: %w", err)
		}
		parent = &k
	}
	keys, err := prefix.PageKeys(parent, ids, *page)
	if err != nil {
		return err
	}
	for _, k := range keys {
		fmt.Fprintln(stdout, k)
	}
	return nil
}

// tierArgs opens the tier named by a command's remaining arguments and
// attaches a client to it.
func tierArgs(fs *flag.FlagSet) (*tier.Client, func(), error) {
	r, _, err := openArgs(fs, false)
	if err != nil {
		return nil, nil, err
	}
	c, err := r.Attach(tier.ClientOptions{Name: "cli"})
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	return c, func() { c.Close(); r.Close() }, nil
}

// indexFlags are the name, key and sizing flags of the index commands.
type indexFlags struct {
	name, keyFile         *string
	blocks, entries, pins *int64
	shards                *int
	blockBytes            tierflags.Size
}

func addIndexFlags(fs *flag.FlagSet, sizing bool) *indexFlags {
	f := &indexFlags{name: fs.String("name", "default", "index (namespace) name"),
		keyFile: fs.String("key-file", "", "file holding the index's tenant key (default: $"+keyEnv+")")}
	if sizing {
		f.blocks = fs.Int64("blocks", 0, "payload blocks (entries that can be ready at once)")
		fs.Var(&f.blockBytes, "block-bytes", "largest payload per entry (e.g. 2MiB)")
		f.entries = fs.Int64("entries", 0, "table size, a power of two (default: ≥ 2 × blocks)")
		f.pins = fs.Int64("pins", 0, "pins per client (default 16384)")
		f.shards = fs.Int("shards", 0, "parts with a lock each, a power of two ≤ 32, so inserts from several processes run side by side (default: one per 512 blocks, at most 8)")
	}
	return f
}

// keyEnv holds a tenant key for commands not given --key-file (an
// environment variable, not a flag: flags show in the process list).
const keyEnv = "CXLTIER_PREFIX_KEY"

// key is the tenant key from --key-file or the environment ("" for none).
func (f *indexFlags) key() (string, error) {
	if *f.keyFile == "" {
		return os.Getenv(keyEnv), nil
	}
	raw, err := os.ReadFile(*f.keyFile)
	if err != nil {
		return "", err
	}
	k := strings.TrimRight(string(raw), "\r\n")
	if k == "" {
		return "", fmt.Errorf("--key-file %s is empty", *f.keyFile)
	}
	return k, nil
}

func (f *indexFlags) config() (prefix.Config, error) {
	if f.blocks != nil && (*f.blocks > 0) != (f.blockBytes > 0) {
		return prefix.Config{}, errors.New("--blocks and --block-bytes go together: how many payload blocks, and the largest payload (e.g. --blocks 4096 --block-bytes 2MiB)")
	}
	key, err := f.key()
	return prefix.Config{Name: *f.name, Blocks: *f.blocks, BlockBytes: int64(f.blockBytes), Entries: *f.entries,
		PinsPerClient: *f.pins, Shards: *f.shards, Key: key}, err
}

func prefixCreate(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("prefix create", stderr, "--name NAME --blocks N --block-bytes SIZE DEVICE...")
	f := addIndexFlags(fs, true)
	if err := parse(fs, args); err != nil {
		return err
	}
	c, done, err := tierArgs(fs)
	if err != nil {
		return err
	}
	defer done()
	cfg, err := f.config()
	if err != nil {
		return err
	}
	s, err := prefix.Create(c, cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	st := s.Stats()
	fmt.Fprintf(stdout, "created prefix index %q: %d blocks of %s, %d entries, %d shard(s)\n", st.Name, st.Blocks, tierflags.HumanSize(st.BlockBytes), st.Entries, st.Shards)
	return nil
}

// withIndex opens the named index of the tier in fs's arguments: with the
// key for commands that touch entries, for maintenance otherwise.
func withIndex(fs *flag.FlagSet, f *indexFlags, entries bool, fn func(*prefix.Store) error) error {
	return withIndexOpen(fs, f, entries, prefix.OpenKey, fn)
}

// withIndexOpen is withIndex with the call that opens an index for its
// entries (prefix.OpenToMove for a snapshot, which must work on an index
// the tier can no longer serve safely, to move it).
func withIndexOpen(fs *flag.FlagSet, f *indexFlags, entries bool, openKey func(*tier.Client, string, string) (*prefix.Store, error), fn func(*prefix.Store) error) error {
	c, done, err := tierArgs(fs)
	if err != nil {
		return err
	}
	defer done()
	var s *prefix.Store
	if entries {
		var key string
		if key, err = f.key(); err == nil {
			s, err = openKey(c, *f.name, key)
		}
	} else {
		s, err = prefix.Maintain(c, *f.name)
	}
	if err != nil {
		return err
	}
	defer s.Close()
	return fn(s)
}

func prefixStats(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("prefix stats", stderr, "[--name NAME] [-json] DEVICE...")
	f := addIndexFlags(fs, false)
	asJSON := fs.Bool("json", false, "print JSON")
	if err := parse(fs, args); err != nil {
		return err
	}
	return withIndex(fs, f, false, func(s *prefix.Store) error {
		st := s.Stats()
		if *asJSON {
			return json.NewEncoder(stdout).Encode(st)
		}
		fmt.Fprintf(stdout, "index %q (layout version %d): %d/%d blocks used (%s each, %d shard(s)), %d ready, %d reserved, %d pins held\n",
			st.Name, st.LayoutVersion, st.UsedBlocks, st.Blocks, tierflags.HumanSize(st.BlockBytes), st.Shards, st.Ready, st.Reserved, st.PinsHeld)
		fmt.Fprintf(stdout, "hits %d, misses %d (hit rate %.3f), inserts %d, evictions %d, reclaimed %d, checksum failures %d\n",
			st.Hits, st.Misses, st.HitRate(), st.Inserts, st.Evictions, st.Reclaimed, st.ChecksumFailures)
		return nil
	})
}

func prefixCheck(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("prefix check", stderr, "[--name NAME] DEVICE...")
	f := addIndexFlags(fs, false)
	if err := parse(fs, args); err != nil {
		return err
	}
	return withIndex(fs, f, false, func(s *prefix.Store) error {
		bad, err := s.Check(true)
		if err != nil {
			return err
		}
		for _, b := range bad {
			fmt.Fprintln(stdout, b)
		}
		if len(bad) > 0 {
			return fmt.Errorf("index %q: %d problems", s.Name(), len(bad))
		}
		fmt.Fprintf(stdout, "index %q: ok (%d ready entries checked)\n", s.Name(), s.Stats().Ready)
		return nil
	})
}

func prefixSnapshot(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("prefix snapshot", stderr, "[--name NAME] --out FILE DEVICE...")
	f := addIndexFlags(fs, false)
	out := fs.String("out", "", "snapshot file to write (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *out == "" {
		return errors.New("--out is required")
	}
	return withIndexOpen(fs, f, true, prefix.OpenToMove, func(s *prefix.Store) error {
		var info prefix.SnapshotInfo
		err := writeFileAtomic(*out, func(w io.Writer) error {
			var err error
			info, err = s.Snapshot(w, stderr)
			return err
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %d entries (%s of payload) to %s\n", info.Entries, tierflags.HumanSize(info.Bytes), *out)
		return nil
	})
}

func prefixRestore(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("prefix restore", stderr, "[--name NAME] --in FILE [--blocks N --block-bytes SIZE] DEVICE...")
	f := addIndexFlags(fs, true)
	in := fs.String("in", "", "snapshot file to read (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *in == "" {
		return errors.New("--in is required")
	}
	file, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer file.Close()
	c, done, err := tierArgs(fs)
	if err != nil {
		return err
	}
	defer done()
	cfg, err := f.config()
	if err != nil {
		return err
	}
	s, err := prefix.OpenKey(c, *f.name, cfg.Key)
	created := false
	if errors.Is(err, tier.ErrNotFound) && *f.blocks > 0 {
		s, err = prefix.Create(c, cfg)
		created = err == nil
	} else if errors.Is(err, tier.ErrNotFound) {
		return fmt.Errorf("index %q does not exist in this tier: give --blocks N --block-bytes SIZE to create it for the restore (room for the snapshot's entries), or restore into an index that exists (cxltier inspect lists them): %w", *f.name, err)
	}
	if err != nil {
		return err
	}
	info, err := s.Restore(file, stderr)
	s.Close()
	if err != nil {
		if created { // a failed restore leaves no index it made behind
			if derr := prefix.Destroy(c, *f.name); derr != nil {
				return fmt.Errorf("%w (and removing the index it created failed: %v)", err, derr)
			}
			return fmt.Errorf("%w; the index it created was removed", err)
		}
		return err
	}
	fmt.Fprintf(stdout, "restored %d of %d entries into %q (%s in the snapshot)", info.Restored, info.Entries, *f.name, tierflags.HumanSize(info.Bytes))
	if present := info.Entries - info.Restored; present > 0 {
		fmt.Fprintf(stdout, "; %d were present already", present)
	}
	fmt.Fprintln(stdout)
	return nil
}

func prefixDestroy(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("prefix destroy", stderr, "--name NAME DEVICE...")
	name := fs.String("name", "", "index to remove (required)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *name == "" {
		return errors.New("--name is required")
	}
	c, done, err := tierArgs(fs)
	if err != nil {
		return err
	}
	defer done()
	if err := prefix.Destroy(c, *name); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "destroyed prefix index %q\n", *name)
	return nil
}
