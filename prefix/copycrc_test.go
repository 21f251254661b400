package prefix

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

func TestShiftConstants(t *testing.T) {
	if got := xPow8n(fusedSeg); got != shiftSeg {
		t.Errorf("x^(8·%d) = %#x, the constant says %#x", fusedSeg, got, uint32(shiftSeg))
	}
	if got := xPow8n(2 * fusedSeg); got != shift2Seg {
		t.Errorf("x^(16·%d) = %#x, the constant says %#x", fusedSeg, got, uint32(shift2Seg))
	}
	// Appending zeros through the shift agrees with the table CRC.
	for _, n := range []int{1, 7, 64, 1000} {
		data := bytes.Repeat([]byte{0x5a}, 33)
		raw := ^crc32.Checksum(data, castagnoli)
		want := crc32.Update(crc32.Checksum(data, castagnoli), castagnoli, make([]byte, n))
		if got := ^multModP(raw, xPow8n(uint64(n))); got != want {
			t.Errorf("%d zero bytes: %#x, want %#x", n, got, want)
		}
	}
}

// TestCopyCRC: the fused path (where the core has it) and the portable one
// copy exactly and checksum as the standard library does, for lengths
// around the fused round, destinations at every 16-byte alignment and
// none, and any starting CRC.
func TestCopyCRC(t *testing.T) {
	round := 3 * fusedSeg
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 3*round+200)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	for _, n := range []int{0, 1, 63, round - 1, round, round + 1, round + 64, 2*round + 4095, 3*round + 200} {
		for _, shift := range []int{0, 16, 48, 3} {
			for _, start := range []uint32{0, 0xdeadbeef} {
				t.Run(fmt.Sprintf("n%d/dst+%d/crc%#x", n, shift, start), func(t *testing.T) {
					buf := make([]byte, n+64+shift)
					dst := buf[shift : shift+n]
					got := copyCRC(start, dst, src[:n])
					if want := crc32.Update(start, castagnoli, src[:n]); got != want {
						t.Errorf("crc %#x, want %#x (fused path: %v)", got, want, n >= round && fusedCopyCRC(dst))
					}
					if !bytes.Equal(dst, src[:n]) {
						t.Error("the copy differs from the source")
					}
					if bytes.ContainsFunc(buf[shift+n:], func(r rune) bool { return r != 0 }) {
						t.Error("bytes written past the copy")
					}
				})
			}
		}
	}
}

// BenchmarkCopyCRC is a 2 MiB block copied and checksummed, beside the
// plain copy of the same bytes; sources and destinations rotate through
// 64 MiB so that memory, not a cache, is measured.
func BenchmarkCopyCRC(b *testing.B) {
	const size, n = 2 << 20, 32
	src, dst := make([][]byte, n), make([][]byte, n)
	for i := range src {
		src[i], dst[i] = bytes.Repeat([]byte{byte(i)}, size), make([]byte, size)
	}
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; b.Loop(); i++ {
			copy(dst[i%n], src[i%n])
		}
	})
	b.Run("copyCRC", func(b *testing.B) {
		b.SetBytes(size)
		for i := 0; b.Loop(); i++ {
			copyCRC(0, dst[i%n], src[i%n])
		}
	})
}
