package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/tier"
)

// writeSafetensors writes tensors (name → dtype, shape, bytes) to path.
func writeSafetensors(t *testing.T, path string, tensors map[string]stTensor) {
	t.Helper()
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	var hdr strings.Builder
	var data bytes.Buffer
	hdr.WriteString(`{"__metadata__":{"format":"pt"}`)
	for _, n := range names {
		ts := tensors[n]
		fmt.Fprintf(&hdr, `,%q:{"dtype":%q,"shape":[%d,%d],"data_offsets":[%d,%d]}`, n, ts.dtype, ts.rows, ts.cols, data.Len(), data.Len()+len(ts.data))
		data.Write(ts.data)
	}
	hdr.WriteString("}")
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(hdr.Len()))
	b.WriteString(hdr.String())
	b.Write(data.Bytes())
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
}

type stTensor struct {
	dtype      string
	rows, cols int
	data       []byte
}

func patterned(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + seed*17 + i>>9)
	}
	return b
}

// A DeepSeek-V4.1 checkpoint in two files: each Engram layer's fp8 rows and
// e8m0 scales load into the named table SGLang's host table attaches, as
// its two planes, sealed; loading again leaves it; destroy removes it.
func TestEngramLoadSGLangCheckpoint(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "tier")
	formatTier(t, dev)
	const rows, dim = 3000, 256
	layer := func(id int) (w, s []byte) { return patterned(rows*dim, id), patterned(rows*dim/32, id+100) }
	w1, s1 := layer(1)
	w14, s14 := layer(14)
	writeSafetensors(t, filepath.Join(dir, "model-00001.safetensors"), map[string]stTensor{
		"layers.1.engram.embed.weight": {"F8_E4M3", rows, dim, w1},
		"layers.1.engram.embed.scale":  {"F8_E8M0", rows, dim / 32, s1},
		"layers.1.attn.wq.weight":      {"BF16", 4, 4, make([]byte, 32)},
	})
	writeSafetensors(t, filepath.Join(dir, "model-00002.safetensors"), map[string]stTensor{
		"layers.14.engram.embed.weight": {"F8_E4M3", rows, dim, w14},
		"layers.14.engram.embed.scale":  {"F8_E8M0", rows, dim / 32, s14},
	})
	code, out, errs := runCLI(t, "engram", "load", "--model", "V4.1-test", "--file", dir, "file:"+dev)
	if code != 0 || !strings.Contains(out, "loaded engram/V4.1-test/sglang_engram_1:") || !strings.Contains(out, "loaded engram/V4.1-test/sglang_engram_14:") {
		t.Fatalf("load: exit %d, %q, %q", code, out, errs)
	}
	b, _ := tier.ParseBacking("file:" + dev)
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[int][]byte{1: append(w1, s1...), 14: append(w14, s14...)} {
		o, err := r.OpenObject(engram.SGLangTableName("V4.1-test", id))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := r.ObjectBytes(o)
		if o.State != tier.ObjectSealed || !bytes.Equal(got, want) || !strings.Contains(o.Label, fmt.Sprintf("layers.%d.engram.embed", id)) {
			t.Fatalf("layer %d: %+v, planes equal %v", id, o, bytes.Equal(got, want))
		}
	}
	r.Close()
	if code, out, _ = runCLI(t, "engram", "load", "--model", "V4.1-test", "--file", dir, "--layer", "14", "file:"+dev); code != 0 || !strings.Contains(out, "sealed already") {
		t.Fatalf("second load: exit %d, %q", code, out)
	}
	// Another checkpoint of the same shapes under the same model name: the
	// sealed table is left as it is, and the load says so and fails.
	other := t.TempDir()
	writeSafetensors(t, filepath.Join(other, "model-00002.safetensors"), map[string]stTensor{
		"layers.14.engram.embed.weight": {"F8_E4M3", rows, dim, patterned(rows*dim, 99)},
		"layers.14.engram.embed.scale":  {"F8_E8M0", rows, dim / 32, patterned(rows*dim/32, 199)},
	})
	if code, out, errs = runCLI(t, "engram", "load", "--model", "V4.1-test", "--file", other, "--layer", "14", "file:"+dev); code == 0 || !strings.Contains(errs, "another checkpoint") {
		t.Fatalf("load of another checkpoint over a sealed table: exit %d, %q, %q", code, out, errs)
	}
	// A damaged seal: listed as damaged, and load --force replaces the table.
	r = openFileTier(t, dev)
	o, err := r.OpenObject(engram.SGLangTableName("V4.1-test", 14))
	if err != nil {
		t.Fatal(err)
	}
	seal, err := r.Slice(o.Offset+tier.Offset(o.Chunks*r.Snapshot().Chunks.Size-4096+64), 4)
	if err != nil {
		t.Fatal(err)
	}
	seal[0] ^= 0x40
	r.Close()
	if code, out, _ = runCLI(t, "object", "ls", "file:"+dev); code != 0 || !strings.Contains(out, "sglang_engram_14") || !strings.Contains(out, "damaged") {
		t.Fatalf("object ls with a damaged seal: exit %d, %q", code, out)
	}
	if code, out, errs = runCLI(t, "engram", "load", "--model", "V4.1-test", "--file", dir, "--layer", "14", "--force", "file:"+dev); code != 0 || !strings.Contains(out, "loaded engram/V4.1-test/sglang_engram_14:") {
		t.Fatalf("load --force over a damaged table: exit %d, %q %q", code, out, errs)
	}
	if code, out, _ = runCLI(t, "object", "ls", "file:"+dev); code != 0 || strings.Count(out, "  sealed  ") != 2 {
		t.Fatalf("object ls: exit %d, %q", code, out)
	}
	if code, out, _ = runCLI(t, "object", "verify", "engram/V4.1-test/sglang_engram_14", "file:"+dev); code != 0 || !strings.Contains(out, "verified") {
		t.Fatalf("object verify: exit %d, %q", code, out)
	}
	if code, out, errs = runCLI(t, "engram", "destroy", "--model", "V4.1-test", "--layer", "1", "file:"+dev); code != 0 || !strings.Contains(out, "removed engram/V4.1-test/sglang_engram_1 ") {
		t.Fatalf("destroy: exit %d, %q %q", code, out, errs)
	}
	if code, out, _ = runCLI(t, "object", "rm", "engram/V4.1-test/sglang_engram_14", "file:"+dev); code != 0 {
		t.Fatalf("object rm: exit %d, %q", code, out)
	}
	if code, out, _ = runCLI(t, "object", "ls", "file:"+dev); code != 0 || !strings.Contains(out, "no named objects") {
		t.Fatalf("object ls after removal: %q", out)
	}
	if code, _, errs = runCLI(t, "engram", "destroy", "--model", "V4.1-test", "file:"+dev); code != 1 || !strings.Contains(errs, "no Engram table of model") {
		t.Fatalf("destroy of nothing: exit %d, %q", code, errs)
	}
}

