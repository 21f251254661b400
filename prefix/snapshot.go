package prefix

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"
)

// Snapshot file: a zstd stream of
//
//	header  "CXLTPSN1" · version u32 · block bytes u64 · entries u64 · created ns i64
//	records tag 1 · key [32] · length u32 · CRC-32C u32 · payload
//	trailer tag 0 · records u64 · CRC-32C of every byte before the trailer u32
//
// Restore checks each payload against its CRC, and the record count and
// the running CRC against the trailer, so a truncated or damaged file is
// refused rather than half-loaded silently.

var snapMagic = [8]byte{'C', 'X', 'L', 'T', 'P', 'S', 'N', '1'}

const (
	snapVersion   = 1
	snapHeaderLen = 8 + 4 + 8 + 8 + 8
	tagRecord     = 1
	tagEnd        = 0
)

// SnapshotInfo describes a snapshot written or restored.
type SnapshotInfo struct {
	Entries  int64 // records in the file
	Bytes    int64 // payload bytes
	Restored int64 // entries inserted on restore (the rest existed)
}

// progress prints a line a second after the work began and at most once a
// second from then on, then a last one (so work of under a second prints
// that one alone, not the same count twice).
type progress struct {
	w     io.Writer
	what  string
	total int64
	last  time.Time
}

func (p *progress) show(done, bytes int64, final bool) {
	if p.w == nil {
		return
	}
	if !final && p.last.IsZero() {
		p.last = time.Now()
		return
	}
	if !final && time.Since(p.last) < time.Second {
		return
	}
	p.last = time.Now()
	pct := ""
	if p.total > 0 {
		pct = fmt.Sprintf(" (%.0f%%)", 100*float64(min(done, p.total))/float64(p.total))
	}
	fmt.Fprintf(p.w, "prefix: %s %d entries%s, %.1f MiB\n", p.what, done, pct, float64(bytes)/(1<<20))
}

// Snapshot writes every ready entry to w, compressed. Entries are pinned
// while read and checked against their CRC; inserts that race with it may
// or may not be included.
func (s *Store) Snapshot(w io.Writer, progressTo io.Writer) (SnapshotInfo, error) {
	held, herr := s.hold("snapshot")
	if herr != nil {
		return SnapshotInfo{}, herr
	}
	defer held.Done()
	if err := s.entries("snapshot"); err != nil {
		return SnapshotInfo{}, err
	}
	var info SnapshotInfo
	zw, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedDefault))
	if err != nil {
		return info, fmt.Errorf("prefix: snapshot: %w", err)
	}
	crc := crc32.New(castagnoli)
	out := io.MultiWriter(zw, crc)
	hdr := make([]byte, snapHeaderLen)
	copy(hdr, snapMagic[:])
	binary.LittleEndian.PutUint32(hdr[8:], snapVersion)
	binary.LittleEndian.PutUint64(hdr[12:], uint64(s.g.BlockBytes))
	binary.LittleEndian.PutUint64(hdr[20:], uint64(s.Stats().Ready))
	binary.LittleEndian.PutUint64(hdr[28:], uint64(time.Now().UnixNano()))
	if _, err := out.Write(hdr); err != nil {
		return info, fmt.Errorf("prefix: snapshot: %w", err)
	}
	prog := &progress{w: progressTo, what: "snapshot", total: s.Stats().Ready}
	buf := make([]byte, s.g.BlockBytes)
	for i := uint32(0); int64(i) < s.g.Entries; i++ {
		if wordState(atomic.LoadUint64(u64At(s.readEntry(i), entWord))) != stReady {
			continue
		}
		k := s.keyOf(i)
		n, err := s.snapshotOne(out, k, buf)
		if err != nil {
			return info, err
		}
		if n >= 0 {
			info.Entries++
			info.Bytes += n
			prog.show(info.Entries, info.Bytes, false)
		}
	}
	tr := make([]byte, 13)
	binary.LittleEndian.PutUint64(tr[1:], uint64(info.Entries))
	zw.Write(tr[:9])
	crc.Write(tr[:9])
	binary.LittleEndian.PutUint32(tr[9:], crc.Sum32())
	zw.Write(tr[9:])
	if err := zw.Close(); err != nil {
		return info, fmt.Errorf("prefix: snapshot: %w", err)
	}
	prog.show(info.Entries, info.Bytes, true)
	return info, nil
}

