package prefix

import (
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/cxltier/cxltier/tier"
)

// Set stores payloads[i] under keys[i] from host memory: reserve, write,
// flush, publish. It returns each key's status; keys present already are
// left as they are.
func (s *Store) Set(keys []Key, payloads [][]byte) ([]Status, error) {
	if len(payloads) != len(keys) {
		return nil, fmt.Errorf("prefix: %q: set: %d keys but %d payloads: %w", s.name, len(keys), len(payloads), ErrBadConfig)
	}
	sizes := make([]int64, len(keys))
	for i, p := range payloads {
		sizes[i] = int64(len(p))
	}
	res, err := s.Reserve(keys, sizes)
	if err != nil && res == nil {
		return nil, err
	}
	crcs := make([]uint32, len(res))
	for i := range res {
		if res[i].Status != Reserved {
			continue
		}
		crc, werr := s.writePayload(res[i].Offset, payloads[i])
		if werr != nil {
			s.Abort(res)
			return nil, fmt.Errorf("prefix: %q: set %v: %w", s.name, keys[i], werr)
		}
		crcs[i] = crc
	}
	if perr := s.Publish(res, crcs); perr != nil && err == nil {
		err = perr
	}
	return statuses(res), err
}

func statuses(res []Reservation) []Status {
	out := make([]Status, len(res))
	for i, r := range res {
		out[i] = r.Status
	}
	return out
}

// writePayload copies p into the block at off, makes it visible to other
// hosts, and returns the checksum of what the block now holds.
func (s *Store) writePayload(off tier.Offset, p []byte) (uint32, error) {
	dst, err := s.r.Slice(off, int64(len(p)))
	if err != nil {
		return 0, err
	}
	crc := copyCRC(dst, p)
	return crc, s.r.Publish(off, int64(len(p)))
}

// Get copies the payloads of the longest ready prefix of keys into dst
// (dst[i] must hold the payload; it is resliced to its length) and returns
// how many keys it served. Every payload is checked against its CRC-32C; an
// entry that fails is dropped, counted, and reported with ErrChecksum.
func (s *Store) Get(keys []Key, dst [][]byte) (int, error) {
	if len(dst) < len(keys) {
		return 0, fmt.Errorf("prefix: %q: get: %d keys but %d buffers: %w", s.name, len(keys), len(dst), ErrBadConfig)
	}
	hits, err := s.Lookup(keys)
	if err != nil {
		return 0, err
	}
	defer func() { s.Release(hits) }()
	var bytes uint64
	for i, h := range hits {
		if int64(cap(dst[i])) < h.Len {
			return i, fmt.Errorf("prefix: %q: get %v: buffer of %d bytes for a %d-byte payload: %w", s.name, h.Key, cap(dst[i]), h.Len, ErrBadConfig)
		}
		dst[i] = dst[i][:h.Len]
		if err := s.readHit(h, dst[i]); err != nil {
			if errors.Is(err, ErrChecksum) {
				s.Release(hits[i:])
				hits = hits[:i]
				s.dropCorrupt(h.Key)
			}
			return i, fmt.Errorf("prefix: %q: get: %w", s.name, err)
		}
		bytes += uint64(h.Len)
	}
	s.count(ctrBytesOut, bytes)
	return len(hits), nil
}

// dropCorrupt counts a checksum failure and deletes the entry (if no one
// else holds it pinned; then the next reader finds it bad as well).
func (s *Store) dropCorrupt(k Key) {
	s.count(ctrChecksumFailures, 1)
	s.Delete([]Key{k})
}

// payload is the n payload bytes of the block at off in the tier mapping,
// fresh from memory on a non-coherent tier. Blocks never straddle devices
// (see blockOffsets), so it is one slice.
func (s *Store) payload(off tier.Offset, n int64) ([]byte, error) {
	if s.shared {
		if err := s.r.Refresh(off, n); err != nil {
			return nil, err
		}
	}
	return s.r.Slice(off, n)
}

// readHit copies a pinned hit's payload into dst (h.Len bytes) and checks
// the copy, which is what the caller keeps, against the stored checksum.
func (s *Store) readHit(h Hit, dst []byte) error {
	src, err := s.payload(h.Offset, h.Len)
	if err != nil {
		return fmt.Errorf("%v: %w", h.Key, err)
	}
	if got := copyCRC(dst, src); got != h.CRC {
		return fmt.Errorf("%v: %w: stored %#x, read %#x", h.Key, ErrChecksum, h.CRC, got)
	}
	return nil
}

// copyPiece keeps each piece in the core's cache between its copy and its
// checksum, so a payload is read from memory once, not twice.
const copyPiece = 64 << 10

// copyCRC copies src into dst and returns the CRC-32C of what dst holds.
func copyCRC(dst, src []byte) uint32 {
	var crc uint32
	for off := 0; off < len(src); off += copyPiece {
		end := min(off+copyPiece, len(src))
		n := copy(dst[off:end], src[off:end])
		crc = crc32.Update(crc, castagnoli, dst[off:off+n])
	}
	return crc
}

// VerifyHit checks a pinned hit's payload in place against its checksum,
// for callers that move the payload with the gather engine.
func (s *Store) VerifyHit(h Hit) error {
	src, err := s.payload(h.Offset, h.Len)
	if err != nil {
		return fmt.Errorf("prefix: %q: %v: %w", s.name, h.Key, err)
	}
	if got := crc32.Checksum(src, castagnoli); got != h.CRC {
		return fmt.Errorf("prefix: %q: %v: %w: stored %#x, read %#x", s.name, h.Key, ErrChecksum, h.CRC, got)
	}
	return nil
}