func TestEngramLoadSGLangRefusals(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "tier")
	formatTier(t, dev)
	ck := func(name string, ts map[string]stTensor) string {
		p := filepath.Join(dir, name+".safetensors")
		writeSafetensors(t, p, ts)
		return p
	}
	w := stTensor{"F8_E4M3", 100, 256, make([]byte, 100*256)}
	s := stTensor{"F8_E8M0", 100, 8, make([]byte, 800)}
	for _, tc := range []struct {
		file, model, want string
	}{
		{ck("noscale", map[string]stTensor{"layers.1.engram.embed.weight": w}), "m", "no scale tensor"},
		{ck("bf16", map[string]stTensor{"layers.1.engram.embed.weight": {"BF16", 100, 128, make([]byte, 100*256)}, "layers.1.engram.embed.scale": s}), "m", "not F8_E4M3"},
		{ck("rows", map[string]stTensor{"layers.1.engram.embed.weight": w, "layers.1.engram.embed.scale": {"F8_E8M0", 99, 8, make([]byte, 792)}}), "m", "does not match"},
		{ck("none", map[string]stTensor{"emb": w}), "m", "not a DeepSeek-V4.1 Engram checkpoint"},
		{ck("good", map[string]stTensor{"layers.1.engram.embed.weight": w, "layers.1.engram.embed.scale": s}), "", "--model"},
	} {
		if code, _, errs := runCLI(t, "engram", "load", "--model", tc.model, "--file", tc.file, "file:"+dev); code != 1 || !strings.Contains(errs, tc.want) {
			t.Errorf("%s: exit %d, %q; want %q", tc.file, code, errs, tc.want)
		}
	}
	good := filepath.Join(dir, "good.safetensors")
	if code, _, errs := runCLI(t, "engram", "load", "--model", "m", "--file", good, "--layer", "2", "file:"+dev); code != 1 || !strings.Contains(errs, "no Engram layer 2") {
		t.Errorf("missing layer: exit %d, %q", code, errs)
	}
	// Another geometry under the same model name is refused, not overwritten.
	if code, _, errs := runCLI(t, "engram", "load", "--model", "m", "--file", good, "file:"+dev); code != 0 {
		t.Fatal(errs)
	}
	other := ck("other", map[string]stTensor{"layers.1.engram.embed.weight": {"F8_E4M3", 50, 256, make([]byte, 50*256)}, "layers.1.engram.embed.scale": {"F8_E8M0", 50, 8, make([]byte, 400)}})
	if code, _, errs := runCLI(t, "engram", "load", "--model", "m", "--file", other, "--force", "file:"+dev); code != 1 || !strings.Contains(errs, "another model or geometry") {
		t.Errorf("another geometry: exit %d, %q", code, errs)
	}
}

