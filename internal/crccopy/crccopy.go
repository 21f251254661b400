package crccopy

import "hash/crc32"

// Table is the CRC-32C table of hash/crc32, for callers that checksum
// without copying.
var Table = crc32.MakeTable(crc32.Castagnoli)

// Update copies src into dst, which must be at least as long, and returns
// crc (the CRC-32C of what came before) updated with the bytes copied: what
// crc32.Update(crc, Table, src) returns, in the one pass of the copy.
func Update(crc uint32, dst, src []byte) uint32 { return copyCRC(crc, dst, src) }

// Combine is the CRC-32C of a then b, given crcA, the CRC-32C of a (from
// any start), and crcB, that of b from 0, and b's length.
func Combine(crcA, crcB uint32, lenB int64) uint32 {
	return multModP(crcA, xPow8n(uint64(lenB))) ^ crcB
}

// Mul is a·b modulo the Castagnoli polynomial, both in the reflected bit
// order of CRC registers (bit 31 is x^0).
func Mul(a, b uint32) uint32 { return multModP(a, b) }

// XPow8n is x^(8n) modulo the Castagnoli polynomial, reflected: the factor
// that appends n zero bytes to a raw CRC register.
func XPow8n(n uint64) uint32 { return xPow8n(n) }

// Append is the CRC-32C of a then b, given crcA, the CRC-32C of a, and
// rawB, the raw register of b (the CRC computed from 0 with no inversions,
// as a GPU's slices compute it), shifted past b by shift =
// x^(8·len(b)) (a Shift's factor).
func Append(crcA, rawB uint32, shift *Shift) uint32 {
	return ^(shift.Apply(^crcA) ^ rawB)
}

// A Shift multiplies raw CRC registers by one factor x^(8n), appending n
// zero bytes, with four table lookups instead of Mul's 32 steps: for the
// thousands of pieces a large transfer's checksum is joined from.
type Shift struct {
	n int64
	t [4][256]uint32
}

// NewShift makes the Shift of n bytes. It costs a thousand Muls: keep it
// for every call of one piece size.
func NewShift(n int64) *Shift {
	s := &Shift{n: n}
	f := xPow8n(uint64(n))
	for k := range 4 {
		for b := range 256 {
			s.t[k][b] = multModP(uint32(b)<<(8*k), f)
		}
	}
	return s
}

// Bytes is how many zero bytes the Shift appends.
func (s *Shift) Bytes() int64 { return s.n }

// Apply is r·x^(8n).
func (s *Shift) Apply(r uint32) uint32 {
	return s.t[0][r&0xff] ^ s.t[1][r>>8&0xff] ^ s.t[2][r>>16&0xff] ^ s.t[3][r>>24]
}
