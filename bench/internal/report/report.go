// Package report holds what every bench/ program shares: a description of
// the machine and the JSON result file.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
)

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
// bench/results/PROGRAM-ENGINE.json, and says where on log.
func WriteJSON(path, program, engine string, v any, log io.Writer) error {
	if path == "" {
		path = filepath.Join("bench", "results", program+"-"+strings.ReplaceAll(engine, ":", "")+".json")
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
