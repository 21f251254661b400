package prefix

import (
	"fmt"
	"github.com/cxltier/cxltier/tier"
	"hash/crc32"
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
		if werr := s.writePayload(res[i].Offset, payloads[i]); werr != nil {
			s.Abort(res)
			return nil, fmt.Errorf("prefix: %q: set %v: %w", s.name, keys[i], werr)
		}
		crcs[i] = crc32.Checksum(payloads[i], castagnoli)
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

func (s *Store) writePayload(off tier.Offset, p []byte) error {
	if err := s.r.WriteAt(p, off); err != nil {
		return err
	}
	return s.r.Publish(off, int64(len(p)))
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
		if err := s.r.ReadAt(dst[i], h.Offset); err != nil {
			return i, fmt.Errorf("prefix: %q: get %v: %w", s.name, h.Key, err)
		}
		if got := crc32.Checksum(dst[i], castagnoli); got != h.CRC {
			s.Release(hits[i:])
			hits = hits[:i]
			s.dropCorrupt(h.Key)
			return i, fmt.Errorf("prefix: %q: get %v: %w: stored %#x, read %#x", s.name, h.Key, ErrChecksum, h.CRC, got)
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

// VerifyHit checks a pinned hit's payload in place against its checksum,
// for callers that move the payload with the gather engine.
func (s *Store) VerifyHit(h Hit, scratch []byte) error {
	if int64(cap(scratch)) < h.Len {
		scratch = make([]byte, h.Len)
	}
	scratch = scratch[:h.Len]
	if err := s.r.ReadAt(scratch, h.Offset); err != nil {
		return err
	}
	if got := crc32.Checksum(scratch, castagnoli); got != h.CRC {
		return fmt.Errorf("prefix: %q: %v: %w: stored %#x, read %#x", s.name, h.Key, ErrChecksum, h.CRC, got)
	}
	return nil
}
