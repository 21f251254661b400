package kernels

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

func TestPTXMatchesSource(t *testing.T) {
	for _, c := range []struct {
		src, ptx string
		entries  []string
	}{
		{"gather.cu", gatherPTX, []string{"cxl_rows", "cxl_blocks"}},
		{"topk.cu", topkPTX, []string{"cxl_topk_check", "cxl_topk_plan"}},
		{"engram.cu", engramPTX, []string{"cxl_engram_rows"}},
	} {
		src, err := os.ReadFile(c.src)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(src)
		if got, want := ptxSourceHash(c.ptx), hex.EncodeToString(sum[:]); got != want {
			t.Errorf("the PTX of %s was made from another version (recorded %s, source is %s): run kernels/genptx.sh", c.src, got, want)
		}
		for _, entry := range c.entries {
			if !strings.Contains(c.ptx, ".entry "+entry+"(") {
				t.Errorf("the PTX of %s lacks %s", c.src, entry)
			}
		}
	}
}
