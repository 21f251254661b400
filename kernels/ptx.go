package kernels

import (
	_ "embed"
	"strings"
)

// The kernels' PTX, compiled from gather.cu, topk.cu and engram.cu by genptx.sh. It is
// embedded in every build so that a test without CUDA can check it against
// the sources.
var (
	//go:embed gather.ptx
	gatherPTX string
	//go:embed topk.ptx
	topkPTX string
	//go:embed engram.ptx
	engramPTX string
)

// ptxSourceHash is the SHA-256 of the .cu source recorded when ptx was made.
func ptxSourceHash(ptx string) string {
	first, _, _ := strings.Cut(ptx, "\n")
	return strings.TrimPrefix(first, "// cxltier-source-sha256: ")
}
