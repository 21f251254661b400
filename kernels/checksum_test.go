package kernels

import (
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/cxltier/cxltier/internal/crccopy"
)

// blockCases are the shapes the checksum tests move: vector-sized and odd
// chunks, one chunk and many, more rows than a grid has groups, fewer
// blocks than an engine has workers. The interpreter engines skip the
// large one (it takes them a minute), which exists to split blocks
// between the CPU engine's goroutines.
var blockCases = []struct {
	chunkBytes     int64
	chunks, blocks int
	large          bool
}{
	{16, 1, 1, false},
	{1152, 128, 2, false}, // 64 layers × K/V of 576 B × 2
	{9216, 61, 2, false},  // MLA latent, 16-token pages, odd layer count
	{100, 7, 40, false},   // not a multiple of 16
	{10496, 3, 2, false},  // 16 tokens of 656 B: not a multiple of 512
	{32768, 4, 3, false},
	{4096, 1, 1, false},  // one chunk, far more lanes' worth than one
	{65536, 16, 3, true}, // 3 MiB: split between goroutines mid-block
}

// TestBlocksChecksums: a blocks call with CRCs leaves in each word the
// CRC-32C of its seed and the block's bytes in the tier — after a gather,
// of what was read; after a scatter, of what was written — on every
// engine, and on CPU engines whose goroutines split blocks mid-way.
func TestBlocksChecksums(t *testing.T) {
	makers := append(engineMakers[:len(engineMakers):len(engineMakers)], struct {
		name string
		make func(t testing.TB) Engine
	}{"cpu-7-workers", func(testing.TB) Engine { return NewCPU(7) }})
	for _, m := range makers {
		t.Run(m.name, func(t *testing.T) {
			e := m.make(t)
			defer e.Close()
			f := newFixture(t, e, 5, 8<<20)
			for _, c := range blockCases {
				if c.large && strings.HasPrefix(e.Name(), "ptxsim") {
					continue
				}
				t.Run(fmt.Sprintf("chunk=%d/chunks=%d/blocks=%d", c.chunkBytes, c.chunks, c.blocks), func(t *testing.T) {
					testBlockChecksums(t, f, c.chunkBytes, c.chunks, c.blocks)
				})
			}
		})
	}
}

func testBlockChecksums(t *testing.T, f *fixture, chunkBytes int64, nchunks, nblocks int) {
	blockBytes := chunkBytes * int64(nchunks)
	b := Blocks{ChunkBytes: chunkBytes, PageStride: chunkBytes, Tier: make([]Addr, nblocks), Pages: make([]int64, nblocks)}
	for range nchunks {
		buf, err := f.e.Alloc(int64(nblocks) * chunkBytes)
		if err != nil {
			t.Fatal(err)
		}
		defer buf.Free()
		host := make([]byte, buf.Len())
		fill(host, f.rng)
		if err := f.e.Upload(buf, 0, host); err != nil {
			t.Fatal(err)
		}
		b.Chunks = append(b.Chunks, Span{Buf: buf})
	}
	for i := range nblocks {
		b.Tier[i] = At(f.ids[0], int64(i)*blockBytes)
		b.Pages[i] = int64(nblocks - 1 - i)
	}
	for _, dir := range []struct {
		name string
		call func(Blocks) (Handle, error)
	}{{"gather", f.e.GatherBlocks}, {"scatter", f.e.ScatterBlocks}} {
		seeds := make([]uint32, nblocks)
		for i := range seeds {
			seeds[i] = f.rng.Uint32()
		}
		b.CRCs = append([]uint32(nil), seeds...)
		h, err := dir.call(b)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Wait(); err != nil {
			t.Fatal(err)
		}
		for i := range nblocks {
			// After the call the tier holds the bytes moved either way.
			want := crc32.Update(seeds[i], crccopy.Table, f.bytesAt(b.Tier[i], blockBytes))
			if b.CRCs[i] != want {
				t.Fatalf("%s: block %d: checksum %#x, want %#x", dir.name, i, b.CRCs[i], want)
			}
		}
	}
	b.CRCs = make([]uint32, nblocks+1)
	if _, err := f.e.GatherBlocks(b); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("%d checksums for %d blocks: %v, want ErrBadRequest", nblocks+1, nblocks, err)
	}
}
