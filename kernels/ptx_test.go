package kernels

import (
	"testing"

	"github.com/cxltier/cxltier/internal/ptxcheck"
)

func TestPTXMatchesSource(t *testing.T) {
	if err := ptxcheck.Check("gather.cu", gatherPTX, "cxl_rows", "cxl_blocks"); err != nil {
		t.Error(err)
	}
}
