package main

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"github.com/cxltier/cxltier/cmd/internal/adminapi"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

// formatTier formats a 16 MiB file-backed tier of 256 KiB chunks at path.
func formatTier(t *testing.T, path string) {
	t.Helper()
	if code, _, errs := runCLI(t, "format", "-device", "file:"+path, "-size", "16MiB", "-chunk", "256KiB"); code != 0 {
		t.Fatalf("format %s: %s", path, errs)
	}
}

// openFileTier opens the tier on file path dev from the test, as a server
// beside the CLI would; the caller closes it.
func openFileTier(t testing.TB, dev string) *tier.Region {
	t.Helper()
	b, err := tier.ParseBacking("file:" + dev)
	if err != nil {
		t.Fatal(err)
	}
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func runCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestFormatThenInspect(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tier")
	code, out, errs := runCLI(t, "format", "-device", "file:"+path, "-size", "16MiB", "-chunk", "256KiB")
	if code != 0 {
		t.Fatalf("format: exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "formatted") || !strings.Contains(errs, "formatting 1 device(s) of 16MiB") {
		t.Errorf("format output: %q / %q", out, errs)
	}

	code, out, errs = runCLI(t, "inspect", path)
	if code != 0 {
		t.Fatalf("inspect: exit %d: %s", code, errs)
	}
	if !strings.Contains(out, "file:"+path) {
		t.Errorf("inspect text does not name the device:\n%s", out)
	}

	code, out, errs = runCLI(t, "inspect", "-json", "file:"+path)
	if code != 0 {
		t.Fatalf("inspect -json: exit %d: %s", code, errs)
	}
	var snap tier.Snapshot
	if err := json.Unmarshal([]byte(out), &snap); err != nil {
		t.Fatalf("inspect -json output is not JSON: %v\n%s", err, out)
	}
	if snap.Size <= 0 || snap.Chunks.Size != 256<<10 || snap.Chunks.Used != 0 || snap.Chunks.Free != snap.Chunks.Total {
		t.Errorf("snapshot of a fresh tier: %+v", snap.Chunks)
	}

	// Formatting over an existing tier needs -force.
	if code, _, errs = runCLI(t, "format", "-device", "file:"+path, "-size", "16MiB"); code != 1 || !strings.Contains(errs, "exist") {
		t.Errorf("format over an existing tier: exit %d, %q", code, errs)
	}
	if code, _, errs = runCLI(t, "format", "-force", "-device", "file:"+path, "-size", "16MiB"); code != 0 {
		t.Errorf("format -force: exit %d, %q", code, errs)
	}
	// ... and no live client: a daemon serving the tier would fault.
	b, _ := tier.ParseBacking("file:" + path)
	live, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := live.Attach(tier.ClientOptions{Name: "server"})
	if err != nil {
		t.Fatal(err)
	}
	if code, _, errs = runCLI(t, "format", "-force", "-device", "file:"+path, "-size", "16MiB"); code != 1 || !strings.Contains(errs, `live client(s) (slot 0 pid`) {
		t.Errorf("format -force under a live client: exit %d, %q", code, errs)
	}
	c.Close()
	live.Close()
	// A damaged tier has no clients to protect: -force is the way out.
	raw, _ := os.ReadFile(path)
	copy(raw[:8], "garbage!")
	os.WriteFile(path, raw, 0o600)
	if code, _, errs = runCLI(t, "format", "-force", "-device", "file:"+path, "-size", "16MiB"); code != 0 {
		t.Errorf("format -force over a damaged header: exit %d, %q", code, errs)
	}
	if code, out, errs = runCLI(t, "inspect", "-deep", path); code != 0 || !strings.Contains(out, "deep check: 0 finding(s)") {
		t.Errorf("inspect -deep of a sound tier: exit %d, %q %q", code, out, errs)
	}
}

func TestInspectRefusesDamage(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	if code, _, errs := runCLI(t, "format", "-device", "file:"+good, "-size", "16MiB"); code != 0 {
		t.Fatalf("format: %s", errs)
	}
	raw, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	truncated := filepath.Join(dir, "truncated")
	if err := os.WriteFile(truncated, raw[:len(raw)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	badMagic := filepath.Join(dir, "magic")
	damaged := bytes.Clone(raw)
	copy(damaged, "NOTATIER")
	if err := os.WriteFile(badMagic, damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{truncated, tier.ErrTruncated.Error()},
		{badMagic, tier.ErrBadMagic.Error()},
		{filepath.Join(dir, "missing"), "no such file"},
	} {
		code, _, errs := runCLI(t, "inspect", tc.path)
		if code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("inspect %s: exit %d, %q; want exit 1 and %q", filepath.Base(tc.path), code, errs, tc.want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: cxltier COMMAND"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{[]string{"inspect"}, 2, "usage: cxltier inspect"},
		{[]string{"format", "-size", "huge"}, 2, "size"},
		{[]string{"format", "-device", "file:/x", "extra"}, 1, "unexpected arguments"},
		{[]string{"help"}, 0, "usage: cxltier COMMAND"},
	} {
		code, _, errs := runCLI(t, tc.args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("cxltier %v: exit %d, %q; want exit %d and %q", tc.args, code, errs, tc.code, tc.want)
		}
	}
}

func TestStatusWithoutDaemon(t *testing.T) {
	// A port that was just free: nothing listens on it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	code, _, errs := runCLI(t, "status", "-addr", addr)
	if code != 1 || !strings.Contains(errs, "is cxltierd running?") {
		t.Errorf("status with no daemon: exit %d, %q", code, errs)
	}
}

// TestHealth: the probe follows what the daemon's /healthz answers.
func TestHealth(t *testing.T) {
	healthy := true
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if req.URL.Path != "/healthz" {
			http.NotFound(rw, req)
			return
		}
		rw.Header().Set(adminapi.HealthHeader, "1") // what cxltierd answers with (its own test checks it does)
		if !healthy {
			rw.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(rw, "unhealthy: tier: header checksum")
			return
		}
		fmt.Fprintln(rw, "ok")
	}))
	defer srv.Close()
	if code, out, errs := runCLI(t, "health", "-addr", srv.URL); code != 0 || out != "ok\n" {
		t.Fatalf("healthy: exit %d, %q, %q", code, out, errs)
	}
	healthy = false
	if code, _, errs := runCLI(t, "health", "-addr", srv.URL); code != 1 || !strings.Contains(errs, "header checksum") {
		t.Fatalf("unhealthy: exit %d, %q", code, errs)
	}
	srv.Close()
	if code, _, errs := runCLI(t, "health", "-addr", srv.URL); code != 1 || !strings.Contains(errs, "is cxltierd running?") {
		t.Fatalf("no daemon: exit %d, %q", code, errs)
	}
}

func TestEngramCommands(t *testing.T) {
	code, out, errs := runCLI(t, "engram", "hash", "--preset", "v4.1-flash", "--layer", "1", "--ids", "0,1,2")
	if code != 0 {
		t.Fatalf("engram hash: exit %d: %s", code, errs)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 {
		t.Fatalf("want one line per position, got %d:\n%s", len(lines), out)
	}
	var first []int64
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil || len(first) != 24 {
		t.Fatalf("line 1 is not a JSON array of 24 rows: %q (%v)", lines[0], err)
	}
	if first[0] != 5702652 || first[1] != 24393184 || first[2] != 39183301 {
		t.Errorf("engram.md check vector: %v", first[:3])
	}
	code, out, _ = runCLI(t, "engram", "multipliers", "--preset", "v4.1-flash", "--layer", "14")
	if code != 0 || strings.TrimSpace(out) != "[67716810739261,51510806800915,30921347202721,82619226485591]" {
		t.Errorf("multipliers: exit %d, %q", code, out)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"engram", "hash", "--preset", "v4.1-flash", "--layer", "1", "--ids", "0,99092"}, "ids[1] = 99092 outside [0, 99092)"},
		{[]string{"engram", "hash", "--preset", "v4.1-flash", "--layer", "2", "--ids", "0"}, "layer 2 is not an Engram layer"},
		{[]string{"engram", "hash", "--preset", "v4.1-flash", "--layer", "1", "--ids", "0,x"}, `position 1: "x"`},
		{[]string{"engram", "hash", "--preset", "nope", "--layer", "1", "--ids", "0"}, `no preset "nope"`},
		{[]string{"engram", "multipliers", "--preset", "demo"}, "--layer is required"},
		{[]string{"engram", "multipliers", "--layer", "1"}, "exactly one of --preset and --config"},
	} {
		code, _, errs := runCLI(t, tc.args...)
		if code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %q", tc.args, code, errs, tc.want)
		}
	}
}

