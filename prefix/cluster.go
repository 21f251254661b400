package prefix

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/crc32"

	"github.com/cxltier/cxltier/tier"
)

// What a node's uplink (the process that joins a tier to a cluster store)
// needs of an index: its name across nodes, a checksum that travels with a
// page whatever the layout of the index it left, the payload of a pinned
// hit in place, and a publish of blocks that something other than this
// process wrote (a network transfer into the tier).

// WireChecksum is the CRC-32C of key k's 32 bytes then payload: the
// checksum a page carries between nodes. On an index of layout 5 or later
// it equals the entry's own (Store.Checksum); on older layouts it does not,
// so a page is always checked the same way on arrival.
func WireChecksum(k Key, payload []byte) uint32 {
	return crc32.Update(crc32.Checksum(k[:], castagnoli), castagnoli, payload)
}

// namespace is the name of index name across nodes: the name itself for
// an index without a tenant key, else the name and a digest of the key
// (not the digest the header stores, so the cluster store learns nothing
// that opens the index), so that indexes of one name share pages between
// nodes only when their keys are equal.
func namespace(name, key string) string {
	if key == "" {
		return name
	}
	d := sha256.Sum256([]byte("cxltier cluster namespace\x00" + name + "\x00" + key))
	return name + "~" + hex.EncodeToString(d[:12])
}

// tenantSecret is what an index's tenant key adds to the key that
// authenticates its pages across nodes: only processes that hold the tenant
// key can make a page of the index that other nodes accept.
func tenantSecret(name, key string) []byte {
	if key == "" {
		return nil
	}
	d := sha256.Sum256([]byte("cxltier tenant page key\x00" + name + "\x00" + key))
	return d[:]
}

// TenantSecret is the index's part of the key that authenticates its
// pages across nodes (nil for an index without a tenant key).
func (s *Store) TenantSecret() []byte { return s.tenant }

// Namespace is the index's name across nodes: what an uplink puts before
// its keys in the cluster store. Indexes of one name on different tiers
// share a namespace when they were opened with the same tenant key.
func (s *Store) Namespace() string { return s.ns }

// Payload is a pinned hit's payload in place in the tier mapping (fresh
// from memory on a non-coherent tier), valid until the hit is released.
func (s *Store) Payload(h Hit) ([]byte, error) {
	held, herr := s.hold("payload")
	if herr != nil {
		return nil, herr
	}
	defer held.Done()
	b, err := s.payload(h.Offset, h.Len)
	if err != nil {
		return nil, fmt.Errorf("prefix: %q: %v: %w", s.name, h.Key, err)
	}
	return b, nil
}

// wireIsEntry reports whether the entry checksum is the wire checksum
// (layout 5 and later), so that one pass over a payload gives both.
func (s *Store) wireIsEntry() bool { return s.g.Version == 0 || s.g.Version >= 5 }

// WirePayload is a pinned hit's payload in place and its WireChecksum,
// after checking the payload against the entry's own checksum (ErrChecksum
// for a damaged one) and, in a keyed index, its signature (ErrUnsigned):
// what a page takes off the node. checked is the bytes the checks passed,
// for a caller that signs the page for the cluster: the payload in place
// on an index without a key (one pass, on layout 5 or later), else a
// private copy, since a writer without the key could change the bytes in
// place between the checks and the cluster's signature, which would then
// vouch for a page the tenant's key never signed.
func (s *Store) WirePayload(h Hit) (inPlace, checked []byte, wire uint32, err error) {
	held, herr := s.hold("payload")
	if herr != nil {
		return nil, nil, 0, herr
	}
	defer held.Done()
	b, err := s.Payload(h)
	if err != nil {
		return nil, nil, 0, err
	}
	checked = b
	if s.mac != nil {
		checked = append([]byte(nil), b...)
	}
	wire = WireChecksum(h.Key, checked)
	entry := wire
	if !s.wireIsEntry() {
		entry = s.Checksum(h.Key, checked)
	}
	if entry != h.CRC {
		return nil, nil, 0, fmt.Errorf("prefix: %q: %v: %w: stored %#x, read %#x", s.name, h.Key, ErrChecksum, h.CRC, entry)
	}
	if err := s.checkSigned(&h, [][]byte{checked}); err != nil {
		return nil, nil, 0, fmt.Errorf("prefix: %q: %w", s.name, err)
	}
	return b, checked, wire, nil
}

// Room is how many bytes from the start of a block belong to it: its
// stride, at least BlockBytes. A fill may write up to Room bytes into a
// reserved block, and bytes past a payload within it belong to no payload.
func (s *Store) Room() int64 { return s.g.BlockStride }

// WriteSlack writes b into pinned hit h's block right after its payload,
// bytes no reader reads (an uplink's page trailer, so that page and
// trailer leave in one transfer), and flushes them: on a tier several
// hosts share, a dirty line left in this host's cache could be written
// back after the block went to another host. It checks the lease first
// (a reaped client's pins are gone) and reports false, writing nothing,
// where the block has no room for b.
func (s *Store) WriteSlack(h Hit, b []byte) (bool, error) {
	held, herr := s.hold("write slack")
	if herr != nil {
		return false, herr
	}
	defer held.Done()
	if h.Len+int64(len(b)) > s.g.BlockStride {
		return false, nil
	}
	if err := held.Fenced(); err != nil {
		return false, fmt.Errorf("prefix: %q: write slack: %w", s.name, err)
	}
	off := h.Offset + tier.Offset(h.Len)
	dst, err := s.r.Slice(off, int64(len(b)))
	if err != nil {
		return false, fmt.Errorf("prefix: %q: %v: %w", s.name, h.Key, err)
	}
	copy(dst, b)
	return true, s.flushData(off, int64(len(b)))
}
