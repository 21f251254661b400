package topk

import (
	"encoding/binary"
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// testTier formats a file-backed tier of devices devices (32 MiB each,
// 256 KiB chunks).
func testTier(t testing.TB, devices int) (*tier.Region, *tier.Client) {
	return tiertest.Format(t, devices, 32<<20, 256<<10)
}

func testPool(t testing.TB, c *tier.Client, cfg Config) (*Pool, *kernels.CPU) {
	t.Helper()
	eng := kernels.NewCPU(2)
	p, err := New(c, eng, nil, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Error(err)
		}
		eng.Close()
	})
	return p, eng
}

// entry is the deterministic content of one token's entry, so any slot's
// bytes name the request, layer and position they belong to.
func entry(req, layer int, pos int64, size int64) []byte {
	b := make([]byte, size)
	for i := int64(0); i+16 <= size; i += 16 {
		binary.LittleEndian.PutUint32(b[i:], uint32(req))
		binary.LittleEndian.PutUint32(b[i+4:], uint32(layer))
		binary.LittleEndian.PutUint32(b[i+8:], uint32(pos))
		binary.LittleEndian.PutUint32(b[i+12:], uint32(i))
	}
	return b
}

// appendTokens appends positions [from, to) of every layer of req.
func appendTokens(t testing.TB, p *Pool, req int, from, to int64) {
	t.Helper()
	e := p.Config().EntryBytes
	for l := range p.Config().Layers {
		buf := make([]byte, 0, (to-from)*e)
		for pos := from; pos < to; pos++ {
			buf = append(buf, entry(req, l, pos, e)...)
		}
		if err := p.Append(req, l, buf); err != nil {
			t.Fatal(err)
		}
	}
}
