// Package crccopy copies bytes and computes their CRC-32C (Castagnoli) in
// the same pass, and does the arithmetic that joins the checksums of
// pieces computed apart (on several cores, or on a GPU, slice by slice)
// into the checksum of the whole. Every reader of a page in the tier
// verifies this one checksum, whoever computed it.
//
// A payload is copied and its CRC-32C computed in one pass: on amd64
// with SSE 4.2 by copyCRC3 (non-temporal stores, as a large memmove
// makes, and three interleaved CRC32 chains, which is what the
// instruction's latency needs to keep up with memory), or copyCRC3T (the
// same with ordinary stores) where the destination's place in its page
// would make non-temporal stores stall the loop's loads; elsewhere by
// copying a cache-sized piece and checksumming it while it is still in
// the core's cache.
package crccopy

import (
	"hash/crc32"
	"unsafe"
)

// copyPiece keeps each piece in the core's cache between its copy and its
// checksum, so a payload is read from memory once, not twice.
const copyPiece = 64 << 10

// fusedSegs are the bytes each of the fused kernel's three chains covers
// per call, largest first, with x^(8·seg) and x^(16·seg) mod the
// Castagnoli polynomial (TestShiftConstants recomputes them): multiplying
// a CRC register by them appends that many zero bytes. The chains'
// registers are joined with two multiplications per call, so longer
// segments spread that cost thinner; the shorter ones serve blocks below
// 96 KiB (a 64 KiB page: 48 KiB in 16 KiB segments, then 12 KiB in 4 KiB
// ones) and the tails of longer ones.
var fusedSegs = [...]struct {
	seg           int
	shift, shift2 uint32
}{
	{32 << 10, 0xe2ea32dc, 0xfe7740e6},
	{16 << 10, 0xbf455269, 0xe2ea32dc},
	{8 << 10, 0x28461564, 0xbf455269},
	{4 << 10, 0x35d73a62, 0x28461564},
}

// fusedSeg is the longest segment (copyCRC's tests size their inputs by it).
const fusedSeg = 32 << 10

// copyCRC copies src into dst (at least as long) and returns crc, the
// CRC-32C of what came before, updated with the bytes copied.
func copyCRC(crc uint32, dst, src []byte) uint32 {
	dst = dst[:len(src)]
	return copyCRCWith(fusedKernel(dst, src), crc, dst, src)
}

// copyCRCWith is copyCRC through kernel (nil: the portable path); dst is
// exactly as long as src.
func copyCRCWith(kernel fused, crc uint32, dst, src []byte) uint32 {
	if kernel != nil && len(src) >= 3*fusedSegs[len(fusedSegs)-1].seg {
		r := ^crc
		for _, f := range fusedSegs {
			for len(src) >= 3*f.seg {
				ra, rb, rc := kernel(&dst[0], &src[0], f.seg, r)
				r = multModP(ra, f.shift2) ^ multModP(rb, f.shift) ^ rc
				dst, src = dst[3*f.seg:], src[3*f.seg:]
			}
		}
		crc = ^r
	}
	return copyCRCPieces(crc, dst, src)
}

// fusedKernel's signature: copies 3*seg bytes and returns the three
// segments' raw CRC registers (copycrc_amd64.s).
type fused func(dst, src *byte, seg int, r uint32) (ra, rb, rc uint32)

// aliasWindow: a destination that starts less than this many bytes past
// the source's offset within a 4 KiB page makes the fused loop's loads
// wait on its own non-temporal stores to the same page offsets (4K
// aliasing). Measured on 2 MiB blocks: 9x slower at +16 and +64, 2x at
// +128, none from +256 on or behind the source. Ordinary stores retire
// without that wait, but read each destination line first.
const aliasWindow = 256

// lagReach: copyCRC3L stores a round of 64 bytes a segment behind its
// loads, so its pending stores end at most this many bytes past the
// page offsets it loads next, and a destination up to that far past the
// source aliases none of them.
const lagReach = 64

// aliasDistance is how far dst starts past src's offset within a 4 KiB
// page, 0 to 4095.
func aliasDistance(dst, src []byte) uintptr {
	return (uintptr(unsafe.Pointer(unsafe.SliceData(dst))) - uintptr(unsafe.Pointer(unsafe.SliceData(src)))) % 4096
}

// copyCRCPieces is copyCRC's portable path: a piece at a time, copied,
// then checksummed while it is in the core's cache.
func copyCRCPieces(crc uint32, dst, src []byte) uint32 {
	for off := 0; off < len(src); off += copyPiece {
		end := min(off+copyPiece, len(src))
		n := copy(dst[off:end], src[off:end])
		crc = crc32.Update(crc, Table, dst[off:off+n])
	}
	return crc
}

// multModP is a·b modulo the Castagnoli polynomial, both in the reflected
// bit order CRC registers use (bit 31 is x^0).
func multModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		b = b>>1 ^ crc32.Castagnoli&-(b&1) // b·x
	}
	return p
}

// xPow8n is x^(8n) modulo the Castagnoli polynomial, reflected: the factor
// that appends n zero bytes to a CRC register.
func xPow8n(n uint64) uint32 {
	result, base := uint32(1)<<31, uint32(1)<<(31-8) // x^0, x^8
	for ; n > 0; n >>= 1 {
		if n&1 != 0 {
			result = multModP(result, base)
		}
		base = multModP(base, base)
	}
	return result
}