// snapshotOne writes one key's record, or nothing (-1) if it went away.
func (s *Store) snapshotOne(out io.Writer, k Key, buf []byte) (int64, error) {
	hits, err := s.Lookup([]Key{k})
	if err != nil {
		return 0, fmt.Errorf("prefix: snapshot: %w", err)
	}
	if len(hits) == 0 {
		return -1, nil
	}
	defer s.Release(hits)
	h := hits[0]
	if err := s.readHit(h, [][]byte{buf[:h.Len]}, true); err != nil {
		s.count(ctrChecksumFailures, 1)
		return -1, nil // a damaged entry is left out, not carried into the file
	}
	rec := make([]byte, 1+32+4+4)
	rec[0] = tagRecord
	copy(rec[1:], k[:])
	binary.LittleEndian.PutUint32(rec[33:], uint32(h.Len))
	// The file's records carry the payload's own CRC-32C whatever the
	// index's layout (an entry's CRC covers its key from layout 5).
	binary.LittleEndian.PutUint32(rec[37:], crc32.Checksum(buf[:h.Len], castagnoli))
	if _, err := out.Write(rec); err != nil {
		return 0, fmt.Errorf("prefix: snapshot: %w", err)
	}
	if _, err := out.Write(buf[:h.Len]); err != nil {
		return 0, fmt.Errorf("prefix: snapshot: %w", err)
	}
	return h.Len, nil
}

// Restore inserts every entry of a snapshot into s (keys present already
// are kept), all or nothing: a first pass reads and verifies the whole file
// (every record's CRC, the count and CRC of the trailer, nothing after it)
// and refuses a snapshot with more entries than the index has blocks; only
// then does a second pass insert, and if an insert fails, the entries it
// inserted are deleted again. A bad file is ErrBadSnapshot and changes
// nothing.
func (s *Store) Restore(r io.ReadSeeker, progressTo io.Writer) (SnapshotInfo, error) {
	held, herr := s.hold("restore")
	if herr != nil {
		return SnapshotInfo{}, herr
	}
	defer held.Done()
	if err := s.entries("restore"); err != nil {
		return SnapshotInfo{}, err
	}
	// Each shard holds a fixed share of the blocks, and a key's shard is
	// its hash's: a snapshot that fits the index in total can still
	// overflow a shard, which would evict entries the restore just made.
	perShard := make([]int64, len(s.shards))
	seen := make(map[Key]struct{})
	total, err := s.readSnapshot(r, "verify", progressTo, func(k Key, _ []byte, info *SnapshotInfo) error {
		// A snapshot holds each key once: a repeated one (a file put together
		// by hand, or damaged) would count twice against the room it needs.
		if _, dup := seen[k]; dup {
			return fmt.Errorf("prefix: restore: record %d: %w: key %v appears twice", info.Entries, ErrBadSnapshot, k)
		}
		seen[k] = struct{}{}
		perShard[keyHash(&k)>>s.shardShift]++
		return nil
	})
	if err != nil {
		return SnapshotInfo{}, err
	}
	if total.Entries > s.g.Blocks {
		return SnapshotInfo{}, fmt.Errorf("prefix: restore: the snapshot holds %d entries, index %q has %d blocks: %w (create a larger index)",
			total.Entries, s.name, s.g.Blocks, ErrNoSpace)
	}
	for k, n := range perShard {
		if b := int64(s.shards[k].blocks); n > b {
			return SnapshotInfo{}, fmt.Errorf("prefix: restore: %d of the snapshot's entries hash to shard %d of index %q, which holds %d blocks (%d shards of about %d): %w (create an index with more blocks, or fewer shards)",
				n, k, s.name, b, len(s.shards), s.g.Blocks/int64(len(s.shards)), ErrNoSpace)
		}
	}
	if _, err := r.Seek(0, io.SeekStart); err != nil {
		return SnapshotInfo{}, fmt.Errorf("prefix: restore: rewind: %w", err)
	}
	var inserted []Key
	info, err := s.readSnapshot(r, "restore", progressTo, func(k Key, payload []byte, info *SnapshotInfo) error {
		st, err := s.Set([]Key{k}, [][]byte{payload})
		if err != nil {
			return fmt.Errorf("prefix: restore: key %v: %w", k, err)
		}
		switch st[0] {
		case Reserved:
			info.Restored++
			inserted = append(inserted, k)
		case NoSpace:
			return fmt.Errorf("prefix: restore: key %v: %w", k, ErrNoSpace)
		}
		return nil
	})
	if err == nil && (info.Entries != total.Entries || info.Bytes != total.Bytes) {
		err = fmt.Errorf("prefix: restore: %w: the file changed between its passes", ErrBadSnapshot)
	}
	// Every entry it made must still be there: another client's inserts
	// into a shard near full can evict them while the restore runs.
	if err == nil && len(inserted) > 0 {
		if kept := s.countPresent(inserted); kept != len(inserted) {
			err = fmt.Errorf("prefix: restore: %d of the %d entries it made were evicted before it finished: %w", len(inserted)-kept, len(inserted), ErrNoSpace)
		}
	}
	if err != nil {
		if _, derr := s.Delete(inserted); derr != nil {
			return SnapshotInfo{}, fmt.Errorf("%w (and removing the %d entries it inserted failed: %v)", err, len(inserted), derr)
		}
		return SnapshotInfo{}, fmt.Errorf("%w (the %d entries it had inserted were removed)", err, len(inserted))
	}
	return info, nil
}

