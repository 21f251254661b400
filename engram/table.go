package engram

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"time"

	"github.com/cxltier/cxltier/tier"
)

// DirKind marks Engram tables in the tier's root directory.
const DirKind = 0x45475231 // "EGR1"

const (
	tableMagic   = 0x636c7845474d5442 // "BTMGExlc"
	tableVersion = 1
	headerBytes  = 4096 // the header page; rows start after it
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Table is one layer's rows in the tier. Rows never straddle a stripe, so
// each lies whole on one device and the gather engine reads it with one
// address.
type Table struct {
	r        *tier.Region
	Name     string
	Layer    int
	Rows     int64
	RowBytes int64
	CRC      uint32
	base     tier.Offset // first row
	stripe   int64
	first    int64 // rows before the first stripe boundary
	perStr   int64 // rows per whole stripe
	boundary tier.Offset
}

// TableName is the directory name of a geometry's layer table.
func TableName(g Geometry, layer int) string { return fmt.Sprintf("engram/%s/layer%d", g.Name, layer) }

// tableBytes is the tier space a table needs: header plus rows packed so
// that none crosses a stripe boundary.
func tableBytes(rows, rowBytes, stripe int64) int64 {
	perStripe := stripe / rowBytes
	stripes := (rows + perStripe - 1) / perStripe
	return headerBytes + stripes*stripe + stripe
}

// CreateTable allocates a table for layer in the tier and fills it with
// fill (called with each row's index and bytes, in order; nil leaves zeros),
// reporting progress to progress (nil: silent). The table's chunks are
// shared: it outlives c and is found by name through the directory.
func CreateTable(c *tier.Client, g Geometry, h *Hasher, layer int, fill func(row int64, b []byte) error, progress io.Writer) (*Table, error) {
	rows, err := h.Rows(layer)
	if err != nil {
		return nil, err
	}
	r := c.Region()
	// Rows are packed by stripe on every tier, one device or several: on
	// one device it costs under a row per stripe and keeps a single layout.
	stripe := r.Info().Geometry.Stripe
	if g.RowBytes > stripe {
		return nil, fmt.Errorf("%w: row of %d bytes exceeds the tier's %d-byte stripe", ErrGeometry, g.RowBytes, stripe)
	}
	// Before the fill, which can take minutes: DirPut at the end would
	// refuse a name that exists only after all of it.
	name := TableName(g, layer)
	if _, err := r.DirLookup(name); err == nil {
		return nil, fmt.Errorf("engram: table %s: %w (it is loaded already)", name, tier.ErrExists)
	}
	need := tableBytes(rows, g.RowBytes, stripe)
	chunk := r.ChunkSize()
	nChunks := (need + chunk - 1) / chunk
	off, err := c.AllocChunks(nChunks)
	if err != nil {
		return nil, fmt.Errorf("engram: table for layer %d (%d rows × %d B): %w", layer, rows, g.RowBytes, err)
	}
	t := newTable(r, name, layer, rows, g.RowBytes, off, stripe)
	if err := t.fill(fill, progress); err != nil {
		c.FreeChunks(off, nChunks)
		return nil, err
	}
	if err := t.writeHeader(); err != nil {
		c.FreeChunks(off, nChunks)
		return nil, err
	}
	if err := c.ShareChunks(off, nChunks); err != nil {
		return nil, err
	}
	if err := c.DirPut(tier.DirEntry{Name: t.Name, Kind: DirKind, Offset: off, Size: nChunks * chunk}); err != nil {
		c.FreeChunks(off, nChunks)
		return nil, fmt.Errorf("engram: register %s: %w", t.Name, err)
	}
	return t, nil
}

func newTable(r *tier.Region, name string, layer int, rows, rowBytes int64, off tier.Offset, stripe int64) *Table {
	t := &Table{r: r, Name: name, Layer: layer, Rows: rows, RowBytes: rowBytes, base: off + headerBytes, stripe: stripe}
	t.perStr = stripe / rowBytes
	// Rows fill up to the first stripe boundary at or after base (stripes
	// are aligned to the data start), then whole stripes.
	rel := int64(t.base - r.DataStart())
	next := (rel/stripe + 1) * stripe
	t.first = (next - rel) / rowBytes
	t.boundary = r.DataStart() + tier.Offset(next)
	return t
}

// RowOffset is the tier offset of row i (0 <= i < Rows).
func (t *Table) RowOffset(i int64) tier.Offset {
	if i < t.first {
		return t.base + tier.Offset(i*t.RowBytes)
	}
	j := i - t.first
	return t.boundary + tier.Offset((j/t.perStr)*t.stripe+(j%t.perStr)*t.RowBytes)
}

func (t *Table) fill(fill func(int64, []byte) error, progress io.Writer) error {
	start, last := time.Now(), time.Now()
	var sum uint32
	for i := int64(0); i < t.Rows; i++ {
		b, err := t.r.Slice(t.RowOffset(i), t.RowBytes)
		if err != nil {
			return err
		}
		if fill != nil {
			if err := fill(i, b); err != nil {
				return fmt.Errorf("engram: %s row %d: %w", t.Name, i, err)
			}
		}
		sum = crc32.Update(sum, castagnoli, b)
		if progress != nil && (time.Since(last) > time.Second || i == t.Rows-1) {
			last = time.Now()
			fmt.Fprintf(progress, "\r%s: %d/%d rows (%.0f%%) %s", t.Name, i+1, t.Rows, float64(i+1)*100/float64(t.Rows),
				time.Since(start).Round(time.Millisecond))
		}
	}
	if progress != nil {
		fmt.Fprintln(progress)
	}
	t.CRC = sum
	return nil
}

func (t *Table) writeHeader() error {
	var h [64]byte
	le := binary.LittleEndian
	le.PutUint64(h[0:], tableMagic)
	le.PutUint32(h[8:], tableVersion)
	le.PutUint32(h[12:], uint32(t.Layer))
	le.PutUint64(h[16:], uint64(t.Rows))
	le.PutUint64(h[24:], uint64(t.RowBytes))
	le.PutUint64(h[32:], uint64(t.stripe))
	le.PutUint32(h[40:], t.CRC)
	le.PutUint32(h[60:], crc32.Checksum(h[:60], castagnoli))
	if err := t.r.WriteAt(h[:], t.base-headerBytes); err != nil {
		return err
	}
	return t.r.Publish(t.base-headerBytes, int64(len(h)))
}

// OpenTable finds layer's table of g in the tier and checks its header
// against the geometry (and, if verify, every row against the checksum).
func OpenTable(r *tier.Region, g Geometry, h *Hasher, layer int, verify bool) (*Table, error) {
	name := TableName(g, layer)
	e, err := r.DirLookup(name)
	if err != nil {
		return nil, fmt.Errorf("engram: %s: %w", name, err)
	}
	if e.Kind != DirKind {
		return nil, fmt.Errorf("%w: %s has kind %#x", ErrTable, name, e.Kind)
	}
	var hdr [64]byte
	if err := r.Refresh(e.Offset, int64(len(hdr))); err != nil {
		return nil, err
	}
	if err := r.ReadAt(hdr[:], e.Offset); err != nil {
		return nil, err
	}
	le := binary.LittleEndian
	if le.Uint64(hdr[0:]) != tableMagic || crc32.Checksum(hdr[:60], castagnoli) != le.Uint32(hdr[60:]) {
		return nil, fmt.Errorf("%w: %s: bad header", ErrTable, name)
	}
	if v := le.Uint32(hdr[8:]); v != tableVersion {
		return nil, fmt.Errorf("%w: %s: version %d", ErrTable, name, v)
	}
	rows, _ := h.Rows(layer)
	if got := int64(le.Uint64(hdr[16:])); got != rows || int64(le.Uint64(hdr[24:])) != g.RowBytes || int(le.Uint32(hdr[12:])) != layer {
		return nil, fmt.Errorf("%w: %s holds %d rows of %d B for layer %d; geometry wants %d rows of %d B",
			ErrTable, name, got, le.Uint64(hdr[24:]), le.Uint32(hdr[12:]), rows, g.RowBytes)
	}
	t := newTable(r, name, layer, rows, g.RowBytes, e.Offset, int64(le.Uint64(hdr[32:])))
	t.CRC = le.Uint32(hdr[40:])
	if verify {
		want := t.CRC
		if err := t.fill(nil, nil); err != nil {
			return nil, err
		}
		if t.CRC != want {
			return nil, fmt.Errorf("%w: %s: checksum %#x, header says %#x", ErrTable, name, t.CRC, want)
		}
	}
	return t, nil
}

// RawFileFill returns a fill function reading rows from a raw row-major
// file, after checking that its size is exactly rows × rowBytes.
func RawFileFill(path string, rows, rowBytes int64) (fill func(int64, []byte) error, closeFn func() error, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("engram: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if st.Size() != rows*rowBytes {
		f.Close()
		return nil, nil, fmt.Errorf("%w: %s is %d bytes; %d rows × %d B need %d", ErrTable, path, st.Size(), rows, rowBytes, rows*rowBytes)
	}
	br := &readerAt{f: f}
	return func(i int64, b []byte) error { return br.read(b, i*rowBytes) }, f.Close, nil
}

// readerAt reads sequentially with a large buffer (rows arrive in order).
type readerAt struct {
	f   *os.File
	buf []byte
	at  int64 // file offset of buf[0]
}

func (r *readerAt) read(b []byte, off int64) error {
	if off < r.at || off+int64(len(b)) > r.at+int64(len(r.buf)) {
		if r.buf == nil {
			r.buf = make([]byte, 0, 8<<20)
		}
		n, err := r.f.ReadAt(r.buf[:cap(r.buf)], off)
		if n < len(b) {
			return fmt.Errorf("%w: short read at %d: %v", ErrTable, off, err)
		}
		r.buf, r.at = r.buf[:n], off
	}
	copy(b, r.buf[off-r.at:])
	return nil
}

// SyntheticRow fills b with row i of a synthetic table for layer: every
// 8-byte word is a hash of (layer, row, word), so a reader can check any
// row it receives without the table.
func SyntheticRow(layer int, i int64, b []byte) {
	var w [8]byte
	for k := 0; k < len(b); k += 8 {
		x := uint64(layer)<<48 ^ uint64(i)<<12 ^ uint64(k/8)
		x ^= x >> 30
		x *= 0xbf58476d1ce4e5b9
		x ^= x >> 27
		x *= 0x94d049bb133111eb
		x ^= x >> 31
		binary.LittleEndian.PutUint64(w[:], x)
		copy(b[k:], w[:])
	}
}

// DestroyTable removes layer's table of g from the directory and frees its
// chunks. Nothing records who reads a table: stop the prefetchers that use
// it first (they would read memory later allocations reuse).
func DestroyTable(c *tier.Client, g Geometry, layer int) error {
	name := TableName(g, layer)
	r := c.Region()
	e, err := r.DirLookup(name)
	if err != nil {
		return fmt.Errorf("engram: destroy %s: %w", name, err)
	}
	if e.Kind != DirKind {
		return fmt.Errorf("%w: destroy %s: a directory entry of kind %#x, not an Engram table", ErrTable, name, e.Kind)
	}
	chunk := r.ChunkSize()
	if e.Size <= 0 || e.Size%chunk != 0 {
		return fmt.Errorf("%w: destroy %s: span of %d bytes is not whole chunks", ErrTable, name, e.Size)
	}
	if err := c.DirDelete(name); err != nil {
		return fmt.Errorf("engram: destroy %s: %w", name, err)
	}
	if err := c.FreeChunks(e.Offset, e.Size/chunk); err != nil {
		return fmt.Errorf("engram: destroy %s: %w", name, err)
	}
	return nil
}