func TestPrefixKeysMatchVectors(t *testing.T) {
	raw, err := os.ReadFile("../../prefix/testdata/keys.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		PageSize int      `json:"page_size"`
		Prior    string   `json:"prior"`
		Tokens   []int64  `json:"tokens"`
		Keys     []string `json:"keys"`
	}
	if err := json.Unmarshal(raw, &cases); err != nil || len(cases) == 0 {
		t.Fatalf("vectors: %v", err)
	}
	for i, c := range cases {
		toks := make([]string, len(c.Tokens))
		for j, v := range c.Tokens {
			toks[j] = strconv.FormatInt(v, 10)
		}
		args := []string{"prefix", "keys", "--page-size", strconv.Itoa(c.PageSize), "--tokens", strings.Join(toks, ",")}
		if c.Prior != "" {
			args = append(args, "--prior", c.Prior)
		}
		code, out, errs := runCLI(t, args...)
		if code != 0 {
			t.Fatalf("case %d: exit %d: %s", i, code, errs)
		}
		if got, want := strings.Fields(out), c.Keys; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("case %d: keys\n%v\nwant\n%v", i, got, want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"prefix", "keys", "--page-size", "0", "--tokens", "1"}, "--page-size must be positive"},
		{[]string{"prefix", "keys", "--page-size", "2", "--tokens", "1,y"}, `"y"`},
		{[]string{"prefix", "keys", "--page-size", "1", "--tokens", "1", "--prior", "abc"}, "--prior"},
		{[]string{"prefix", "stats", "--name", "x", filepath.Join(t.TempDir(), "none")}, "none"},
		{[]string{"prefix", "snapshot", "/tmp/x"}, "--out is required"},
		{[]string{"prefix", "restore", "/tmp/x"}, "--in is required"},
	} {
		code, _, errs := runCLI(t, tc.args...)
		if code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %q", tc.args, code, errs, tc.want)
		}
	}
	if code, _, errs := runCLI(t, "prefix", "frob"); code != 2 || !strings.Contains(errs, `unknown subcommand "frob"`) {
		t.Errorf("unknown subcommand: exit %d, %q", code, errs)
	}
}

