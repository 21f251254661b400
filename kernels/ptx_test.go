package kernels

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

func TestPTXMatchesSource(t *testing.T) {
	src, err := os.ReadFile("gather.cu")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(src)
	if got, want := ptxSourceHash(), hex.EncodeToString(sum[:]); got != want {
		t.Fatalf("gather.ptx was made from another gather.cu (recorded %s, source is %s): run kernels/genptx.sh", got, want)
	}
	for _, entry := range []string{".entry cxl_rows(", ".entry cxl_blocks("} {
		if !strings.Contains(gatherPTX, entry) {
			t.Errorf("gather.ptx lacks %s", entry)
		}
	}
}
