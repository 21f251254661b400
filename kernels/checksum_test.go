package kernels

import (
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
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
	}{"cpu-7-workers", func(testing.TB) Engine { return NewCPU(7) }}, struct {
		name string
		make func(t testing.TB) Engine
	}{"cpu-paced", func(testing.TB) Engine { e := NewCPU(3); e.SetPacer(&countingPacer{}, 40<<10); return e }})
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

// TestChecksumsContinueAcrossQueuedCalls is a layer-wise load's pattern:
// each call moves one layer (a chunk of every block) and continues the
// same checksum words, and each is queued before the one before it is
// waited for. Whatever order the handles are waited in, or if only the
// last is (more calls than an engine has stages), every block's checksum
// is that of its layers in order.
func TestChecksumsContinueAcrossQueuedCalls(t *testing.T) {
	forEachEngine(t, func(t *testing.T, e Engine) {
		const layers, nblocks = 7, 5
		// Not a multiple of the kernel's slices; on the CPU engine, calls
		// large enough to be split between goroutines, so that they queue.
		chunkBytes := int64(10496)
		if !strings.HasPrefix(e.Name(), "ptxsim") {
			chunkBytes = 128<<10 + 48
		}
		f := newFixture(t, e, 11, int(chunkBytes)*layers*nblocks)
		blockBytes := chunkBytes * layers
		bufs := make([]Buffer, layers)
		for l := range bufs {
			buf, err := e.Alloc(nblocks * chunkBytes)
			if err != nil {
				t.Fatal(err)
			}
			defer buf.Free()
			bufs[l] = buf
		}
		layer := func(l int, crcs []uint32) Blocks {
			b := Blocks{ChunkBytes: chunkBytes, Chunks: []Span{{Buf: bufs[l]}}, CRCs: crcs,
				Tier: make([]Addr, nblocks), Pages: make([]int64, nblocks)}
			for i := range nblocks {
				b.Tier[i] = At(f.ids[0], int64(i)*blockBytes+int64(l)*chunkBytes)
				b.Pages[i] = int64(i)
			}
			return b
		}
		for _, order := range []string{"in order", "reversed", "last only"} {
			t.Run(order, func(t *testing.T) {
				seeds := make([]uint32, nblocks)
				for i := range seeds {
					seeds[i] = f.rng.Uint32()
				}
				crcs := slices.Clone(seeds)
				hs := make([]Handle, layers)
				for l := range layers {
					h, err := e.GatherBlocks(layer(l, crcs))
					if err != nil {
						t.Fatal(err)
					}
					hs[l] = h
				}
				switch order {
				case "reversed":
					slices.Reverse(hs)
				case "last only":
					hs = hs[layers-1:]
				}
				for _, h := range hs {
					if err := h.Wait(); err != nil {
						t.Fatal(err)
					}
				}
				for i := range nblocks {
					want := crc32.Update(seeds[i], crccopy.Table, f.bytesAt(At(f.ids[0], int64(i)*blockBytes), blockBytes))
					if crcs[i] != want {
						t.Fatalf("block %d: checksum %#x, want %#x", i, crcs[i], want)
					}
				}
			})
		}
	})
}
