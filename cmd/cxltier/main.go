// Command cxltier is the cxltier command-line tool: it asks a running daemon
// for its status, inspects a region without a daemon, and formats tiers.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/cxltier/cxltier/tier"
)

const usage = `usage: cxltier COMMAND [flags]

commands:
  status    ask the running cxltierd for the tier's state
  health    exit 0 when the running cxltierd says its tier is healthy (a liveness probe)
  top       watch the running cxltierd: tier use, clients, prefix and top-k rates
  inspect   read a region's backing files directly (no daemon needed)
  format    create and format a new tier
  destroy   remove a tier's backing files (refused while clients are live)
  repair    reap dead clients and release orphaned locks on a tier no daemon serves
  resize    explains how to move a tier to a new size (it cannot be resized in place)
  engram    Engram tables: hashing, presets, load (our tables and SGLang V4.1 checkpoints), verify, destroy
  object    named objects shared by every process of the tier: ls, verify, rm
  prefix    prefix cache: SGLang page keys, create, stats, check, snapshot, restore

Run 'cxltier COMMAND -h' for a command's flags.
`

func main() {
	// A reader that goes away (cxltier prefix stats ... | head -1) must not
	// kill the tool between its attach and its close, as SIGPIPE would: its
	// lease would stay live until a reaper came. Ignored, a write to the
	// pipe fails instead, and the tool closes its client on the way out.
	signal.Ignore(syscall.SIGPIPE)
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

type command func(args []string, stdout, stderr io.Writer) error

func run(args []string, stdout, stderr io.Writer) int {
	commands := map[string]command{"status": cmdStatus, "health": cmdHealth, "top": cmdTop, "destroy": cmdDestroy, "repair": cmdRepair, "resize": cmdResize, "inspect": cmdInspect, "format": cmdFormat, "engram": cmdEngram, "prefix": cmdPrefix, "object": cmdObject}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "cxltier: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	err := cmd(args[1:], stdout, stderr)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		return 2
	case errors.Is(err, errArgs):
		fmt.Fprintf(stderr, "cxltier %s: %v\n", args[0], err)
		return 2
	}
	msg := err.Error()
	if errors.Is(err, tier.ErrExhausted) {
		msg += "\n  (the tier is too small for this. A larger one: snapshot the prefix indexes you keep, stop the servers and cxltierd, then\n   cxltier format -force -size N ... (it replaces the tier and all it holds), or start cxltierd with -size N on a new device)"
	}
	// One prefix per message: "cxltier engram: engram: ..." says it twice.
	fmt.Fprintf(stderr, "cxltier %s: %s\n", args[0], strings.TrimPrefix(msg, args[0]+": "))
	return 1
}

// errUsage marks an error the flag package already reported; errArgs one
// of the command line that the command reports (exit status 2 for both).
var (
	errUsage = errors.New("usage")
	errArgs  = errors.New("usage")
)

func newFlags(name string, stderr io.Writer, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("cxltier "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: cxltier %s %s\n\n", name, synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses flags wherever they stand among the arguments (a device
// first and --name after it, as people type), leaving the others, in
// order, as fs.Args(); after "--" everything is an argument.
func parse(fs *flag.FlagSet, args []string) error {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return errUsage
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			pos = append(pos, rest...)
			break
		}
		if len(rest) == 0 {
			break
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	return fs.Parse(append([]string{"--"}, pos...))
}
