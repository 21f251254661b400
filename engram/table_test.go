package engram

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// tinyGeometry is small enough for a test tier: ~2×4×1000 rows per layer.
func tinyGeometry() Geometry {
	return Geometry{Name: "tiny", LayerIDs: []int{1, 3}, MaxNgram: 3, Heads: 4, BaseSizes: []int64{1000, 1200},
		Seed: 7, Vocab: 500, PadID: 2, RowBytes: 272, DType: "fp8+scales"}
}

func testTier(t testing.TB, devices int) (*tier.Region, *tier.Client) {
	t.Helper()
	dir := t.TempDir()
	var devs []tier.Backing
	for i := range devices {
		b, _ := tier.ParseBacking("file:" + filepath.Join(dir, "dev"+string(rune('0'+i))))
		devs = append(devs, b)
	}
	g := tier.DefaultGeometry()
	g.DeviceSize, g.ChunkSize, g.Stripe = 16<<20, 256<<10, 256<<10
	r, err := tier.Format(tier.Options{Devices: devs, Geometry: g})
	if err != nil {
		t.Fatal(err)
	}
	c, err := r.Attach(tier.ClientOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); r.Close() })
	return r, c
}

func TestTablesAndPrefetch(t *testing.T) {
	for _, devices := range []int{1, 2} {
		t.Run(strings.Repeat("dev", devices), func(t *testing.T) {
			r, c := testTier(t, devices)
			g := tinyGeometry()
			h, err := NewHasher(g)
			if err != nil {
				t.Fatal(err)
			}
			var tables []*Table
			var progress bytes.Buffer
			for _, l := range g.LayerIDs {
				tb, err := CreateTable(c, g, h, l, func(i int64, b []byte) error { SyntheticRow(l, i, b); return nil }, &progress)
				if err != nil {
					t.Fatal(err)
				}
				tables = append(tables, tb)
				if _, err := OpenTable(r, g, h, l, true); err != nil {
					t.Fatalf("reopen with verify: %v", err)
				}
			}
			if !strings.Contains(progress.String(), "(100%)") {
				t.Errorf("no progress output: %q", progress.String())
			}
			// Rows never straddle a stripe on a striped tier.
			for i := int64(0); i < tables[0].Rows; i++ {
				if _, err := r.Slice(tables[0].RowOffset(i), g.RowBytes); err != nil {
					t.Fatalf("row %d: %v", i, err)
				}
			}
			eng := kernels.NewCPU(0)
			defer eng.Close()
			plain, err := NewPrefetcher(eng, c, h, tables, PrefetchOptions{Slots: 512})
			if err != nil {
				t.Fatal(err)
			}
			seqs := [][]int64{{1, 2, 3, 4, 5}, {9, 9, 9}, {1, 2, 3, 4, 5}}
			for range 2 { // without the cache every row is fetched, every time
				pd, err := plain.Prefetch(1, nil, seqs)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := pd.Wait(); err != nil {
					t.Fatal(err)
				}
				checkRows(t, plain, h, eng, 1, seqs, pd.Slots)
			}
			if m := plain.Metrics(); m.Hits.Load() != 0 || m.Fetched.Load() != m.Rows.Load() {
				t.Errorf("without the cache: %d hits, %d of %d rows fetched", m.Hits.Load(), m.Fetched.Load(), m.Rows.Load())
			}
			plain.Close()
			p, err := NewPrefetcher(eng, c, h, tables, PrefetchOptions{Slots: 512, Deadline: time.Second, Cache: true})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			for round := range 2 {
				for _, l := range g.LayerIDs {
					pd, err := p.Prefetch(l, nil, seqs)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := pd.Wait(); err != nil {
						t.Fatal(err)
					}
					checkRows(t, p, h, eng, l, seqs, pd.Slots)
				}
				if round == 0 && p.Metrics().Hits.Load() == 0 {
					t.Error("repeated n-grams in one call did not hit the cache")
				}
			}
			m := p.Metrics()
			if m.Fetched.Load()+m.Hits.Load() != m.Rows.Load() || m.Calls.Load() != 4 {
				t.Errorf("metrics: %d fetched + %d hits != %d rows, %d calls", m.Fetched.Load(), m.Hits.Load(), m.Rows.Load(), m.Calls.Load())
			}
			before := m.Fetched.Load()
			if pd, _ := p.Prefetch(1, nil, seqs); pd != nil {
				pd.Wait()
			}
			if m.Fetched.Load() != before {
				t.Errorf("a fully cached batch fetched %d rows", m.Fetched.Load()-before)
			}
		})
	}
}

// checkRows reads every slot back and compares with the synthetic row the
// hash names.
func checkRows(t testing.TB, p *Prefetcher, h *Hasher, eng *kernels.CPU, layer int, seqs [][]int64, slots []int32) {
	t.Helper()
	checkRowsAfter(t, p, h, layer, nil, seqs, slots)
}

