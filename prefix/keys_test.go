package prefix

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
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

func TestPartKey(t *testing.T) {
	digest := strings.Repeat("0f", 32)
	k, err := ParseKey(digest)
	if err != nil {
		t.Fatal(err)
	}
	maskK, maskV := PartMask("m_0_1_k"), PartMask("m_0_1_v")
	if maskK == maskV {
		t.Fatal("two tags gave one mask")
	}
	for _, tc := range []struct {
		name, page string
		want       Key
	}{
		{"hex digest", digest, k},
		{"upper-case hex", strings.ToUpper(digest), k},
		{"other string", "not-a-digest", StringKey("not-a-digest")},
		{"64 characters, not hex", strings.Repeat("zz", 32), StringKey(strings.Repeat("zz", 32))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PartKey(tc.page, maskK)
			for i := range got {
				if got[i]^maskK[i] != tc.want[i] {
					t.Fatalf("PartKey(%q) = %v, want %v XOR mask", tc.page, got, tc.want)
				}
			}
			if PartKey(tc.page, maskV) == got {
				t.Fatal("K and V parts share a key")
			}
		})
	}
}

// FuzzPageKey: a page string is its 64 hex digits decoded (either case),
// and anything else is hashed.
func FuzzPageKey(f *testing.F) {
	f.Add(strings.Repeat("0123456789abcdefABCDEF", 3)[:64])
	f.Add(strings.Repeat("g", 64))
	f.Add("short")
	f.Add(strings.Repeat("f", 63) + "\x80")
	f.Add(strings.Repeat("9", 63) + ":")
	f.Add(strings.Repeat("A", 63) + "@")
	f.Fuzz(func(t *testing.T, page string) {
		want := StringKey(page)
		if raw, err := hex.DecodeString(page); err == nil && len(raw) == 32 {
			want = Key(raw)
		}
		if got := pageKey(page); got != want {
			t.Fatalf("pageKey(%q) = %v, want %v", page, got, want)
		}
	})
}

// TestExistsPages: leading pages with every part ready, counted from the
// page strings and masks, agree with Exists over PartKeys, wherever the
// first missing part falls, in batches split into runs or not.
func TestExistsPages(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4))
	_, c := tiertest.Format(t, 1, 64<<20, 1<<20)
	const n = 3 * parallelGrain
	s, err := Create(c, Config{Name: "pages", Blocks: 2 * n, BlockBytes: 8, PinsPerClient: 64, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pages := make([]string, n)
	for i := range pages {
		pages[i] = StringKey(strconv.Itoa(i)).String()
	}
	pages[7] = "not a digest" // hashed, not decoded: still a page
	masks := []Key{PartMask("k"), PartMask("v")}
	keys := make([]Key, 2*n)
	if err := PartKeys(keys, pages, masks); err != nil {
		t.Fatal(err)
	}
	payloads := make([][]byte, len(keys))
	for i := range payloads {
		payloads[i] = make([]byte, 8)
	}
	if st, err := s.Set(keys, payloads); err != nil || st[len(st)-1] != Reserved {
		t.Fatalf("set: %v", err)
	}
	if got := s.ExistsPages(pages, masks); got != n {
		t.Fatalf("all stored: %d pages, want %d", got, n)
	}
	for _, miss := range []int{0, 7, 100, parallelGrain, n - 1} {
		for part := range masks {
			k := keys[2*miss+part]
			if _, err := s.Delete([]Key{k}); err != nil {
				t.Fatal(err)
			}
			if got, want := s.ExistsPages(pages, masks), s.Exists(keys)/2; got != miss || want != miss {
				t.Errorf("part %d of page %d missing: ExistsPages %d, Exists %d", part, miss, got, want)
			}
			if _, err := s.Set([]Key{k}, payloads[:1]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := s.ExistsPages(pages, nil); got != 0 {
		t.Errorf("no masks: %d pages", got)
	}
}

// TestExistsPagesManyParts: pages of more parts than touchAhead (a group
// of one page, longer than a read-ahead run) are counted part by part too.
func TestExistsPagesManyParts(t *testing.T) {
	_, c := tiertest.Format(t, 1, 16<<20, 1<<20)
	s, err := Create(c, Config{Name: "parts", Blocks: 512, BlockBytes: 8, PinsPerClient: 64, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	masks := make([]Key, touchAhead+3)
	for i := range masks {
		masks[i] = PartMask(strconv.Itoa(i))
	}
	pages := []string{StringKey("a").String(), StringKey("b").String(), StringKey("c").String()}
	keys := make([]Key, len(pages)*len(masks))
	if err := PartKeys(keys, pages, masks); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Set(keys, make([][]byte, len(keys))); err != nil || st[len(st)-1] != Reserved {
		t.Fatalf("set: %v %v", st, err)
	}
	if got := s.ExistsPages(pages, masks); got != len(pages) {
		t.Fatalf("all stored: %d pages, want %d", got, len(pages))
	}
	// The last part of page 1, past touchAhead keys into its group.
	if _, err := s.Delete([]Key{keys[2*len(masks)-1]}); err != nil {
		t.Fatal(err)
	}
	if got := s.ExistsPages(pages, masks); got != 1 {
		t.Fatalf("page 1's last part missing: %d pages, want 1", got)
	}
}

// TestDecodeHexKeyEveryByte: every byte value at every position of a
// digest decodes, or fails, as encoding/hex has it.
func TestDecodeHexKeyEveryByte(t *testing.T) {
	base := []byte(strings.Repeat("0123456789abcdefABCDEF", 3)[:64])
	for pos := range base {
		for b := range 256 {
			page := slices.Clone(base)
			page[pos] = byte(b)
			var want Key
			_, err := hex.Decode(want[:], page)
			got, ok := decodeHexKey(string(page))
			if ok != (err == nil) || (ok && got != want) {
				t.Fatalf("byte %#x at %d: got %v %v, encoding/hex %v %v", b, pos, got, ok, want, err)
			}
		}
	}
}
