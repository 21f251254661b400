// Package report holds what every bench/ program shares: a description of
// the machine and the JSON result file.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/cxltier/cxltier/kernels"
)

// Run says where a result file's figures come from: the commit they were
// measured at (with "dirty" when the tree had changes), when, and on what.
type Run struct {
	Commit string `json:"commit"`
	// CommitFrom says where Commit was read: "build" (the binary's build
	// information) or "working directory" (git where it ran, which need
	// not be the tree it was built from: a binary built with
	// -buildvcs=false carries no commit).
	CommitFrom string    `json:"commit_from,omitempty"`
	Dirty      bool      `json:"dirty,omitempty"`
	Date       time.Time `json:"date"`
	Go         string    `json:"go"`
	CPU        string    `json:"cpu"`
	GPU        string    `json:"gpu,omitempty"` // the engine's device, when it has one
}

// NewRun describes this run on eng: the commit from the binary's build
// information (go build records it), else from git in the working
// directory (go run does not), else "unknown".
func NewRun(eng kernels.Engine) Run {
	r := Run{Commit: "unknown", Date: time.Now().UTC(), Go: runtime.Version(), CPU: CPUModel()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				r.Commit, r.CommitFrom = s.Value, "build"
			case "vcs.modified":
				r.Dirty = s.Value == "true"
			}
		}
	}
	if r.Commit == "unknown" { // go run does not stamp; ask git, if there is one
		if out, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
			r.Commit, r.CommitFrom = strings.TrimSpace(string(out)), "working directory"
			st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output()
			r.Dirty = err == nil && len(st) > 0
		}
	}
	if d, ok := eng.(kernels.DeviceNamer); ok {
		r.GPU = d.DeviceName()
	}
	return r
}

// CPUModel names the machine's CPU and core count, for result files.
func CPUModel() string {
	raw, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return fmt.Sprintf("%s × %d", strings.TrimSpace(v), runtime.NumCPU())
		}
	}
	return runtime.GOARCH
}

// WriteJSON writes v as indented JSON to path, or, if path is empty, to
// bench/results/local/PROGRAM-ENGINE.json (ignored by git: a run on your
// machine does not overwrite the committed results; pass -out
// bench/results/... to replace them), and says where on log.
func WriteJSON(path, program, engine string, v any, log io.Writer) error {
	if path == "" {
		path = filepath.Join("bench", "results", "local", program+"-"+strings.ReplaceAll(engine, ":", "")+".json")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(raw, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(log, "wrote %s\n", path)
	return nil
}

// Ints parses a flag's comma-separated list of integers in [1, most].
func Ints(name, s string, most int) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v < 1 || v > most {
			return nil, fmt.Errorf("%s: %q is not a number in [1, %d]", name, f, most)
		}
		out = append(out, v)
	}
	return out, nil
}