// readSnapshot reads and verifies a snapshot, calling each (when not nil)
// with every record once its CRC checked, and returns its counts.
func (s *Store) readSnapshot(r io.Reader, what string, progressTo io.Writer, each func(Key, []byte, *SnapshotInfo) error) (SnapshotInfo, error) {
	var info SnapshotInfo
	zr, err := zstd.NewReader(r)
	if err != nil {
		return info, fmt.Errorf("prefix: restore: %w", err)
	}
	defer zr.Close()
	crc := crc32.New(castagnoli)
	buffered := bufio.NewReaderSize(zr, 1<<20)
	in := io.TeeReader(buffered, crc)
	hdr := make([]byte, snapHeaderLen)
	if _, err := io.ReadFull(in, hdr); err != nil {
		return info, fmt.Errorf("prefix: restore: %w: header: %v", ErrBadSnapshot, err)
	}
	if [8]byte(hdr[:8]) != snapMagic {
		return info, fmt.Errorf("prefix: restore: %w: magic %q", ErrBadSnapshot, hdr[:8])
	}
	if v := binary.LittleEndian.Uint32(hdr[8:]); v != snapVersion {
		return info, fmt.Errorf("prefix: restore: %w: version %d", ErrBadSnapshot, v)
	}
	if bb := int64(binary.LittleEndian.Uint64(hdr[12:])); bb > s.g.BlockBytes {
		return info, fmt.Errorf("prefix: restore: %w: snapshot of %d-byte blocks into an index of %d-byte blocks", ErrTooLarge, bb, s.g.BlockBytes)
	}
	prog := &progress{w: progressTo, what: what, total: int64(binary.LittleEndian.Uint64(hdr[20:]))}
	for {
		done, err := s.restoreOne(in, crc, &info, each)
		if err != nil {
			return info, err
		}
		if done {
			break
		}
		prog.show(info.Entries, info.Bytes, false)
	}
	// Nothing may follow the trailer: not data, not a second zstd frame.
	if n, err := buffered.Read(make([]byte, 1)); n > 0 || err != io.EOF {
		return info, fmt.Errorf("prefix: restore: %w: data after the trailer (%v)", ErrBadSnapshot, err)
	}
	prog.show(info.Entries, info.Bytes, true)
	return info, nil
}

func (s *Store) restoreOne(in io.Reader, crc hash.Hash32, info *SnapshotInfo, each func(Key, []byte, *SnapshotInfo) error) (bool, error) {
	bad := func(f string, a ...any) error {
		return fmt.Errorf("prefix: restore: record %d: %w: %s", info.Entries, ErrBadSnapshot, fmt.Sprintf(f, a...))
	}
	var tag [1]byte
	if _, err := io.ReadFull(in, tag[:]); err != nil {
		return false, bad("no trailer (truncated file?): %v", err)
	}
	switch tag[0] {
	case tagEnd:
		var n [8]byte
		if _, err := io.ReadFull(in, n[:]); err != nil {
			return false, bad("trailer: %v", err)
		}
		want := crc.Sum32()
		var sum [4]byte
		if _, err := io.ReadFull(in, sum[:]); err != nil {
			return false, bad("trailer: %v", err)
		}
		if got := int64(binary.LittleEndian.Uint64(n[:])); got != info.Entries {
			return false, bad("trailer counts %d records, file held %d", got, info.Entries)
		}
		if got := binary.LittleEndian.Uint32(sum[:]); got != want {
			return false, bad("file CRC %#x, computed %#x", got, want)
		}
		return true, nil
	case tagRecord:
	default:
		return false, bad("tag %d", tag[0])
	}
	rec := make([]byte, 40)
	if _, err := io.ReadFull(in, rec); err != nil {
		return false, bad("%v", err)
	}
	k := Key(rec[:32])
	n := int64(binary.LittleEndian.Uint32(rec[32:]))
	want := binary.LittleEndian.Uint32(rec[36:])
	if n > s.g.BlockBytes {
		return false, bad("payload of %d bytes exceeds %d", n, s.g.BlockBytes)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(in, payload); err != nil {
		return false, bad("payload: %v", err)
	}
	if got := crc32.Checksum(payload, castagnoli); got != want {
		return false, bad("key %v: payload CRC %#x, recorded %#x", k, got, want)
	}
	if each != nil {
		if err := each(k, payload, info); err != nil {
			return false, err
		}
	}
	info.Entries++
	info.Bytes += n
	return false, nil
}

// countPresent is how many of keys have an entry (in any order, unlike
// Exists, which counts a leading run).
func (s *Store) countPresent(keys []Key) int {
	n := 0
	for i := range keys {
		n += s.Exists(keys[i : i+1])
	}
	return n
}
