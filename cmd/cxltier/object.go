package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/cxltier/cxltier/internal/tierflags"
	"github.com/cxltier/cxltier/tier"
)

const objectUsage = `usage: cxltier object SUBCOMMAND [flags] DEVICE...

Named objects: tables created once and shared by every process that maps
the tier (SGLang's Engram host tables among them), kept until removed.

subcommands:
  ls       list them: size, state (sealed: a load finished), holders, label
  verify   recompute a sealed object's checksum
  rm       remove one (refused while live processes hold it, unless -force)
`

func cmdObject(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, objectUsage)
		return errUsage
	}
	switch args[0] {
	case "ls", "list":
		return objectList(args[1:], stdout, stderr)
	case "verify":
		return objectVerify(args[1:], stdout, stderr)
	case "rm", "remove":
		return objectRemove(args[1:], stdout, stderr)
	case "-h", "--help", "help":
		fmt.Fprint(stderr, objectUsage)
		return nil
	}
	fmt.Fprintf(stderr, "cxltier object: unknown subcommand %q\n\n%s", args[0], objectUsage)
	return errUsage
}

func objectList(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("object ls", stderr, "[-json] [-prefix P] DEVICE...")
	asJSON := fs.Bool("json", false, "print JSON")
	prefix := fs.String("prefix", "", "only names starting with this")
	if err := parse(fs, args); err != nil {
		return err
	}
	r, _, err := openArgs(fs, true)
	if err != nil {
		return err
	}
	defer r.Close()
	all, err := r.Objects()
	if err != nil {
		return err
	}
	var objs []tier.Object
	for _, o := range all {
		if strings.HasPrefix(o.Name, *prefix) {
			objs = append(objs, o)
		}
	}
	if *asJSON {
		raw, _ := json.MarshalIndent(objs, "", "  ")
		fmt.Fprintf(stdout, "%s\n", raw)
		return nil
	}
	if len(objs) == 0 {
		fmt.Fprintln(stdout, "no named objects")
		return nil
	}
	for _, o := range objs {
		if o.Damage != "" {
			fmt.Fprintf(stdout, "%-44s %10s  damaged   %s (object rm -force %s removes it)\n", o.Name, "?", o.Damage, o.Name)
			continue
		}
		fmt.Fprintf(stdout, "%-44s %10s  %-8s  %d holder(s)", o.Name, tierflags.HumanSize(o.Size), o.State, o.Holders)
		if o.State == tier.ObjectSealed {
			fmt.Fprintf(stdout, "  crc32c %08x, sealed %s: %s", o.Sum, o.Sealed.UTC().Format(time.RFC3339), o.Label)
		}
		fmt.Fprintln(stdout)
	}
	return nil
}

func objectVerify(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("object verify", stderr, "NAME DEVICE...")
	if err := parse(fs, args); err != nil {
		return err
	}
	name, devs, err := nameAndDevices(fs)
	if err != nil {
		return err
	}
	r, _, err := openDevices(devs, true)
	if err != nil {
		return err
	}
	defer r.Close()
	o, err := r.OpenObject(name)
	if err != nil {
		return err
	}
	if err := r.VerifyObject(o); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %s, crc32c %08x, verified\n", o.Name, tierflags.HumanSize(o.Size), o.Sum)
	return nil
}

func objectRemove(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("object rm", stderr, "[-force] NAME DEVICE...")
	force := fs.Bool("force", false, "remove even while live processes hold it (they then read memory that is reused)")
	if err := parse(fs, args); err != nil {
		return err
	}
	name, devs, err := nameAndDevices(fs)
	if err != nil {
		return err
	}
	return removeObjects(devs, []string{name}, *force, stdout)
}

// nameAndDevices splits the arguments NAME DEVICE....
func nameAndDevices(fs *flag.FlagSet) (string, []string, error) {
	switch fs.NArg() {
	case 0:
		fmt.Fprintf(fs.Output(), "%s: no NAME and no DEVICE\n\n", fs.Name())
		fs.Usage()
		return "", nil, errUsage
	case 1:
		noDevice(fs)
		return "", nil, errUsage
	}
	return fs.Arg(0), fs.Args()[1:], nil
}

// removeObjects removes the named objects from the tier on devs.
func removeObjects(devs []string, names []string, force bool, stdout io.Writer) error {
	r, _, err := openDevices(devs, false)
	if err != nil {
		return err
	}
	defer r.Close()
	c, err := r.Attach(tier.ClientOptions{Name: "cli"})
	if err != nil {
		return err
	}
	defer c.Close()
	for _, n := range names {
		o, err := r.OpenObject(n)
		if errors.Is(err, tier.ErrCorrupt) || errors.Is(err, tier.ErrChecksum) {
			if !force {
				return fmt.Errorf("%w\n  (the object is damaged: -force removes it)", err)
			}
			err = nil // RemoveObject removes it by force
		}
		if err != nil {
			return err
		}
		if err := c.RemoveObject(n, force); err != nil {
			if errors.Is(err, tier.ErrObjectBusy) {
				return fmt.Errorf("%w\n  (stop the servers that use it first; -force removes it under them)", err)
			}
			return err
		}
		fmt.Fprintf(stdout, "removed %s (%s)\n", n, tierflags.HumanSize(o.Size))
	}
	return nil
}
