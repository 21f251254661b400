package prefix

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"
	"sync/atomic"
)

// A keyed index signs its pages. An entry's CRC tells a damaged page from
// a good one, but any process that can write the tier can compute a CRC
// for bytes of its own: it can delete a page and set other bytes under the
// same key, entry and checksum valid. Within one trust domain (one tenant's
// engines on a node) that is a writer the domain trusts anyway. Where
// tenants share a tier, an index created with a tenant key (Config.Key)
// therefore also keeps, in each entry, an HMAC-SHA256 of the entry's key
// and payload under a key derived from the tenant key, and every read
// through a handle opened with that key checks it: a writer without the
// key can still damage or delete the tenant's pages (a miss, an error),
// but not place one the tenant's readers accept. The MAC covers the key,
// so a signed page moved under another key is refused too; and the index's
// name, so a page copied between two indexes of one tenant is refused.
//
// Layout 6 added the signature; a keyed index of an older layout keeps
// none, and OpenKey refuses it (a header rewritten to an older version
// cannot turn the checks off).

// macBytes is the size of a page's signature: HMAC-SHA256 cut to 128 bits.
const macBytes = 16

// pageMAC signs and checks one keyed index's pages.
type pageMAC struct {
	key [sha256.Size]byte
}

// newPageMAC is the signer of index name opened with tenant key key; nil
// for an index without one.
func newPageMAC(name, key string) *pageMAC {
	if key == "" {
		return nil
	}
	return &pageMAC{key: sha256.Sum256([]byte("cxltier tenant page signature\x00" + name + "\x00" + key))}
}

// begin starts the signature of key k's page: write its payload in order,
// then take macOf.
func (p *pageMAC) begin(k *Key) hash.Hash {
	m := hmac.New(sha256.New, p.key[:])
	m.Write(k[:])
	return m
}

func macOf(m hash.Hash) (out [macBytes]byte) {
	var sum [sha256.Size]byte
	copy(out[:], m.Sum(sum[:0]))
	return out
}

// sign is the signature of key k's payload, the concatenation of pieces;
// zero on an index without a key.
func (s *Store) sign(k *Key, pieces [][]byte) [macBytes]byte {
	if s.mac == nil {
		return [macBytes]byte{}
	}
	m := s.mac.begin(k)
	for _, p := range pieces {
		m.Write(p)
	}
	return macOf(m)
}

// checkSigned reports ErrUnsigned unless pieces, in order, are the payload
// hit h's signature covers; nil on an index without a key.
func (s *Store) checkSigned(h *Hit, pieces [][]byte) error {
	if s.mac == nil {
		return nil
	}
	return s.checkMAC(h, s.sign(&h.Key, pieces))
}

// checkMAC compares a signature computed over a hit's payload with the one
// its entry holds.
func (s *Store) checkMAC(h *Hit, got [macBytes]byte) error {
	if !hmac.Equal(got[:], h.mac[:]) {
		return fmt.Errorf("%v: %w (written by a process without the index's key, or damaged)", h.Key, ErrUnsigned)
	}
	return nil
}

// storeMAC writes a signature into entry e, a word at a time as every
// other field (other processes read entries while they change).
func storeMAC(e []byte, mac [macBytes]byte) {
	for w := 0; w < macBytes; w += 4 {
		atomic.StoreUint32(u32At(e, entMAC+w), binary.LittleEndian.Uint32(mac[w:]))
	}
}

// loadMAC is the signature entry i holds, refreshed first on a tier
// shared without coherence (it lives in the entry's second line, which
// lookups do not read otherwise).
func (s *Store) loadMAC(i uint32) (mac [macBytes]byte) {
	if s.shared {
		s.refreshMeta(s.g.EntriesOff+int64(i)*entryBytes+lineSize, lineSize)
	}
	e := s.entry(i)
	for w := 0; w < macBytes; w += 4 {
		binary.LittleEndian.PutUint32(mac[w:], atomic.LoadUint32(u32At(e, entMAC+w)))
	}
	return mac
}
