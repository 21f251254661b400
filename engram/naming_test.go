package engram

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestHostTableNames(t *testing.T) {
	for _, c := range []struct {
		model, table string
		rank, world  int
		want         string
	}{
		{"V4.1-Flash", "sglang_engram_1", 0, 1, "engram/V4.1-Flash/sglang_engram_1"},
		{"V4.1-Flash", "sglang_engram_1", 3, 8, "engram/V4.1-Flash/sglang_engram_1.tp3of8"},
		{"DeepSeek V4.1:fp8", "sglang_engram_2", 0, 1, "engram/DeepSeek_V4.1_fp8/sglang_engram_2"},
		{"org/model", "t", 0, 1, "engram/org_model/t"},
		{"", "t", 0, 1, "engram/default/t"},
		{"ü+x", "t", 0, 1, "engram/_+x/t"},
		{"../../etc", "t", 0, 1, "engram/.._.._etc/t"},
	} {
		if got := HostTableName(c.model, c.table, c.rank, c.world); got != c.want {
			t.Errorf("HostTableName(%q, %q, %d, %d) = %q, want %q", c.model, c.table, c.rank, c.world, got, c.want)
		}
	}
	if got := SGLangTableName("DeepSeek V4.1:fp8", 14); got != "engram/DeepSeek_V4.1_fp8/sglang_engram_14" {
		t.Errorf("SGLangTableName = %q", got)
	}
	if got := ModelKeyOfPath("/models/DeepSeek-V4.1/"); got != "DeepSeek-V4.1" {
		t.Errorf("ModelKeyOfPath = %q", got)
	}
}

func TestLongHostTableNamesFitTheDirectory(t *testing.T) {
	for _, model := range []string{strings.Repeat("m", 80), strings.Repeat("é", 40) + "x", strings.Repeat("a", 56)} {
		a := HostTableName(model, "sglang_engram_14", 3, 8)
		b := HostTableName(model, "sglang_engram_15", 3, 8)
		if len(a) > dirNameMax || !utf8.ValidString(a) || !strings.HasPrefix(a, "engram/") {
			t.Errorf("%q: %d bytes, valid UTF-8 %v", a, len(a), utf8.ValidString(a))
		}
		if a == b {
			t.Errorf("two tables of %q share the name %q", model, a)
		}
	}
}
