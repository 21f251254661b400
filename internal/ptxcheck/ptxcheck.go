// Package ptxcheck holds the test that a package's committed PTX was made
// from its CUDA source as it is now (scripts/genptx.sh records the
// source's SHA-256 on the PTX's first line) and has the entry points its
// Go code launches.
package ptxcheck

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
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
