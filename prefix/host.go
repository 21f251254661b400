package prefix

import (
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/cxltier/cxltier/internal/crccopy"
	"github.com/cxltier/cxltier/tier"
)

// Set stores payloads[i] under keys[i] from host memory: reserve, write,
// flush, publish. It returns each key's status; keys present already are
// left as they are.
func (s *Store) Set(keys []Key, payloads [][]byte) ([]Status, error) {
	return s.SetPieces(keys, wholePieces(payloads))
}

// SetPieces stores under keys[i] the concatenation of pieces[i]: a page
// whose parts lie apart in host memory (an SGLang layer-first pool holds one
// piece per layer) is stored as one payload with no staging copy.
func (s *Store) SetPieces(keys []Key, pieces [][][]byte) ([]Status, error) {
	held, herr := s.hold("set")
	if herr != nil {
		return nil, herr
	}
	defer held.Done()
	if len(pieces) != len(keys) {
		return nil, fmt.Errorf("prefix: %q: set: %d keys but %d payloads: %w", s.name, len(keys), len(pieces), ErrBadConfig)
	}
	sizes := make([]int64, len(keys))
	var total int64
	for i, p := range pieces {
		sizes[i] = piecesLen(p)
		total += sizes[i]
	}
	if total <= inlineSetBytes {
		return s.setInline(held, keys, sizes, pieces)
	}
	res, err := s.Reserve(keys, sizes)
	if err != nil && res == nil {
		return nil, err
	}
	// Outside the locks, so the payloads are written side by side.
	crcs, werrs := make([]uint32, len(res)), make([]error, len(res))
	grain := int64(moveGrain)
	if s.mac != nil {
		grain = signGrain
	}
	eachInParallelBy(len(res), total, grain, func(i int) {
		if res[i].Status == Reserved {
			crcs[i], werrs[i] = s.writePayload(held, &res[i].Key, res[i].Offset, sizes[i], pieces[i])
			res[i].mac = s.sign(&res[i].Key, pieces[i])
		}
	})
	for i, werr := range werrs {
		if werr != nil {
			s.Abort(res)
			return nil, fmt.Errorf("prefix: %q: set %v: %w", s.name, keys[i], werr)
		}
	}
	if perr := s.Publish(res, crcs); perr != nil && err == nil {
		err = perr
	}
	return Statuses(res), err
}

// inlineSetBytes: a Set whose payloads come to at most this many bytes
// in all writes them while it holds each shard's lock, so that one hold
// reserves, writes and publishes. For small payloads the second hold costs
// more than the copy: its lock and state lines move between cores when
// processes insert at once. Larger payloads are written outside the lock,
// which other inserts into the shard would otherwise wait on.
const inlineSetBytes = 64 << 10

// setInline is SetPieces for small payloads: reserve, write and publish
// under one hold of each shard's lock. A writer that dies mid-copy leaves
// its reservation to the reaper, as between two holds.
func (s *Store) setInline(held tier.Hold, keys []Key, sizes []int64, pieces [][][]byte) ([]Status, error) {
	res, err := s.newReservations(keys, sizes)
	if err != nil {
		return nil, err
	}
	var ferr error
	var bytes, n uint64
	now := uint64(time.Now().UnixNano())
	err = s.byKeyShard(keys, func(sh *shard, idx []int) error {
		return s.locked(sh, func() {
			ferr = errors.Join(ferr, s.reserveLocked(sh, res, idx, now))
			for _, i := range idx {
				r := &res[i]
				if r.Status != Reserved {
					continue
				}
				crc, werr := s.writePayload(held, &r.Key, r.Offset, sizes[i], pieces[i])
				if werr != nil {
					s.dropLocked(r.entry)
					r.Status = NoSpace
					ferr = errors.Join(ferr, fmt.Errorf("prefix: %q: set %v: %w", s.name, keys[i], werr))
					continue
				}
				r.mac = s.sign(&r.Key, pieces[i])
				ok, perr := s.publishOne(sh, r, crc, now)
				if ok {
					bytes += uint64(r.Len)
					n++
				}
				ferr = errors.Join(ferr, perr)
			}
		})
	})
	s.count(ctrInserts, n)
	s.count(ctrBytesIn, bytes)
	if err == nil {
		err = ferr
	}
	return Statuses(res), err
}

// wholePieces views each payload as a payload of one piece.
func wholePieces(payloads [][]byte) [][][]byte {
	out := make([][][]byte, len(payloads))
	for i := range payloads {
		out[i] = payloads[i : i+1 : i+1]
	}
	return out
}

func piecesLen(pieces [][]byte) int64 {
	var n int64
	for _, p := range pieces {
		n += int64(len(p))
	}
	return n
}

// Statuses is each reservation's status, in order.
func Statuses(res []Reservation) []Status {
	out := make([]Status, len(res))
	for i, r := range res {
		out[i] = r.Status
	}
	return out
}

// writePayload copies pieces (n bytes in all) into key k's block at off,
// makes them visible to other hosts, and returns the entry's checksum of
// what the block now holds.
func (s *Store) writePayload(h tier.Hold, k *Key, off tier.Offset, n int64, pieces [][]byte) (uint32, error) {
	// Outside the lock the block is this client's only while its lease
	// is: a client reaped since it reserved (a pause past the lease
	// timeout) had the reservation reclaimed, and the block may hold
	// another's payload now.
	if err := h.Fenced(); err != nil {
		return 0, err
	}
	dst, err := s.r.Slice(off, n)
	if err != nil {
		return 0, err
	}
	crc := s.g.crcSeed(k)
	for _, p := range pieces {
		crc = crccopy.Update(crc, dst, p)
		dst = dst[len(p):]
	}
	return crc, s.r.Publish(off, n)
}

