package prefix

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/crc32"
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
// for a damaged one): what a page takes off the node. One pass over the
// payload on an index of layout 5 or later, two before.
func (s *Store) WirePayload(h Hit) ([]byte, uint32, error) {
	held, herr := s.hold("payload")
	if herr != nil {
		return nil, 0, herr
	}
	defer held.Done()
	b, err := s.Payload(h)
	if err != nil {
		return nil, 0, err
	}
	wire := WireChecksum(h.Key, b)
	entry := wire
	if !s.wireIsEntry() {
		entry = s.Checksum(h.Key, b)
	}
	if entry != h.CRC {
		return nil, 0, fmt.Errorf("prefix: %q: %v: %w: stored %#x, read %#x", s.name, h.Key, ErrChecksum, h.CRC, entry)
	}
	return b, wire, nil
}

// Block is the block reservation r writes into, in place in the tier
// mapping, for a writer that fills it by other means than Set (a network
// transfer). Check Fenced right before the write starts.
func (s *Store) Block(r Reservation) ([]byte, error) {
	held, herr := s.hold("block")
	if herr != nil {
		return nil, herr
	}
	defer held.Done()
	if r.Status != Reserved {
		return nil, fmt.Errorf("prefix: %q: %v: %w: not reserved (%v)", s.name, r.Key, ErrBadConfig, r.Status)
	}
	b, err := s.r.Slice(r.Offset, r.Len)
	if err != nil {
		return nil, fmt.Errorf("prefix: %q: %v: %w", s.name, r.Key, err)
	}
	return b, nil
}

// Room is how many bytes from the start of a block belong to it: its
// stride, at least BlockBytes. A transfer may write up to Room bytes into a
// reserved block, and the uplink may write into a pinned block's bytes past
// its payload (a page's trailer), which no reader reads.
func (s *Store) Room() int64 { return s.g.BlockStride }

// Fenced reports tier.ErrLeaseLost once this client's lease is gone: a
// reservation's block may then be another's, and must not be written.
func (s *Store) Fenced() error {
	held, herr := s.hold("fenced")
	if herr != nil {
		return herr
	}
	defer held.Done()
	return held.Fenced()
}

// PublishWritten publishes the reservations whose blocks, written in place
// by a transfer, hold a payload matching want (each key's WireChecksum),
// and aborts the others: a damaged or short transfer becomes a miss, never
// an entry. It reports which were published; with an error (ErrLost: the
// client was reaped), some it reports may not have been.
func (s *Store) PublishWritten(res []Reservation, want []uint32) ([]bool, error) {
	held, herr := s.hold("publish written")
	if herr != nil {
		return nil, herr
	}
	defer held.Done()
	if len(want) != len(res) {
		return nil, fmt.Errorf("prefix: %q: publish written: %d reservations but %d checksums: %w", s.name, len(res), len(want), ErrBadConfig)
	}
	ok := make([]bool, len(res))
	good, crcs := make([]Reservation, 0, len(res)), make([]uint32, 0, len(res))
	bad := make([]Reservation, 0)
	for i, r := range res {
		if r.Status != Reserved {
			continue
		}
		b, err := s.payload(r.Offset, r.Len)
		if err != nil || WireChecksum(r.Key, b) != want[i] {
			bad = append(bad, r)
			continue
		}
		// The tier's own checksum, which differs from the wire's only on
		// layouts before 5.
		ok[i] = true
		good = append(good, r)
		if s.wireIsEntry() {
			crcs = append(crcs, want[i])
		} else {
			crcs = append(crcs, s.Checksum(r.Key, b))
		}
		if err := s.r.Publish(r.Offset, r.Len); err != nil {
			return nil, err
		}
	}
	aerr := s.Abort(bad)
	if err := s.Publish(good, crcs); err != nil {
		return ok, err
	}
	return ok, aerr
}