// checkRowsAfter is checkRows for sequences with histories, on any engine.
func checkRowsAfter(t testing.TB, p *Prefetcher, h *Hasher, layer int, hists, seqs [][]int64, slots []int32) {
	t.Helper()
	var rows []int64
	for b, s := range seqs {
		rows, _ = h.Hash(rows, layer, history(hists, b), s)
	}
	if len(slots) != len(rows) {
		t.Fatalf("layer %d: %d slots for %d rows", layer, len(slots), len(rows))
	}
	buf, _ := p.CacheBuffer(layer)
	mem := make([]byte, buf.Len())
	if err := p.eng.Download(mem, buf, 0); err != nil {
		t.Fatal(err)
	}
	rb := h.Geometry().RowBytes
	want := make([]byte, rb)
	for i, row := range rows {
		if slots[i] < 0 || int64(slots[i]+1)*rb > buf.Len() {
			t.Fatalf("layer %d position/head %d: slot %d", layer, i, slots[i])
		}
		SyntheticRow(layer, row, want)
		got := mem[int64(slots[i])*rb : int64(slots[i]+1)*rb]
		if !bytes.Equal(got, want) {
			t.Fatalf("layer %d position/head %d: slot %d does not hold row %d", layer, i, slots[i], row)
		}
	}
}

func TestCacheTooSmall(t *testing.T) {
	_, c := testTier(t, 1)
	g := tinyGeometry()
	h, _ := NewHasher(g)
	tb, err := CreateTable(c, g, h, 1, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	eng := kernels.NewCPU(1)
	defer eng.Close()
	p, err := NewPrefetcher(eng, c, h, []*Table{tb}, PrefetchOptions{Slots: 10, Cache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := p.Prefetch(1, nil, [][]int64{{1, 2, 3}}); !errors.Is(err, ErrCacheTooSmall) {
		t.Fatalf("24 rows into 10 slots: %v", err)
	}
	if _, err := p.Prefetch(3, nil, [][]int64{{1}}); !errors.Is(err, ErrInput) {
		t.Fatalf("layer without a table: %v", err)
	}
	if _, err := p.Prefetch(1, nil, [][]int64{{500}}); !errors.Is(err, ErrInput) {
		t.Fatalf("id = V: %v", err)
	}
}

func TestRawFileRefusals(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "t.raw")
	os.WriteFile(path, make([]byte, 1000), 0o600)
	if _, _, err := RawFileFill(path, 10, 64); !errors.Is(err, ErrTable) || !strings.Contains(err.Error(), "1000 bytes") {
		t.Fatalf("mis-sized file: %v", err)
	}
	if _, _, err := RawFileFill(filepath.Join(dir, "missing"), 10, 64); err == nil {
		t.Fatal("missing file accepted")
	}
	fill, closeFn, err := RawFileFill(path, 10, 100)
	if err != nil {
		t.Fatal(err)
	}
	defer closeFn()
	b := make([]byte, 100)
	if err := fill(9, b); err != nil {
		t.Fatal(err)
	}
}

func TestOpenTableRefusals(t *testing.T) {
	r, c := testTier(t, 1)
	g := tinyGeometry()
	h, _ := NewHasher(g)
	if _, err := OpenTable(r, g, h, 1, false); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("missing table: %v", err)
	}
	tb, err := CreateTable(c, g, h, 1, func(i int64, b []byte) error { SyntheticRow(1, i, b); return nil }, nil)
	if err != nil {
		t.Fatal(err)
	}
	other := g
	other.RowBytes = 256
	if _, err := OpenTable(r, other, h, 1, false); !errors.Is(err, ErrTable) {
		t.Fatalf("row size mismatch: %v", err)
	}
	// Damage one row: verify must catch it.
	b, _ := r.Slice(tb.RowOffset(77), 8)
	b[3] ^= 0xff
	if _, err := OpenTable(r, g, h, 1, true); !errors.Is(err, ErrTable) || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("damaged row: %v", err)
	}
}

// TestCreateTableRefusesAnExistingNameFirst: a table that exists is
// refused before the fill (which can take minutes), not after it; a
// geometry without a name (tables would be engram//layerN) is refused.
func TestCreateTableRefusesAnExistingNameFirst(t *testing.T) {
	_, c := testTier(t, 1)
	g := tinyGeometry()
	h, _ := NewHasher(g)
	fill := func(int64, []byte) error { return nil }
	if _, err := CreateTable(c, g, h, 1, fill, nil); err != nil {
		t.Fatal(err)
	}
	filled := 0
	_, err := CreateTable(c, g, h, 1, func(int64, []byte) error { filled++; return nil }, nil)
	if !errors.Is(err, tier.ErrExists) || filled != 0 {
		t.Fatalf("second load: %v after %d rows filled", err, filled)
	}
	g.Name = ""
	if err := g.Validate(); !errors.Is(err, ErrGeometry) {
		t.Fatalf("a geometry without a name: %v", err)
	}
}

// TestPrefetchAfterRegionClose: a prefetcher asked for rows after its
// Region closed (a deferred Close in the wrong order) reports ErrClosed
// instead of faulting on the unmapped tables.
func TestPrefetchAfterRegionClose(t *testing.T) {
	r, c := testTier(t, 1)
	g := tinyGeometry()
	h, err := NewHasher(g)
	if err != nil {
		t.Fatal(err)
	}
	var tables []*Table
	for _, l := range g.LayerIDs {
		tb, err := CreateTable(c, g, h, l, func(i int64, b []byte) error { SyntheticRow(l, i, b); return nil }, nil)
		if err != nil {
			t.Fatal(err)
		}
		tables = append(tables, tb)
	}
	eng := kernels.NewCPU(0)
	defer eng.Close()
	p, err := NewPrefetcher(eng, c, h, tables, PrefetchOptions{Slots: 512, Cache: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Prefetch(g.LayerIDs[0], nil, [][]int64{{1, 2, 3, 4, 5}}); !errors.Is(err, tier.ErrClosed) {
		t.Errorf("prefetch after the region closed: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
}
