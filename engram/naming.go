package engram

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// The names of SGLang's Engram host tables in the tier are made here
// alone: the CLI (engram load, destroy) calls these functions, and the
// Python package (cxltier.sglang.engram_host) calls them through the C ABI
// (cxl_engram_table_name), so a table the operator loads is the table the
// server attaches, whatever the model is called.

// dirNameMax is the tier directory's name limit (tier.dirNameMax).
const dirNameMax = 64

// ModelKey is the <model> part of SGLang's table names for a model name:
// every character outside [A-Za-z0-9._+-] becomes '_' (a model called
// "DeepSeek V4.1:fp8" is "DeepSeek_V4.1_fp8"); nothing left is "default".
func ModelKey(model string) string {
	var b strings.Builder
	for _, r := range model {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', strings.ContainsRune("._+-", r):
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	if b.Len() == 0 {
		return "default"
	}
	return b.String()
}

// ModelKeyOfPath is ModelKey of a model path's last component, as a
// server started with --model-path PATH names its tables.
func ModelKeyOfPath(path string) string {
	if path == "" {
		return ModelKey("")
	}
	return ModelKey(filepath.Base(filepath.Clean(path)))
}

// HostTableName is the tier object of one SGLang host table: table (SGLang's
// name for it, "sglang_engram_3") of model (a model name, made a ModelKey
// here). world > 1 names a per-rank table, which holds rank's rows only.
// A name past the directory's limit keeps its head and ends in '~' and 12
// hex digits of the whole name's SHA-256.
func HostTableName(model, table string, rank, world int) string {
	full := fmt.Sprintf("engram/%s/%s", ModelKey(model), table)
	if world > 1 {
		full += fmt.Sprintf(".tp%dof%d", rank, world)
	}
	if len(full) <= dirNameMax {
		return full
	}
	sum := sha256.Sum256([]byte(full))
	head := full[:dirNameMax-13]
	for !utf8.ValidString(head) { // never cut a character in two
		head = head[:len(head)-1]
	}
	return head + "~" + hex.EncodeToString(sum[:])[:12]
}
