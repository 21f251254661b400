package prefix

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
)

// Key identifies one entry: a SHA-256 digest.
type Key [32]byte

// String is the key's lowercase hex digest, the form SGLang uses.
func (k Key) String() string { return hex.EncodeToString(k[:]) }

// ParseKey reads a 64-character hex digest.
func ParseKey(s string) (Key, error) {
	var k Key
	if len(s) != 2*len(k) {
		return k, fmt.Errorf("prefix: key %q: %w: want %d hex characters, got %d", s, ErrBadKey, 2*len(k), len(s))
	}
	if _, err := hex.Decode(k[:], []byte(s)); err != nil {
		return k, fmt.Errorf("prefix: key %q: %w: %v", s, ErrBadKey, err)
	}
	return k, nil
}

// StringKey maps an arbitrary key string (an SGLang HiCache key with its
// model and rank suffix, say) to an index key: the SHA-256 of its bytes.
// The Python backend and Go clients both use it, so they meet on the same
// entries; it is deterministic and process-independent.
func StringKey(s string) Key { return sha256.Sum256([]byte(s)) }

// PageKey hashes one page of token ids chained onto its parent page's key,
// byte-identical to SGLang's get_hash_str: SHA-256 over the parent digest
// (absent for the first page) and then each token id as a 4-byte
// little-endian unsigned integer.
func PageKey(parent *Key, tokens []int64) (Key, error) {
	h := sha256.New()
	if parent != nil {
		h.Write(parent[:])
	}
	var b [4]byte
	for i, t := range tokens {
		if t < 0 || t > math.MaxUint32 {
			return Key{}, fmt.Errorf("prefix: token %d at position %d: %w: outside [0, 2^32)", t, i, ErrBadToken)
		}
		binary.LittleEndian.PutUint32(b[:], uint32(t))
		h.Write(b[:])
	}
	var k Key
	h.Sum(k[:0])
	return k, nil
}

// PageKeys returns the key chain of tokens split into pages of pageSize,
// starting from parent (nil at the start of a sequence). A short last page
// is not hashed, as in SGLang: the same prefix must hash the same wherever
// it was cut.
func PageKeys(parent *Key, tokens []int64, pageSize int) ([]Key, error) {
	if pageSize <= 0 {
		return nil, fmt.Errorf("prefix: page size %d: %w", pageSize, ErrBadConfig)
	}
	keys := make([]Key, 0, len(tokens)/pageSize)
	for start := 0; start+pageSize <= len(tokens); start += pageSize {
		k, err := PageKey(parent, tokens[start:start+pageSize])
		if err != nil {
			return nil, fmt.Errorf("prefix: page %d: %w", len(keys), err)
		}
		keys = append(keys, k)
		parent = &keys[len(keys)-1]
	}
	return keys, nil
}

func leU64(b []byte) uint64       { return binary.LittleEndian.Uint64(b) }
func putLeU64(b []byte, v uint64) { binary.LittleEndian.PutUint64(b, v) }

// PartMask names one part of a page in a store shared by several writers
// (SGLang's HiCache backend: a model, a rank, a layout and K or V): the
// SHA-256 of tag under a fixed domain. PartKey applies it.
func PartMask(tag string) Key { return sha256.Sum256([]byte("cxltier/hicache/v1\x00" + tag)) }

// PartKey is the key of one part of a page: the page's key XOR mask. A page
// key is SGLang's hex digest (any other string is hashed, as StringKey
// does). XOR with one mask keeps distinct pages distinct, and keys of two
// masks meet only where two SHA-256 digests differ by exactly the XOR of
// the masks, so a batch of keys costs a hex decode each, not a hash.
func PartKey(page string, mask Key) Key {
	k := pageKey(page)
	xorKey(&k, &mask)
	return k
}

// PartKeys is PartKey for every part of every page, page-major: dst[i*m+j]
// is the key of pages[i] under masks[j] (m = len(masks)). It decodes each
// page once: HiCache asks for tens of thousands of keys per batch.
func PartKeys(dst []Key, pages []string, masks []Key) error {
	if len(dst) != len(pages)*len(masks) {
		return fmt.Errorf("prefix: part keys: %w: %d keys for %d pages × %d parts", ErrBadConfig, len(dst), len(pages), len(masks))
	}
	m := len(masks)
	inParallel(len(pages), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			pageParts(dst[i*m:(i+1)*m], pages[i], masks)
		}
	})
	return nil
}

// pageParts writes the key of page under each of masks to dst.
func pageParts(dst []Key, page string, masks []Key) {
	k := pageKey(page)
	for j := range masks {
		dst[j] = k
		xorKey(&dst[j], &masks[j])
	}
}

// pageKey is a page string's key: its hex digest decoded, or the hash of
// any other string.
func pageKey(page string) Key {
	if k, ok := decodeHexKey(page); ok {
		return k
	}
	return StringKey(page)
}

func xorKey(k, mask *Key) {
	for w := 0; w < len(k); w += 8 {
		binary.LittleEndian.PutUint64(k[w:], binary.LittleEndian.Uint64(k[w:])^binary.LittleEndian.Uint64(mask[w:]))
	}
}