func TestEngramDestroyOurTables(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "tier")
	formatTier(t, dev)
	geo := filepath.Join(dir, "tiny.json")
	os.WriteFile(geo, []byte(`{"name":"tiny","layer_ids":[1,3],"max_ngram":2,"heads_per_order":2,"base_sizes":[50],
		"seed":7,"vocab":100,"pad_id":0,"row_bytes":64,"dtype":"float32"}`), 0o600)
	for _, l := range []string{"1", "3"} {
		if code, _, errs := runCLI(t, "engram", "load", "--config", geo, "--layer", l, "--synthetic", "file:"+dev); code != 0 {
			t.Fatal(errs)
		}
	}
	if code, out, errs := runCLI(t, "engram", "destroy", "--config", geo, "--layer", "3", "file:"+dev); code != 0 || !strings.Contains(out, "removed engram/tiny/layer3") {
		t.Fatalf("destroy one layer: exit %d, %q %q", code, out, errs)
	}
	if code, out, errs := runCLI(t, "engram", "destroy", "--config", geo, "file:"+dev); code != 0 || out != "removed engram/tiny/layer1\n" {
		t.Fatalf("destroy the rest: exit %d, %q %q", code, out, errs)
	}
	if code, _, errs := runCLI(t, "engram", "destroy", "--config", geo, "file:"+dev); code != 1 || !strings.Contains(errs, "no table of geometry tiny") {
		t.Fatalf("destroy of nothing: exit %d, %q", code, errs)
	}
	if code, out, _ := runCLI(t, "inspect", "-json", "file:"+dev); code != 0 || !strings.Contains(out, `"used": 0`) {
		t.Fatalf("chunks left after destroy: %s", out)
	}
}