func TestPrefixIndexCommands(t *testing.T) {
	dir := t.TempDir()
	tierA, tierB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	formatTier(t, tierA)
	formatTier(t, tierB)
	code, out, errs := runCLI(t, "prefix", "create", "--name", "m", "--blocks", "8", "--block-bytes", "64KiB", tierA)
	if code != 0 || !strings.Contains(out, `created prefix index "m": 8 blocks of 64KiB, 16 entries, 1 shard(s)`) {
		t.Fatalf("create: exit %d, %q %q", code, out, errs)
	}
	if code, _, errs := runCLI(t, "prefix", "create", "--name", "m", "--blocks", "8", "--block-bytes", "64KiB", tierA); code != 1 || !strings.Contains(errs, "exist") {
		t.Errorf("second create: exit %d, %q", code, errs)
	}
	if code, out, errs := runCLI(t, "prefix", "create", "--name", "sh", "--blocks", "8", "--block-bytes", "4KiB", "--shards", "4", tierA); code != 0 || !strings.Contains(out, "4 shard(s)") {
		t.Errorf("create with 4 shards: exit %d, %q %q", code, out, errs)
	}
	if code, _, errs := runCLI(t, "prefix", "create", "--name", "sh3", "--blocks", "8", "--block-bytes", "4KiB", "--shards", "3", tierA); code != 1 || !strings.Contains(errs, "power of two") {
		t.Errorf("create with 3 shards: exit %d, %q", code, errs)
	}

	// Fill it from this process through the library, as a server would.
	b, err := tier.ParseBacking("file:" + tierA)
	if err != nil {
		t.Fatal(err)
	}
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.Attach(tier.ClientOptions{Name: "filler"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := prefix.Open(c, "m")
	if err != nil {
		t.Fatal(err)
	}
	var keys []prefix.Key
	var payloads [][]byte
	for i := range 5 {
		keys = append(keys, prefix.StringKey(strconv.Itoa(i)))
		payloads = append(payloads, bytes.Repeat([]byte{byte(i + 1)}, 1000*(i+1)))
	}
	if _, err := s.Set(keys, payloads); err != nil {
		t.Fatal(err)
	}
	s.Close()
	c.Close()
	r.Close()

	code, out, errs = runCLI(t, "prefix", "stats", "--name", "m", "-json", tierA)
	var st prefix.Stats
	if code != 0 || json.Unmarshal([]byte(out), &st) != nil || st.Ready != 5 || st.UsedBlocks != 5 || st.LayoutVersion != prefix.LayoutVersion {
		t.Fatalf("stats: exit %d, %q %q", code, out, errs)
	}
	if code, out, errs = runCLI(t, "prefix", "check", "--name", "m", tierA); code != 0 || !strings.Contains(out, "ok (5 ready entries checked)") {
		t.Errorf("check: exit %d, %q %q", code, out, errs)
	}
	snap := filepath.Join(dir, "m.zst")
	if code, out, errs = runCLI(t, "prefix", "snapshot", "--name", "m", "--out", snap, tierA); code != 0 || !strings.Contains(out, "wrote 5 entries") {
		t.Fatalf("snapshot: exit %d, %q %q", code, out, errs)
	}
	if code, _, errs = runCLI(t, "prefix", "restore", "--name", "m", "--in", snap, tierB); code != 1 || !strings.Contains(errs, "not found") {
		t.Errorf("restore into a tier without the index and no sizing: exit %d, %q", code, errs)
	}
	code, out, errs = runCLI(t, "prefix", "restore", "--name", "m", "--in", snap, "--blocks", "8", "--block-bytes", "64KiB", tierB)
	if code != 0 || !strings.Contains(out, "restored 5 of 5 entries") {
		t.Fatalf("restore: exit %d, %q %q", code, out, errs)
	}
	if code, out, _ = runCLI(t, "prefix", "check", "--name", "m", tierB); code != 0 {
		t.Errorf("check after restore: exit %d, %q", code, out)
	}

	// A damaged snapshot is refused, and nothing is half-restored silently.
	raw, _ := os.ReadFile(snap)
	raw[len(raw)/2] ^= 0xff
	bad := filepath.Join(dir, "bad.zst")
	os.WriteFile(bad, raw, 0o600)
	if code, _, errs = runCLI(t, "prefix", "restore", "--name", "m", "--in", bad, tierA); code != 1 || errs == "" {
		t.Errorf("damaged snapshot: exit %d, %q", code, errs)
	}
	// A failed restore that created its index removes it again (16 failed
	// restores once filled a tier to 96.5%).
	code, _, errs = runCLI(t, "prefix", "restore", "--name", "fresh", "--in", bad, "--blocks", "8", "--block-bytes", "64KiB", tierB)
	if code != 1 || !strings.Contains(errs, "the index it created was removed") {
		t.Errorf("failed restore into a new index: exit %d, %q", code, errs)
	}
	if code, _, errs = runCLI(t, "prefix", "stats", "--name", "fresh", tierB); code != 1 || !strings.Contains(errs, "not found") {
		t.Errorf("the index a failed restore created is still there: exit %d, %q", code, errs)
	}
}

func TestEngramLoadAndVerify(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "tier")
	formatTier(t, dev)
	geo := filepath.Join(dir, "geo.json")
	os.WriteFile(geo, []byte(`{"name":"tiny","layer_ids":[1,3],"max_ngram":2,"heads_per_order":2,"base_sizes":[50],
		"seed":7,"vocab":100,"pad_id":0,"row_bytes":64,"dtype":"float32"}`), 0o600)
	g, err := engram.LoadGeometry(geo)
	if err != nil {
		t.Fatal(err)
	}
	h, _ := engram.NewHasher(g)
	rows, _ := h.Rows(1)
	data := make([]byte, rows*64)
	for i := range rows {
		engram.SyntheticRow(9, i, data[i*64:(i+1)*64])
	}
	raw := filepath.Join(dir, "layer1.bin")
	os.WriteFile(raw, data, 0o600)

	code, out, errs := runCLI(t, "engram", "load", "--config", geo, "--layer", "1", "--file", raw, dev)
	if code != 0 || !strings.Contains(out, "loaded engram/tiny/layer1") || !strings.Contains(out, "verified") ||
		!strings.Contains(errs, fmt.Sprintf("%d/%d rows (100%%)", rows, rows)) {
		t.Fatalf("load: exit %d, %q, %q", code, out, errs)
	}
	if code, out, _ = runCLI(t, "engram", "verify", "--config", geo, "--layer", "1", dev); code != 0 || !strings.Contains(out, "ok") {
		t.Errorf("verify: exit %d, %q", code, out)
	}
	if code, _, errs = runCLI(t, "engram", "load", "--config", geo, "--layer", "1", "--file", raw, dev); code != 1 || !strings.Contains(errs, "exists") {
		t.Errorf("second load: exit %d, %q", code, errs)
	}

	// safetensors: the right tensor loads; wrong dtype, shape or name are refused.
	st := func(name, dtype string, shape string, n int) string {
		p := filepath.Join(dir, name+".safetensors")
		hdr := fmt.Sprintf(`{"__metadata__":{},"emb":{"dtype":%q,"shape":%s,"data_offsets":[0,%d]}}`, dtype, shape, n)
		var b bytes.Buffer
		binary.Write(&b, binary.LittleEndian, uint64(len(hdr)))
		b.WriteString(hdr)
		b.Write(data[:n])
		os.WriteFile(p, b.Bytes(), 0o600)
		return p
	}
	rows, _ = h.Rows(3) // layer 3 from here on
	data = make([]byte, rows*64)
	for i := range rows {
		engram.SyntheticRow(5, i, data[i*64:(i+1)*64])
	}
	raw = filepath.Join(dir, "layer3.bin")
	os.WriteFile(raw, data, 0o600)
	good := st("good", "F32", fmt.Sprintf("[%d,16]", rows), int(rows*64))
	for _, tc := range []struct {
		file, tensor, want string
	}{
		{st("bf16", "BF16", fmt.Sprintf("[%d,32]", rows), int(rows*64)), "", "is BF16"},
		{st("short", "F32", fmt.Sprintf("[%d,16]", rows-1), int((rows-1)*64)), "", fmt.Sprintf("%d rows of 64 B", rows-1)},
		{good, "other", `no tensor "other"`},
		{raw + ".missing", "", "no such file"},
	} {
		if code, _, errs := runCLI(t, "engram", "load", "--config", geo, "--layer", "3", "--file", tc.file, "--tensor", tc.tensor, dev); code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("%s: exit %d, %q; want %q", tc.file, code, errs, tc.want)
		}
	}
	os.WriteFile(raw+".cut", data[:len(data)-1], 0o600)
	if code, _, errs := runCLI(t, "engram", "load", "--config", geo, "--layer", "3", "--file", raw+".cut", dev); code != 1 || !strings.Contains(errs, "bytes") {
		t.Errorf("truncated raw file: exit %d, %q", code, errs)
	}
	if code, out, errs = runCLI(t, "engram", "load", "--config", geo, "--layer", "3", "--file", good, dev); code != 0 {
		t.Fatalf("safetensors load: exit %d, %q %q", code, out, errs)
	}
	b, _ := tier.ParseBacking("file:" + dev)
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		t.Fatal(err)
	}
	tb, err := engram.OpenTable(r, g, h, 3, true)
	if err != nil {
		t.Fatal(err)
	}
	row := make([]byte, 64)
	for _, i := range []int64{0, rows / 2, rows - 1} {
		r.ReadAt(row, tb.RowOffset(i))
		if !bytes.Equal(row, data[i*64:(i+1)*64]) {
			t.Errorf("row %d of the safetensors load differs from the file", i)
		}
	}
	// Damage one row in the tier: verify names the checksum.
	r.WriteAt([]byte{0xff}, tb.RowOffset(rows/2))
	r.Close()
	if code, _, errs = runCLI(t, "engram", "verify", "--config", geo, "--layer", "3", dev); code != 1 || !strings.Contains(errs, "checksum") {
		t.Errorf("verify of a damaged table: exit %d, %q", code, errs)
	}
	if code, _, errs = runCLI(t, "engram", "load", "--config", geo, "--layer", "1", dev); code != 1 || !strings.Contains(errs, "exactly one of --file and --synthetic") {
		t.Errorf("no source: exit %d, %q", code, errs)
	}
}

