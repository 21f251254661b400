package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A page put from a file comes back byte for byte through get, through a
// snapshot into another tier, and under the tenant key it was stored with.
func TestPrefixPutGet(t *testing.T) {
	dir := t.TempDir()
	tierA, tierB := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	formatTier(t, tierA)
	formatTier(t, tierB)
	if code, _, errs := runCLI(t, "prefix", "create", "--name", "m", "--blocks", "4", "--block-bytes", "64KiB", tierA); code != 0 {
		t.Fatal(errs)
	}
	code, keys, errs := runCLI(t, "prefix", "keys", "--page-size", "2", "--tokens", "1,2,3,4")
	if code != 0 {
		t.Fatal(errs)
	}
	key := strings.Fields(keys)[1]
	page := bytes.Repeat([]byte("kv page "), 4096) // 32 KiB
	in := filepath.Join(dir, "page")
	os.WriteFile(in, page, 0o600)

	if code, out, errs := runCLI(t, "prefix", "put", "--name", "m", "--key", key, "--in", in, tierA); code != 0 || !strings.Contains(out, "stored 32KiB under "+key) {
		t.Fatalf("put: exit %d, %q %q", code, out, errs)
	}
	if code, out, errs := runCLI(t, "prefix", "put", "--name", "m", "--key", key, "--in", in, tierA); code != 0 || !strings.Contains(out, "already: left as it is") {
		t.Errorf("second put: exit %d, %q %q", code, out, errs)
	}
	snap := filepath.Join(dir, "m.zst")
	if code, out, errs := runCLI(t, "prefix", "snapshot", "--name", "m", "--out", snap, tierA); code != 0 || !strings.Contains(out, "wrote 1 entries") {
		t.Fatalf("snapshot: exit %d, %q %q", code, out, errs)
	}
	if code, _, errs := runCLI(t, "prefix", "restore", "--name", "m", "--in", snap, "--blocks", "4", "--block-bytes", "64KiB", tierB); code != 0 {
		t.Fatal(errs)
	}
	out := filepath.Join(dir, "back")
	if code, msg, errs := runCLI(t, "prefix", "get", "--name", "m", "--key", key, "--out", out, tierB); code != 0 || !strings.Contains(msg, "checksum verified") {
		t.Fatalf("get: exit %d, %q %q", code, msg, errs)
	}
	if got, _ := os.ReadFile(out); !bytes.Equal(got, page) {
		t.Errorf("get wrote %d bytes that are not the page put", len(got))
	}

	other := strings.Fields(keys)[0]
	big := filepath.Join(dir, "big")
	os.WriteFile(big, make([]byte, 64<<10+1), 0o600)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"prefix", "get", "--name", "m", "--key", other, "--out", out, tierB}, "key not found"},
		{[]string{"prefix", "put", "--name", "m", "--key", other, "--in", big, tierA}, "larger than the index's blocks of 64KiB"},
		{[]string{"prefix", "put", "--name", "m", "--key", other, "--in", dir, tierA}, "not a regular file"},
		{[]string{"prefix", "put", "--name", "m", "--key", other, "--in", filepath.Join(dir, "none"), tierA}, "no such file"},
		{[]string{"prefix", "put", "--name", "m", "--in", in, tierA}, "--key is required"},
		{[]string{"prefix", "put", "--name", "m", "--key", "xyz", "--in", in, tierA}, "--key:"},
		{[]string{"prefix", "put", "--name", "m", "--key", other, tierA}, "--in is required"},
		{[]string{"prefix", "get", "--name", "m", "--key", other, tierA}, "--out is required"},
	} {
		if code, _, errs := runCLI(t, tc.args...); code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %q", tc.args[:2], code, errs, tc.want)
		}
	}
	if _, err := os.Stat(out); err != nil {
		t.Errorf("a failed get removed the earlier file: %v", err)
	}

	// A keyed index: put and get need its key.
	keyFile := filepath.Join(dir, "key")
	os.WriteFile(keyFile, []byte("tenant-secret\n"), 0o600)
	if code, _, errs := runCLI(t, "prefix", "create", "--name", "t", "--blocks", "4", "--block-bytes", "64KiB", "--key-file", keyFile, tierA); code != 0 {
		t.Fatal(errs)
	}
	if code, _, errs := runCLI(t, "prefix", "put", "--name", "t", "--key", key, "--in", in, tierA); code != 1 || !strings.Contains(errs, "wrong or missing index key") {
		t.Errorf("put without the key: exit %d, %q", code, errs)
	}
	if code, _, errs := runCLI(t, "prefix", "put", "--name", "t", "--key", key, "--in", in, "--key-file", keyFile, tierA); code != 0 {
		t.Errorf("put with the key: exit %d, %q", code, errs)
	}
	if code, _, errs := runCLI(t, "prefix", "get", "--name", "t", "--key", key, "--out", out, tierA); code != 1 || !strings.Contains(errs, "wrong or missing index key") {
		t.Errorf("get without the key: exit %d, %q", code, errs)
	}
}
