// Command soak runs all three workloads against one tier for a long time
// while killing workers and restarting the daemon, and checks the tier's
// invariants as it goes:
//
//   - prefix workers set, get (payloads verified byte for byte), test and
//     delete keys of one shared index;
//   - top-k workers register sequences, append entries and resolve random
//     decode steps, checking every selected slot's bytes;
//   - Engram workers prefetch rows of a shared synthetic table and check
//     every row.
//
// Every -kill-every a random worker is SIGKILLed and replaced; every
// -restart-every the daemon is SIGKILLed and started again. Each -report it
// prints the throughput of the interval and the checks: no worker saw a
// wrong byte, the prefix index is consistent with every payload intact,
// dead clients are reaped, the tier's metadata reads clean. At the end,
// with every worker gone, no chunk may be left to a client.
//
// With -damage-every the supervisor also flips random bytes of the prefix
// index's metadata and payloads while the workers run: the workers then
// count errors and go on, and the run fails only on a worker that panics,
// hangs or reads a payload other than the one stored under its key.
//
//	go run ./bench/soak -duration 2h                 # from the repository root
//	go run ./bench/soak -duration 60s -report 15s    # what CI runs
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"
)

type options struct {
	duration, report, killEvery, restartEvery time.Duration
	damageEvery                               time.Duration
	prefixWorkers, topkWorkers, engramWorkers int
	daemon                                    string
	size                                      string
}

func main() {
	if role := os.Getenv(envRole); role != "" {
		if err := runWorker(role, os.Stdout); err != nil {
			fmt.Fprintf(os.Stdout, "fail %s: %v\n", role, err)
			os.Exit(3)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.DurationVar(&o.duration, "duration", time.Hour, "how long to run")
	fs.DurationVar(&o.report, "report", time.Minute, "interval between reports")
	fs.DurationVar(&o.killEvery, "kill-every", 2*time.Second, "SIGKILL a random worker this often (0: never)")
	fs.DurationVar(&o.restartEvery, "restart-every", 20*time.Second, "SIGKILL and restart the daemon this often (0: never)")
	fs.DurationVar(&o.damageEvery, "damage-every", 0, "flip a random byte of the prefix index (metadata or payloads) this often (0: never); workers then tolerate errors, and the run checks for panics, hangs and wrong payloads only")
	fs.IntVar(&o.prefixWorkers, "prefix-workers", 2, "prefix-cache worker processes")
	fs.IntVar(&o.topkWorkers, "topk-workers", 1, "sparse-KV worker processes")
	fs.IntVar(&o.engramWorkers, "engram-workers", 1, "Engram worker processes")
	fs.StringVar(&o.daemon, "daemon", "", "cxltierd binary (default: go build ./cmd/cxltierd)")
	fs.StringVar(&o.size, "size", "256MiB", "tier size")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	case o.duration <= 0 || o.report <= 0 || o.killEvery < 0 || o.restartEvery < 0 || o.damageEvery < 0:
		return o, fmt.Errorf("-duration and -report must be positive, -kill-every and -restart-every not negative")
	case o.prefixWorkers < 0 || o.topkWorkers < 0 || o.engramWorkers < 0 || o.prefixWorkers+o.topkWorkers+o.engramWorkers == 0:
		return o, fmt.Errorf("need at least one worker")
	}
	return o, nil
}
