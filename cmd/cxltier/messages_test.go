package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestMessagesSayWhatToDo: errors a newcomer meets first name the way out.
func TestMessagesSayWhatToDo(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "tier")
	formatTier(t, dev)

	code, _, errs := runCLI(t, "format", "-device", "file:"+dev, "-size", "16MiB", "-chunk", "256KiB")
	if code != 1 || !strings.Contains(errs, "format -force replaces it") || !strings.Contains(errs, "cxltier destroy") {
		t.Errorf("format over an existing tier: exit %d, %q", code, errs)
	}

	if code, _, errs := runCLI(t, "prefix", "create", "--name", "m", "--blocks", "8", "--block-bytes", "4KiB", "file:"+dev); code != 0 {
		t.Fatal(errs)
	}
	snap := filepath.Join(dir, "m.zst")
	if code, _, errs := runCLI(t, "prefix", "snapshot", "--name", "m", "--out", snap, "file:"+dev); code != 0 {
		t.Fatal(errs)
	}
	code, _, errs = runCLI(t, "prefix", "restore", "--name", "r2", "--in", snap, "file:"+dev)
	if code != 1 || !strings.Contains(errs, `index "r2" does not exist`) || !strings.Contains(errs, "--blocks N --block-bytes SIZE") {
		t.Errorf("restore into a missing index: exit %d, %q", code, errs)
	}
	if code, out, errs := runCLI(t, "prefix", "restore", "--name", "r2", "--in", snap, "--blocks", "8", "--block-bytes", "4KiB", "file:"+dev); code != 0 {
		t.Errorf("restore creating the index: exit %d, %q %q", code, out, errs)
	}
}
