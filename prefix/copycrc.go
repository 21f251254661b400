package prefix

import "hash/crc32"

// Block moves with their checksums. A payload is copied and its CRC-32C
// computed in one pass: on amd64 with SSE 4.2 by copyCRC3 (non-temporal
// stores, as a large memmove makes, and three interleaved CRC32 chains,
// which is what the instruction's latency needs to keep up with memory),
// elsewhere by copying a cache-sized piece and checksumming it while it is
// still in the core's cache.

// copyPiece keeps each piece in the core's cache between its copy and its
// checksum, so a payload is read from memory once, not twice.
const copyPiece = 64 << 10

// fusedSeg is the bytes each of copyCRC3's three chains covers per call;
// the chains' registers are then joined with two multiplications, so
// longer segments spread that cost thinner.
const fusedSeg = 32 << 10

// shiftSeg and shift2Seg are x^(8·fusedSeg) and x^(16·fusedSeg) mod the
// Castagnoli polynomial (TestShiftConstants recomputes them): multiplying a
// CRC register by them appends that many zero bytes.
const (
	shiftSeg  = 0xe2ea32dc
	shift2Seg = 0xfe7740e6
)

// copyCRC copies src into dst (at least as long) and returns crc, the
// CRC-32C of what came before, updated with the bytes copied.
func copyCRC(crc uint32, dst, src []byte) uint32 {
	dst = dst[:len(src)]
	if len(src) >= 3*fusedSeg && fusedCopyCRC(dst) {
		r := ^crc
		for len(src) >= 3*fusedSeg {
			ra, rb, rc := copyCRC3(&dst[0], &src[0], fusedSeg, r)
			r = multModP(ra, shift2Seg) ^ multModP(rb, shiftSeg) ^ rc
			dst, src = dst[3*fusedSeg:], src[3*fusedSeg:]
		}
		crc = ^r
	}
	for off := 0; off < len(src); off += copyPiece {
		end := min(off+copyPiece, len(src))
		n := copy(dst[off:end], src[off:end])
		crc = crc32.Update(crc, castagnoli, dst[off:off+n])
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