func TestPrefixTenantKey(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "tier")
	formatTier(t, dev)
	keyFile := filepath.Join(dir, "key")
	os.WriteFile(keyFile, []byte("tenant-secret\n"), 0o600)
	if code, _, errs := runCLI(t, "prefix", "create", "--name", "t", "--blocks", "4", "--block-bytes", "4KiB", "--key-file", keyFile, dev); code != 0 {
		t.Fatal(errs)
	}
	snap := filepath.Join(dir, "t.zst")
	if code, _, errs := runCLI(t, "prefix", "snapshot", "--name", "t", "--out", snap, dev); code != 1 || !strings.Contains(errs, "wrong or missing index key") {
		t.Errorf("snapshot without the key: exit %d, %q", code, errs)
	}
	if code, _, errs := runCLI(t, "prefix", "snapshot", "--name", "t", "--out", snap, "--key-file", keyFile, dev); code != 0 {
		t.Errorf("snapshot with the key: exit %d, %q", code, errs)
	}
	t.Setenv("CXLTIER_PREFIX_KEY", "tenant-secret")
	if code, _, errs := runCLI(t, "prefix", "snapshot", "--name", "t", "--out", snap, dev); code != 0 {
		t.Errorf("snapshot with the key from the environment: exit %d, %q", code, errs)
	}
	t.Setenv("CXLTIER_PREFIX_KEY", "")
	if code, out, errs := runCLI(t, "prefix", "stats", "--name", "t", dev); code != 0 || !strings.Contains(out, `index "t"`) {
		t.Errorf("stats need no key: exit %d, %q %q", code, out, errs)
	}
	if code, out, errs := runCLI(t, "prefix", "destroy", "--name", "t", dev); code != 0 || !strings.Contains(out, "destroyed") {
		t.Errorf("destroy: exit %d, %q %q", code, out, errs)
	}
	if code, _, errs := runCLI(t, "prefix", "stats", "--name", "t", dev); code != 1 || !strings.Contains(errs, "not found") {
		t.Errorf("stats after destroy: exit %d, %q", code, errs)
	}
}