// Get copies the payloads of the longest ready prefix of keys into dst
// (dst[i] must hold the payload; it is resliced to its length) and returns
// how many keys it served. Every payload is checked against its CRC-32C; an
// entry that fails is dropped, counted, and reported with ErrChecksum. A
// batch of megabytes is copied by several goroutines, so buffers past the
// served prefix may have been written too.
func (s *Store) Get(keys []Key, dst [][]byte) (int, error) {
	held, herr := s.hold("get")
	if herr != nil {
		return 0, herr
	}
	defer held.Done()
	if len(dst) < len(keys) {
		return 0, fmt.Errorf("prefix: %q: get: %d keys but %d buffers: %w", s.name, len(keys), len(dst), ErrBadConfig)
	}
	return s.serve(keys, func(i int, h Hit) error {
		if int64(cap(dst[i])) < h.Len {
			return fmt.Errorf("get %v: buffer of %d bytes for a %d-byte payload: %w", h.Key, cap(dst[i]), h.Len, ErrBadConfig)
		}
		dst[i] = dst[i][:h.Len]
		return s.readHit(h, dst[i:i+1], s.verifying())
	})
}

// GetPieces is Get into scattered pieces: the payload of keys[i] is split
// over dst[i] in order, and must be exactly as long as they are together
// (the pieces are the places of one page in a host pool; a payload of
// another size is a page of another layout and is refused, not cut).
func (s *Store) GetPieces(keys []Key, dst [][][]byte) (int, error) {
	held, herr := s.hold("get")
	if herr != nil {
		return 0, herr
	}
	defer held.Done()
	if len(dst) < len(keys) {
		return 0, fmt.Errorf("prefix: %q: get: %d keys but %d buffers: %w", s.name, len(keys), len(dst), ErrBadConfig)
	}
	return s.serve(keys, func(i int, h Hit) error {
		if n := piecesLen(dst[i]); n != h.Len {
			return fmt.Errorf("get %v: %d bytes of buffers for a %d-byte payload: %w", h.Key, n, h.Len, ErrBadConfig)
		}
		return s.readHit(h, dst[i], s.verifying())
	})
}

// serve looks keys up, pinned, and has read copy each hit, on several
// goroutines when the hits come to megabytes (read(i) must touch only
// buffer i's memory); it returns how many were served before the first
// miss or failure.
func (s *Store) serve(keys []Key, read func(i int, h Hit) error) (int, error) {
	hits, err := s.Lookup(keys)
	if err != nil {
		return 0, err
	}
	defer func() { s.Release(hits) }()
	var bytes int64
	for _, h := range hits {
		bytes += h.Len
	}
	errs := make([]error, len(hits))
	eachInParallel(len(hits), bytes, func(i int) { errs[i] = read(i, hits[i]) })
	for i, err := range errs {
		if err != nil {
			// The prefix served ends at the first failure, as if read in turn.
			if errors.Is(err, ErrChecksum) || errors.Is(err, ErrUnsigned) {
				h := hits[i]
				s.Release(hits[i:])
				hits = hits[:i]
				s.dropCorrupt(h.Key)
			}
			return i, fmt.Errorf("prefix: %q: %w", s.name, err)
		}
	}
	s.count(ctrBytesOut, uint64(bytes))
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

// VerifyReads sets whether Get and GetPieces check every payload against
// its checksum (on by default). Off, a read is a plain copy, and a payload
// damaged in the tier reaches the caller unnoticed; inserts still record
// every checksum, so readers that keep it on, Snapshot and Check still
// catch damage. bench/prefix measures reads both ways.
//
// A keyed index checks every read whatever VerifyReads says: its pages'
// signatures are what keep writers without the key out (mac.go).
func (s *Store) VerifyReads(on bool) { s.skipVerify.Store(!on) }

// verifying reports whether reads check what they serve.
func (s *Store) verifying() bool { return s.mac != nil || !s.skipVerify.Load() }

// readHit copies a pinned hit's payload (h.Len bytes) into dst's pieces in
// order, which together hold exactly that, and, if verify, checks it
// against the stored checksum.
func (s *Store) readHit(h Hit, dst [][]byte, verify bool) error {
	src, err := s.payload(h.Offset, h.Len)
	if err != nil {
		return fmt.Errorf("%v: %w", h.Key, err)
	}
	if !verify {
		for _, d := range dst {
			src = src[copy(d, src):]
		}
		return nil
	}
	crc := s.g.crcSeed(&h.Key)
	for _, d := range dst {
		crc = crccopy.Update(crc, d, src[:len(d)])
		src = src[len(d):]
	}
	if crc != h.CRC {
		return fmt.Errorf("%v: %w: stored %#x, read %#x", h.Key, ErrChecksum, h.CRC, crc)
	}
	// Signed as copied: what the caller got, not the tier's bytes, which a
	// writer racing this read could have changed since.
	return s.checkSigned(&h, dst)
}

// VerifyHit checks a pinned hit's payload in place against its checksum,
// for callers that move the payload with the gather engine.
func (s *Store) VerifyHit(h Hit) error {
	held, herr := s.hold("verify")
	if herr != nil {
		return herr
	}
	defer held.Done()
	src, err := s.payload(h.Offset, h.Len)
	if err != nil {
		return fmt.Errorf("prefix: %q: %v: %w", s.name, h.Key, err)
	}
	if got := crc32.Update(s.g.crcSeed(&h.Key), castagnoli, src); got != h.CRC {
		return fmt.Errorf("prefix: %q: %v: %w: stored %#x, read %#x", s.name, h.Key, ErrChecksum, h.CRC, got)
	}
	if err := s.checkSigned(&h, [][]byte{src}); err != nil {
		return fmt.Errorf("prefix: %q: %w", s.name, err)
	}
	return nil
}