// A named object whose header is damaged is listed as damaged, beside the
// others, and `object rm -force` removes it and frees its chunks.
func TestDamagedObjectIsListedAndRemovable(t *testing.T) {
	dev := filepath.Join(t.TempDir(), "tier")
	formatTier(t, dev)
	r := openFileTier(t, dev)
	c, err := r.Attach(tier.ClientOptions{Name: "loader"})
	if err != nil {
		t.Fatal(err)
	}
	victim, err := c.CreateObject("victim", 5000, tier.ObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateObject("bystander", 5000, tier.ObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	chunk := r.Snapshot().Chunks.Size
	hdr, err := r.Slice(victim.Offset+tier.Offset(victim.Chunks*chunk-4096), 8)
	if err != nil {
		t.Fatal(err)
	}
	hdr[0] ^= 0x40 // the header's magic
	c.Close()
	r.Close()

	code, out, errs := runCLI(t, "object", "ls", "file:"+dev)
	if code != 0 || !strings.Contains(out, "bystander") || !regexpMatch(`victim\s+\?\s+damaged\s.*object rm -force victim`, out) {
		t.Fatalf("object ls with a damaged object: exit %d, %q %q", code, out, errs)
	}
	if code, _, errs := runCLI(t, "object", "rm", "victim", "file:"+dev); code == 0 || !strings.Contains(errs, "force") {
		t.Fatalf("object rm of a damaged object without -force: exit %d, %q", code, errs)
	}
	if code, out, errs := runCLI(t, "object", "rm", "-force", "victim", "file:"+dev); code != 0 || !strings.Contains(out, "removed victim") {
		t.Fatalf("object rm -force of a damaged object: exit %d, %q %q", code, out, errs)
	}
	if code, out, _ := runCLI(t, "object", "ls", "file:"+dev); code != 0 || strings.Contains(out, "victim") || !strings.Contains(out, "bystander") {
		t.Fatalf("object ls after the removal: %q", out)
	}
	if code, out, _ := runCLI(t, "inspect", "-deep", "file:"+dev); code != 0 || strings.Contains(out, "victim") {
		t.Fatalf("inspect after the removal: exit %d, %q", code, out)
	}
}

func regexpMatch(pattern, s string) bool { return regexp.MustCompile(pattern).MatchString(s) }

// TestEngramCheckpointDigest: a seal records the layer's checkpoint
// digest; the same bytes under another file name give the same digest,
// one changed byte of the rows another.
func TestEngramCheckpointDigest(t *testing.T) {
	dir := t.TempDir()
	const rows, dim = 3000, 256
	write := func(name string, w []byte) string {
		path := filepath.Join(dir, name)
		writeSafetensors(t, path, map[string]stTensor{
			"layers.2.engram.embed.weight": {"F8_E4M3", rows, dim, w},
			"layers.2.engram.embed.scale":  {"F8_E8M0", rows, dim / 32, patterned(rows*dim/32, 9)},
		})
		return path
	}
	digest := func(path string) string {
		layers, err := engram.FindSGLangLayers([]string{path})
		if err != nil || len(layers) != 1 {
			t.Fatalf("%s: %v, %v", path, layers, err)
		}
		d, err := layers[0].Digest()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	w := patterned(rows*dim, 2)
	a, b := digest(write("a.safetensors", w)), digest(write("b.safetensors", w))
	w[0] ^= 1
	c := digest(write("c.safetensors", w))
	if a != b || a == c || len(a) != 16 {
		t.Fatalf("digests: same bytes %q %q, one byte changed %q", a, b, c)
	}

	dev := filepath.Join(dir, "tier")
	formatTier(t, dev)
	if code, _, errs := runCLI(t, "engram", "load", "--model", "m", "--file", filepath.Join(dir, "a.safetensors"), "file:"+dev); code != 0 {
		t.Fatal(errs)
	}
	r := openFileTier(t, dev)
	defer r.Close()
	o, err := r.OpenObject(engram.SGLangTableName("m", 2))
	if err != nil {
		t.Fatal(err)
	}
	if got := engram.LabelDigest(o.Label); got != a {
		t.Fatalf("the seal's label %q records digest %q, want %q", o.Label, got, a)
	}
}