// TestEngramHashRawIDs: --raw maps ids through the geometry's lookup table
// (a file beside the geometry) and then hashes exactly as the compressed
// ids would; an id beyond the table is refused with its position.
func TestEngramHashRawIDs(t *testing.T) {
	dir := t.TempDir()
	lookup := make([]byte, 8*6)
	for i, v := range []uint64{5, 3, 99091, 0, 7, 2} {
		binary.LittleEndian.PutUint64(lookup[8*i:], v)
	}
	if err := os.WriteFile(filepath.Join(dir, "lookup.bin"), lookup, 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := engram.Preset("v4.1-flash")
	if err != nil {
		t.Fatal(err)
	}
	g.Lookup = "lookup.bin"
	raw, _ := json.Marshal(g)
	geo := filepath.Join(dir, "v41.json")
	if err := os.WriteFile(geo, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	_, viaRaw, errs := runCLI(t, "engram", "hash", "--config", geo, "--layer", "14", "--raw", "--ids", "0,1,2,3,4,5")
	_, direct, _ := runCLI(t, "engram", "hash", "--config", geo, "--layer", "14", "--ids", "5,3,99091,0,7,2")
	if viaRaw == "" || viaRaw != direct {
		t.Fatalf("--raw gave %q (%s), compressed ids gave %q", viaRaw, errs, direct)
	}
	code, _, errs := runCLI(t, "engram", "hash", "--config", geo, "--layer", "14", "--raw", "--ids", "0,6")
	if code == 0 || !strings.Contains(errs, "raw id 6 at position 1 outside [0, 6)") {
		t.Fatalf("raw id beyond the table: exit %d, %q", code, errs)
	}
	code, _, errs = runCLI(t, "engram", "hash", "--preset", "demo", "--layer", "1", "--raw", "--ids", "0")
	if code == 0 || !strings.Contains(errs, "no lookup table") {
		t.Fatalf("--raw without a table: exit %d, %q", code, errs)
	}
}

// TestDestroyDamagedHeader: a tier whose header is damaged says how to get
// rid of it, and destroy -force does (it used to be refused even with
// -force, with nothing saying what would work); a file that is no tier at
// all (bad magic) is never removed.
// TestSeparateTiersAreAUsageError: two separate tiers given as the devices
// of one are refused by every command that takes one tier (exit 2, naming
// them), and destroy -force removes neither. It used to call them one
// damaged tier, and -force deleted both.
func TestSeparateTiersAreAUsageError(t *testing.T) {
	dir := t.TempDir()
	var devs []string
	for _, name := range []string{"small", "kv"} {
		path := filepath.Join(dir, name)
		if code, _, errs := runCLI(t, "format", "-device", "file:"+path, "-size", "16MiB", "-chunk", "256KiB"); code != 0 {
			t.Fatalf("format: %s", errs)
		}
		devs = append(devs, "file:"+path)
	}
	for _, args := range [][]string{{"destroy", "-force"}, {"destroy"}, {"inspect"}, {"repair"}} {
		code, _, errs := runCLI(t, append(args, devs...)...)
		if code != 2 || !strings.Contains(errs, "whole tier of their own") || !strings.Contains(errs, devs[1]) {
			t.Errorf("%v on two separate tiers: exit %d, %q", args, code, errs)
		}
	}
	for _, d := range devs {
		if _, err := os.Stat(strings.TrimPrefix(d, "file:")); err != nil {
			t.Fatalf("%s is gone: %v", d, err)
		}
	}
}

func TestDestroyDamagedHeader(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tier")
	if code, _, errs := runCLI(t, "format", "-device", "file:"+path, "-size", "16MiB"); code != 0 {
		t.Fatalf("format: %s", errs)
	}
	raw, _ := os.ReadFile(path)
	raw[100] ^= 0xff // inside the header, past the magic: its checksum fails
	os.WriteFile(path, raw, 0o600)
	if code, _, errs := runCLI(t, "destroy", path); code == 0 || !strings.Contains(errs, "destroy -force removes it") {
		t.Fatalf("destroy of a damaged tier: exit %d, %q", code, errs)
	}
	if code, out, errs := runCLI(t, "destroy", "-force", path); code != 0 || !strings.Contains(out, "destroyed") {
		t.Fatalf("destroy -force of a damaged tier: exit %d, %q %q", code, out, errs)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the damaged tier is still there: %v", err)
	}
	other := filepath.Join(t.TempDir(), "notes.txt")
	os.WriteFile(other, bytes.Repeat([]byte("not a tier "), 1000), 0o600)
	if code, _, errs := runCLI(t, "destroy", "-force", other); code == 0 || !strings.Contains(errs, "not removed") {
		t.Fatalf("destroy -force of a file that is no tier: exit %d, %q", code, errs)
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("a file that is no tier was removed: %v", err)
	}
}

// TestDestroyRemovesLeftSockets: the sockets (and lock files) a daemon or
// uplink killed without closing left beside the tier go with it, and
// nothing else in the directory does.
func TestDestroyRemovesLeftSockets(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "tier")
	formatTier(t, dev)
	r := openFileTier(t, dev)
	var left []string
	for _, role := range []string{"node0", "uplink-node0"} {
		p, err := r.SocketPathFor(role)
		if err != nil {
			t.Fatal(err)
		}
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		ln.SetUnlinkOnClose(false) // as a killed process leaves it
		ln.Close()
		left = append(left, p)
	}
	if err := os.WriteFile(left[1]+".lock", nil, 0o600); err != nil {
		t.Fatal(err)
	}
	left = append(left, left[1]+".lock")
	bystander := filepath.Join(dir, "cxltier-notes.sock.txt")
	if err := os.WriteFile(bystander, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if code, out, errs := runCLI(t, "destroy", "file:"+dev); code != 0 || strings.Count(out, "removed ") != 3 {
		t.Fatalf("destroy: exit %d, %q, %q", code, out, errs)
	}
	for _, p := range left {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s is still there", p)
		}
	}
	if _, err := os.Stat(bystander); err != nil {
		t.Errorf("destroy removed a file that is not the tier's: %v", err)
	}
}
