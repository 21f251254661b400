package tierflags

import (
	"encoding/json"
	"flag"
	"io"
	"strings"
	"testing"
)

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    int64
		wantErr string
	}{
		{"4096", 4096, ""},
		{"0", 0, ""},
		{"64KiB", 64 << 10, ""},
		{"2MiB", 2 << 20, ""},
		{"2M", 2 << 20, ""},
		{"2MB", 0, "ambiguous; write MiB"},
		{"1GB", 0, "ambiguous; write GiB"},
		{" 3 GiB ", 3 << 30, ""},
		{"1TiB", 1 << 40, ""},
		{"512B", 512, ""},
		{"", 0, "non-negative integer"},
		{"-1", 0, "non-negative integer"},
		{"1.5GiB", 0, "non-negative integer"},
		{"12XB", 0, "non-negative integer"},
		{"99999999TiB", 0, "too large"},
		{"99999999999999999999", 0, "non-negative integer"},
	} {
		got, err := ParseSize(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseSize(%q) = %d, %v; want error containing %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestFormatSizeRoundTrip(t *testing.T) {
	for _, n := range []int64{0, 1, 1000, 1 << 10, 3 << 20, 2 << 30, 5 << 40, 1<<30 + 1} {
		s := FormatSize(n)
		back, err := ParseSize(s)
		if err != nil || back != n {
			t.Errorf("FormatSize(%d) = %q, parses back to %d, %v", n, s, back, err)
		}
	}
}

func TestFlagsOverrideConfig(t *testing.T) {
	cfg := Default()
	cfg.Devices.List = []string{"file:/from/config"}
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.Register(fs)
	if err := fs.Parse([]string{"-device", "shm:a", "-device", "shm:b", "-size", "64MiB", "-nodes", "2"}); err != nil {
		t.Fatal(err)
	}
	if got := cfg.Devices.String(); got != "shm:a,shm:b" {
		t.Errorf("devices = %q; the flags must replace the config's list, not extend it", got)
	}
	opts, err := cfg.Options()
	if err != nil {
		t.Fatal(err)
	}
	if opts.Geometry.DeviceSize != 64<<20 || opts.Geometry.Nodes != 2 || len(opts.Devices) != 2 {
		t.Errorf("options = %+v", opts.Geometry)
	}
}

func TestBadValues(t *testing.T) {
	for _, args := range [][]string{
		{"-device", "nfs:/x"},
		{"-size", "lots"},
		{"-lease-timeout", "0s"},
		{"-lease-timeout", "soon"},
	} {
		cfg := Default()
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg.Register(fs)
		if err := fs.Parse(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	cfg := Default()
	cfg.Coherence = "sometimes"
	if _, err := cfg.Options(); err == nil {
		t.Error("coherence \"sometimes\" accepted")
	}
}

func TestHumanSize(t *testing.T) {
	for n, want := range map[int64]string{
		525696:     "513.4KiB",
		2648105984: "2.5GiB",
		64 << 20:   "64MiB",
		1000:       "1000B",
		0:          "0B",
	} {
		if got := HumanSize(n); got != want {
			t.Errorf("HumanSize(%d) = %s, want %s", n, got, want)
		}
	}
}

// TestDevicesInAConfigFile: "device" takes a list of backings or one as a
// string (comma-separated, as on the command line); anything else is
// refused naming the key and the forms it takes.
func TestDevicesInAConfigFile(t *testing.T) {
	for _, c := range []struct {
		json string
		want []string
		err  string
	}{
		{`"shm:small"`, []string{"shm:small"}, ""},
		{`"dax:/dev/dax0.0, dax:/dev/dax1.0"`, []string{"dax:/dev/dax0.0", "dax:/dev/dax1.0"}, ""},
		{`["shm:a", "shm:b"]`, []string{"shm:a", "shm:b"}, ""},
		{`""`, nil, "names no backing"},
		{`42`, nil, `"device": want a backing`},
	} {
		var d Devices
		err := d.UnmarshalJSON([]byte(c.json))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want an error saying %q", c.json, err, c.err)
			}
			continue
		}
		if err != nil || strings.Join(d.List, "|") != strings.Join(c.want, "|") {
			t.Errorf("%s: %v, %v; want %v", c.json, d.List, err, c.want)
		}
	}
}

func TestSizeInJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string
	}{
		{`"256MiB"`, 256 << 20, ""},
		{`268435456`, 256 << 20, ""},
		{`0`, 0, ""},
		{`1.5`, 0, "want a byte count"},
		{`-1`, 0, "want a byte count"},
		{`1e9`, 0, "want a byte count"},
		{`true`, 0, "want a byte count"},
		{`"64MB"`, 0, "ambiguous"},
	} {
		var s Size
		err := json.Unmarshal([]byte(tc.in), &s)
		switch {
		case tc.err == "" && (err != nil || int64(s) != tc.want):
			t.Errorf("%s: %d, %v; want %d", tc.in, s, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v; want an error saying %q", tc.in, err, tc.err)
		}
	}
}
