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

// fusedSeg is the longest segment each of the fused kernel's three chains
// covers per call. The chains' registers are joined with two
// multiplications per call, so long segments spread that cost thin.
const fusedSeg = 32 << 10

// segStep is the kernel's round: a segment is a multiple of it.
const segStep = 64

// minFusedSeg is the shortest segment worth a call: below it the two
// multiplications that join the chains cost more than the pass saves.
const minFusedSeg = 1 << 10

// segShift holds, for a segment of seg bytes, x^(8·seg) and x^(16·seg)
// modulo the Castagnoli polynomial: multiplying a CRC register by them
// appends that many zero bytes.
type segShift struct{ shift, shift2 uint32 }

// segShifts[k] is the segShift of a segment of k·segStep bytes, for every
// segment the kernel is called with (TestShiftConstants recomputes them).
// Segments fit the payload (a third of it, to the round below) instead of
// falling through fixed sizes: a 32 KiB chunk (16 tokens of an MHA layer,
// a vLLM block) is one call of 10,880-byte segments and a 128-byte rest,
// where 8 KiB segments left a quarter of it to the portable path, which
// took 1.8 times as long a byte.
var segShifts = makeSegShifts()

func makeSegShifts() *[fusedSeg/segStep + 1]segShift {
	var t [fusedSeg/segStep + 1]segShift
	step := xPow8n(segStep)
	f := uint32(1) << 31 // x^0
	for k := range t {
		t[k] = segShift{f, multModP(f, f)}
		f = multModP(f, step)
	}
	return &t
}

// fitTries is how many segments, a round apart, a fitted call tries
// before it takes one of whole pages (see fusedSegFor).
const fitTries = 16

// fusedSegFor is the segment the fused kernel covers next of n bytes left,
// its destination d bytes past its source's offset within a page
// (aliasDistance): the longest, or about a third of what is left; 0 when
// too little is left for a call. The kernel stores each segment's round
// while it loads the others', so segment B's stores sit seg bytes (and
// C's 2·seg) from A's loads: a segment that is not a multiple of a page
// puts those within the 4K-aliasing window where d alone was not (a
// 18 KiB MLA chunk fitted to 6 KiB segments ran at a quarter of its speed
// at some offsets), so a fitted segment is one a round shorter, up to
// fitTries times, or one of whole pages, that puts every pair of segments
// outside the window or at d.
func fusedSegFor(n int, d uintptr) int {
	if n >= 3*fusedSeg {
		return fusedSeg // a multiple of a page: every pair at d
	}
	base := n / 3 &^ (segStep - 1)
	for seg := base; seg >= minFusedSeg && seg > base-fitTries*segStep; seg -= segStep {
		if apartFromAliasing(seg, d) {
			return seg
		}
	}
	if seg := base &^ 4095; seg >= minFusedSeg {
		return seg
	}
	return 0
}

// apartFromAliasing is whether the kernel's segments, seg bytes apart, put
// every store of one segment at d from the source's offset or outside the
// aliasing window from the loads of another (the distances d ± seg and
// d ± 2·seg within a page).
func apartFromAliasing(seg int, d uintptr) bool {
	for _, m := range [...]int{-2, -1, 1, 2} {
		x := (int(d) + m*seg) & 4095
		if x != int(d) && x < aliasWindow {
			return false
		}
	}
	return true
}

// copyCRC copies src into dst (at least as long) and returns crc, the
// CRC-32C of what came before, updated with the bytes copied.
func copyCRC(crc uint32, dst, src []byte) uint32 {
	dst = dst[:len(src)]
	return copyCRCWith(fusedKernel(dst, src), crc, dst, src)
}

// copyCRCWith is copyCRC through kernel (nil: the portable path); dst is
// exactly as long as src. Each call advances by a multiple of the round,
// so dst keeps the alignment and the page offset the kernel was chosen by.
func copyCRCWith(kernel fused, crc uint32, dst, src []byte) uint32 {
	d := aliasDistance(dst, src)
	if kernel != nil && fusedSegFor(len(src), d) > 0 {
		r := ^crc
		for seg := fusedSegFor(len(src), d); seg > 0; seg = fusedSegFor(len(src), d) {
			f := segShifts[seg/segStep]
			ra, rb, rc := kernel(&dst[0], &src[0], seg, r)
			r = multModP(ra, f.shift2) ^ multModP(rb, f.shift) ^ rc
			dst, src = dst[3*seg:], src[3*seg:]
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
