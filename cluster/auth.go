package cluster

import (
	"crypto/hmac"
	"crypto/sha256"
	"fmt"
	"hash"
	"hash/crc32"

	"github.com/cxltier/cxltier/internal/errkind"
	"github.com/cxltier/cxltier/prefix"
)

// The page's CRC in its trailer tells a damaged transfer from a good one,
// but anyone who reaches the cluster store can compute it for a payload of
// their own and put the page under a node's key. A node given the
// cluster's key (every uplink of the cluster the same) therefore also
// sends a MAC of each page, and a node given the key publishes only pages
// whose MAC it checks: a peer without the key can then deny pages (a miss)
// but not plant them. The MAC's key is derived from the cluster key, the
// index's namespace and, for an index with a tenant key, that key: a node
// with the cluster key but not a tenant's key cannot make that tenant's
// pages either.

// MACBytes is the size of a page's MAC: HMAC-SHA256, cut to 128 bits.
const MACBytes = 16

// MinClusterKey is the shortest cluster key taken, in bytes.
const MinClusterKey = 16

// ErrAuth is a page whose MAC is missing or wrong.
var ErrAuth = errkind.New(errkind.Checksum, "page not authenticated by the cluster key")

// PageAuth makes and checks the MACs of one index's pages.
type PageAuth struct {
	key [sha256.Size]byte
}

// NewPageAuth derives the MAC key of the index with namespace ns (and,
// for a keyed index, its prefix.Store.TenantSecret) from the cluster key.
func NewPageAuth(clusterKey []byte, ns string, tenant []byte) (*PageAuth, error) {
	if len(clusterKey) < MinClusterKey {
		return nil, fmt.Errorf("cluster: %w: a cluster key of %d bytes (at least %d)", ErrBadMessage, len(clusterKey), MinClusterKey)
	}
	m := hmac.New(sha256.New, clusterKey)
	m.Write([]byte("cxltier page mac key\x00"))
	m.Write([]byte(ns))
	m.Write([]byte{0})
	m.Write(tenant)
	a := &PageAuth{}
	copy(a.key[:], m.Sum(nil))
	return a, nil
}

// sealChunk is how much of a payload the checksum and the MAC each take
// before the other: one pass over the payload, in pieces the cache holds.
const sealChunk = 64 << 10

// Seal computes the page's WireChecksum and, with a, its MAC, in one pass
// over the payload.
func (a *PageAuth) Seal(k prefix.Key, payload []byte) (crc uint32, mac [MACBytes]byte) {
	table := crc32.MakeTable(crc32.Castagnoli)
	crc = crc32.Checksum(k[:], table)
	var m hash.Hash
	if a != nil {
		m = hmac.New(sha256.New, a.key[:])
		m.Write(k[:])
	}
	for off := 0; off < len(payload); off += sealChunk {
		piece := payload[off:min(off+sealChunk, len(payload))]
		crc = crc32.Update(crc, table, piece)
		if m != nil {
			m.Write(piece)
		}
	}
	if m != nil {
		copy(mac[:], m.Sum(nil))
	}
	return crc, mac
}

// Check reports whether payload is the page t describes: its checksum
// matches and, with a, its MAC does too (a page without one is refused).
// It returns the checksum, which the index records.
func (a *PageAuth) Check(t Trailer, k prefix.Key, payload []byte) (uint32, error) {
	if a != nil && !t.Signed {
		return 0, fmt.Errorf("cluster: %v: %w: the sender did not sign it (has it the cluster key?)", k, ErrAuth)
	}
	crc, mac := a.Seal(k, payload)
	if crc != t.CRC {
		return 0, fmt.Errorf("cluster: %v: %w: payload checksum %#x, trailer %#x", k, prefix.ErrChecksum, crc, t.CRC)
	}
	if a != nil && !hmac.Equal(mac[:], t.MAC[:]) {
		return 0, fmt.Errorf("cluster: %v: %w", k, ErrAuth)
	}
	return crc, nil
}
