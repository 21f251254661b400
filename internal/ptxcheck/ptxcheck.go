// Package ptxcheck holds the tests that tie a package's CUDA source to its
// Go side: the committed PTX was made from the source as it is now
// (scripts/genptx.sh records the source's SHA-256 on the PTX's first line)
// and has the entry points the Go code launches, and the constants both
// declare agree.
package ptxcheck

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// SourceHash is the SHA-256 recorded on the first line of ptx.
func SourceHash(ptx string) string {
	first, _, _ := strings.Cut(ptx, "\n")
	return strings.TrimPrefix(first, "// cxltier-source-sha256: ")
}

// Check reports a ptx that was made from another version of the source
// file src, or that lacks one of entries.
func Check(src, ptx string, entries ...string) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	if got, want := SourceHash(ptx), hex.EncodeToString(sum[:]); got != want {
		return fmt.Errorf("the PTX of %s was made from another version (recorded %s, source is %s): run scripts/genptx.sh %s", src, got, want, src)
	}
	for _, e := range entries {
		if !strings.Contains(ptx, ".entry "+e+"(") {
			return fmt.Errorf("the PTX of %s lacks %s", src, e)
		}
	}
	return nil
}

// Define is the value of "#define name VALUE" in the source file src
// (decimal or 0x hex, an integer suffix like ull allowed).
func Define(src, name string) (uint64, error) {
	b, err := os.ReadFile(src)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == "#define" && f[1] == name {
			v, err := strconv.ParseUint(strings.TrimRight(strings.ToLower(f[2]), "ul"), 0, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: #define %s %s: %w", src, name, f[2], err)
			}
			return v, nil
		}
	}
	return 0, fmt.Errorf("%s: no #define %s", src, name)
}

// Agree reports the first of want (name → the Go value) whose #define in
// src differs.
func Agree(src string, want map[string]uint64) error {
	for name, v := range want {
		got, err := Define(src, name)
		if err != nil {
			return err
		}
		if got != v {
			return fmt.Errorf("%s: #define %s %d, the Go side has %d", src, name, got, v)
		}
	}
	return nil
}
