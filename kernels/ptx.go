package kernels

import (
	_ "embed"
	"strings"
)

// gatherPTX is gather.cu compiled by genptx.sh. It is embedded in every
// build so that a test without CUDA can check it against the source.
//
//go:embed gather.ptx
var gatherPTX string

// ptxSourceHash is the SHA-256 of gather.cu recorded when the PTX was made.
func ptxSourceHash() string {
	first, _, _ := strings.Cut(gatherPTX, "\n")
	return strings.TrimPrefix(first, "// cxltier-source-sha256: ")
}
