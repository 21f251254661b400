package prefix

import "encoding/binary"

// SWAR constants: one byte of each repeated across a word.
const (
	ones   = 0x0101010101010101
	highs  = 0x8080808080808080
	nibble = 0x0f0f0f0f0f0f0f0f
)

// decodeHexKey decodes a 64-character hex digest (either case), eight
// characters a word at a time, and reports false for anything else, exactly
// where encoding/hex would fail. HiCache's batch_exists decodes one per
// page, tens of thousands per call: a table lookup per character was a
// third of the call's time once the probes stopped waiting on memory.
func decodeHexKey(s string) (k Key, ok bool) {
	if len(s) != 2*len(k) {
		return k, false
	}
	for w := 0; w < len(k)/4; w++ {
		x := leU64String(s[8*w:])
		if !hexWord(x) {
			return k, false
		}
		binary.LittleEndian.PutUint32(k[4*w:], hexBytes(x))
	}
	return k, true
}

func leU64String(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// hexWord reports whether all eight bytes of x are hex digits. For a byte
// b below 0x80, b+(0x80-lo) has its top bit set iff b >= lo, and
// b+(0x7f-hi) has it clear iff b <= hi; no sum carries into the next byte.
func hexWord(x uint64) bool {
	if x&highs != 0 {
		return false
	}
	digit := (x + 0x50*ones) &^ (x + 0x46*ones) // '0' (0x30) … '9' (0x39)
	y := x | 0x20*ones                          // fold 'A'…'F' onto 'a'…'f'
	alpha := (y + 0x1f*ones) &^ (y + 0x19*ones) // 'a' (0x61) … 'f' (0x66)
	return (digit|alpha)&highs == highs
}

// hexBytes turns eight hex digits (checked by hexWord), first character in
// the low byte, into the four bytes they spell, first byte lowest.
func hexBytes(x uint64) uint32 {
	// A digit's low nibble is its value; a letter's is its value - 9, and
	// only letters have bit 6 set.
	v := x&nibble + (x>>6&ones)*9
	// Pair each even (high-nibble) byte with the odd byte after it.
	v = (v&0x00ff00ff00ff00ff)<<4 | v>>8&0x00ff00ff00ff00ff
	v = (v | v>>8) & 0x0000ffff0000ffff
	return uint32(v | v>>16)
}
