package kernels

import _ "embed"

// gatherPTX is the gather kernels' PTX, compiled from gather.cu by
// scripts/genptx.sh. It is embedded in every build so that a test without
// CUDA can check it against the source.
//
//go:embed gather.ptx
var gatherPTX string
