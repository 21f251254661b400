package crccopy

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"unsafe"
)

func TestShiftConstants(t *testing.T) {
	for k, f := range segShifts {
		seg := uint64(k * segStep)
		if got := xPow8n(seg); got != f.shift {
			t.Errorf("x^(8·%d) = %#x, the table says %#x", seg, got, f.shift)
		}
		if got := xPow8n(2 * seg); got != f.shift2 {
			t.Errorf("x^(16·%d) = %#x, the table says %#x", seg, got, f.shift2)
		}
	}
	// Appending zeros through the shift agrees with the table CRC.
	for _, n := range []int{1, 7, 64, 1000} {
		data := bytes.Repeat([]byte{0x5a}, 33)
		raw := ^crc32.Checksum(data, Table)
		want := crc32.Update(crc32.Checksum(data, Table), Table, make([]byte, n))
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
	for _, n := range []int{0, 1, 63, 3*minFusedSeg - 1, 3 * minFusedSeg, 3*minFusedSeg + 191, 12<<10 - 1, 12 << 10,
		16 << 10, 32 << 10, 32<<10 + 64, 64 << 10, round - 1, round, round + 1, round + 64, round + 3*minFusedSeg + 5,
		2*round + 4095, 3*round + 200} {
		for _, shift := range []int{0, 16, 48, 3} {
			for _, start := range []uint32{0, 0xdeadbeef} {
				t.Run(fmt.Sprintf("n%d/dst+%d/crc%#x", n, shift, start), func(t *testing.T) {
					buf := make([]byte, n+64+shift)
					dst := buf[shift : shift+n]
					got := copyCRC(start, dst, src[:n])
					if want := crc32.Update(start, Table, src[:n]); got != want {
						t.Errorf("crc %#x, want %#x (fused path: %v)", got, want, fusedSegFor(n, aliasDistance(dst, src[:n])) > 0 && fusedKernel(dst, src[:n]) != nil)
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

// copyCRC copies and checksums exactly from a page-aligned source (a tier
// block) to destinations at the page offsets that pick each fused kernel
// (copycrc_amd64_test.go checks which is picked and runs each directly).
func TestCopyCRCByPageOffset(t *testing.T) {
	n := 3*fusedSeg + 4096 + 7
	src := pageAligned(n, 0)
	for i := range src {
		src[i] = byte(i*7 + i>>9)
	}
	want := crc32.Update(0, Table, src)
	for _, off := range []int{0, 3, 16, 48, 64, 65, 80, 128, 255, 256, 2048, 4080} {
		t.Run(fmt.Sprintf("dst+%d", off), func(t *testing.T) {
			buf := pageAligned(n+64, off)
			dst := buf[:n]
			if got := aliasDistance(dst, src); got != uintptr(off) {
				t.Fatalf("aliasDistance = %d, want %d", got, off)
			}
			if got := copyCRC(0, dst, src); got != want {
				t.Errorf("crc %#x, want %#x", got, want)
			}
			if !bytes.Equal(dst, src) || bytes.ContainsFunc(buf[n:], func(r rune) bool { return r != 0 }) {
				t.Error("the copy differs from the source, or wrote past it")
			}
		})
	}
}

// BenchmarkCopyCRC is a block copied and checksummed (copyCRC, and its
// portable path, the pieces), beside the plain copy of the same bytes, for 2 MiB and 64 KiB blocks whose destination
// starts 0, 16, 64 or 2048 bytes past a page (the source, a tier block, at
// a page: numpy, torch and malloc buffers usually start 16 bytes past
// one). Sources and destinations rotate through 64 MiB so that memory, not
// a cache, is measured.
func BenchmarkCopyCRC(b *testing.B) {
	for _, size := range []int{2 << 20, 64 << 10, 32 << 10, 16 << 10} {
		n := max(32, (64<<20)/size)
		src, dst := make([][]byte, n), make([][]byte, n)
		for i := range src {
			src[i] = pageAligned(size, 0)
			for j := range src[i] {
				src[i][j] = byte(i + j)
			}
		}
		for _, off := range []int{0, 16, 64, 2048} {
			for i := range dst {
				dst[i] = pageAligned(size, off)
				copy(dst[i], src[i]) // its page faults taken before the clock starts
			}
			b.Run(fmt.Sprintf("%dKiB/dst+%d/copy", size>>10, off), func(b *testing.B) {
				b.SetBytes(int64(size))
				for i := 0; b.Loop(); i++ {
					copy(dst[i%n], src[i%n])
				}
			})
			b.Run(fmt.Sprintf("%dKiB/dst+%d/copyCRC", size>>10, off), func(b *testing.B) {
				b.SetBytes(int64(size))
				for i := 0; b.Loop(); i++ {
					copyCRC(0, dst[i%n], src[i%n])
				}
			})
			b.Run(fmt.Sprintf("%dKiB/dst+%d/pieces", size>>10, off), func(b *testing.B) {
				b.SetBytes(int64(size))
				for i := 0; b.Loop(); i++ {
					copyCRCPieces(0, dst[i%n], src[i%n])
				}
			})
		}
	}
}

// pageAligned is size bytes starting off bytes past a 4 KiB boundary.
func pageAligned(size, off int) []byte {
	buf := make([]byte, size+off+4096)
	skip := (4096 - int(uintptr(unsafe.Pointer(&buf[0]))%4096)) % 4096
	return buf[skip+off : skip+off+size]
}

// fusedSegFor never asks for more than is left, keeps the segments of a
// call clear of 4K aliasing between them, and leaves the portable path
// less than the shortest call or, after a call fitted to what was left,
// less than the rounds a fit may give up: every length up to two full
// calls, at every destination offset the kernels are chosen by, walked as
// copyCRCWith walks it.
func TestFusedSegForCoversThePayload(t *testing.T) {
	for d := uintptr(0); d < 4096; d += 16 {
		for n := 0; n <= 6*fusedSeg+3*segStep; n += 61 {
			left, last := n, 0
			for seg := fusedSegFor(left, d); seg > 0; seg = fusedSegFor(left, d) {
				if seg%segStep != 0 || seg > fusedSeg || 3*seg > left {
					t.Fatalf("d %d, n %d: a segment of %d with %d left", d, n, seg, left)
				}
				if !apartFromAliasing(seg, d) {
					t.Fatalf("d %d, n %d: segments of %d alias each other", d, n, seg)
				}
				left -= 3 * seg
				last = seg
			}
			if left >= 3*(minFusedSeg+fitTries*segStep) {
				t.Fatalf("d %d, n %d: %d bytes left to the portable path", d, n, left)
			}
			if last > 0 && last < fusedSeg && last%4096 != 0 && left >= 3*fitTries*segStep {
				t.Fatalf("d %d, n %d: %d bytes left after a fitted call of %d", d, n, left, last)
			}
		}
	}
}

// apartFromAliasing: segments a page apart alias as their destination
// does, so they are apart; 6 KiB segments, two pages apart in pairs, put
// a store 64 bytes past a load where d is 2112 (the MLA chunk measured at
// a quarter of its speed); behind the source is apart.
func TestApartFromAliasing(t *testing.T) {
	for _, tc := range []struct {
		seg  int
		d    uintptr
		want bool
	}{{4096, 0, true}, {8192, 16, true}, {6144, 2112, false}, {6144, 2048, false}, {6144, 1024, true},
		{6144, 2048 + aliasWindow, true}, {10880, 0, true}, {10880 - 64, 0, true}} {
		if got := apartFromAliasing(tc.seg, tc.d); got != tc.want {
			t.Errorf("seg %d, d %d: %v, want %v", tc.seg, tc.d, got, tc.want)
		}
	}
}
