package prefix

import (
	"encoding/json"
	"errors"
	"os"
	"testing"
)

func TestPageKeysMatchSGLang(t *testing.T) {
	raw, err := os.ReadFile("testdata/keys.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		PageSize int      `json:"page_size"`
		Prior    string   `json:"prior"`
		Tokens   []int64  `json:"tokens"`
		Keys     []string `json:"keys"`
	}
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	for n, c := range cases {
		var parent *Key
		if c.Prior != "" {
			k, err := ParseKey(c.Prior)
			if err != nil {
				t.Fatal(err)
			}
			parent = &k
		}
		got, err := PageKeys(parent, c.Tokens, c.PageSize)
		if err != nil {
			t.Fatalf("case %d: %v", n, err)
		}
		if len(got) != len(c.Keys) {
			t.Fatalf("case %d: %d keys, want %d", n, len(got), len(c.Keys))
		}
		for i := range got {
			if got[i].String() != c.Keys[i] {
				t.Errorf("case %d page %d: %v, want %s", n, i, got[i], c.Keys[i])
			}
		}
	}
}

func TestPageKeysBadInput(t *testing.T) {
	for _, tc := range []struct {
		tokens []int64
		page   int
		want   error
	}{
		{[]int64{1, -1}, 2, ErrBadToken},
		{[]int64{1 << 32, 1}, 2, ErrBadToken},
		{[]int64{1, 2}, 0, ErrBadConfig},
		{[]int64{1, 2}, -3, ErrBadConfig},
	} {
		if _, err := PageKeys(nil, tc.tokens, tc.page); !errors.Is(err, tc.want) {
			t.Errorf("PageKeys(%v, %d) = %v, want %v", tc.tokens, tc.page, err, tc.want)
		}
	}
	for _, s := range []string{"", "ab", "zz" + string(make([]byte, 62))} {
		if _, err := ParseKey(s); !errors.Is(err, ErrBadKey) {
			t.Errorf("ParseKey(%q) = %v, want ErrBadKey", s, err)
		}
	}
	// A short page hashes nothing, and the chain does not depend on where
	// the tokens were cut.
	a, _ := PageKeys(nil, []int64{1, 2, 3, 4, 5}, 2)
	b, _ := PageKeys(nil, []int64{1, 2, 3, 4}, 2)
	if len(a) != 2 || a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("short last page changed the chain: %v vs %v", a, b)
	}
}
