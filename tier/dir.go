package tier

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"sync/atomic"
	"time"
	"unicode/utf8"
)

// The root directory maps names to regions of the tier (an Engram table, a
// prefix index). Writers hold the system lock; readers take no lock and use
// the entry's sequence word (odd while a write is in progress) to detect a
// torn read and retry.
//
// Entry layout (128 B): seq u32 · kind u32 · offset u64 · size u64 ·
// created i64 · name length u32 · pad · second run offset u64 at byte 40 ·
// its size u64 at 48 · CRC-32C u32 at 56 · its mark u32 at 60 · name
// [64]byte at byte 64. The second run and the checksum came later into what
// was padding, zero in older entries (no second run, no checksum), unread
// by older readers. The checksum covers bytes 4 to 56 and the name area:
// an entry whose runs were damaged would otherwise name another client's
// chunks, which a reaper then kept for it instead of freeing.

// DirEntry is one named object in the root directory.
type DirEntry struct {
	Name    string    `json:"name"`
	Kind    uint32    `json:"kind"` // caller-defined; 0 is reserved for "empty"
	Offset  Offset    `json:"offset"`
	Size    int64     `json:"size"`
	Created time.Time `json:"created"`
	// Run2 and Run2Size are a second run of chunks the object owns (a
	// prefix index's payload blocks, apart from its metadata), so that
	// audits and reapers know every chunk of it; 0 bytes: none.
	Run2     Offset `json:"run2,omitempty"`
	Run2Size int64  `json:"run2_size,omitempty"`
}

// runs are the entry's runs of chunks: its span, and the second run when
// it has one.
func (e DirEntry) runs() [][2]int64 {
	out := [][2]int64{{int64(e.Offset), e.Size}}
	if e.Run2Size > 0 {
		out = append(out, [2]int64{int64(e.Run2), e.Run2Size})
	}
	return out
}

// KindTag is the kind's four characters when they are printable ASCII
// (packages choose kinds that spell a tag: "EGR1", "OBJ1"), else "".
func (e DirEntry) KindTag() string {
	b := []byte{byte(e.Kind >> 24), byte(e.Kind >> 16), byte(e.Kind >> 8), byte(e.Kind)}
	for _, c := range b {
		if c < ' ' || c > '~' {
			return ""
		}
	}
	return string(b)
}

// MarshalJSON adds kind_tag beside the numeric kind, so that status pages
// and inspect -json say what an entry is.
func (e DirEntry) MarshalJSON() ([]byte, error) {
	type plain DirEntry
	return json.Marshal(struct {
		plain
		KindTag string `json:"kind_tag,omitempty"`
	}{plain(e), e.KindTag()})
}

type dirEntry struct {
	DirEntry
	seq uint32
}

const tornAfter = 10 * time.Millisecond

func (e dirEntry) empty() bool { return e.Kind == 0 }
func (e dirEntry) torn() bool  { return e.seq%2 == 1 }

const dirCRCMark = 0x31435243 // "CRC1": the entry carries a checksum

var dirCastagnoli = crc32.MakeTable(crc32.Castagnoli)

func dirEntryCRC(b []byte) uint32 {
	return crc32.Update(crc32.Checksum(b[4:56], dirCastagnoli), dirCastagnoli, b[64:dirEntryLen])
}

func checkDirName(name string) error {
	if name == "" || len(name) > dirNameMax || !utf8.ValidString(name) {
		return fmt.Errorf("tier: directory name %q must be 1..%d bytes of UTF-8: %w", name, dirNameMax, ErrInvalidConfig)
	}
	for _, c := range name {
		if c < 0x20 || c == 0x7f {
			return fmt.Errorf("tier: directory name %q has a control character: %w", name, ErrInvalidConfig)
		}
	}
	return nil
}

// decodeDirEntry parses an entry and checks it against the region size.
func decodeDirEntry(b []byte, regionSize int64) (dirEntry, error) {
	le := binary.LittleEndian
	e := dirEntry{seq: le.Uint32(b[0:])}
	e.Kind = le.Uint32(b[4:])
	if e.torn() || e.empty() {
		return e, nil // a torn entry is repaired by the next writer
	}
	if le.Uint32(b[60:]) == dirCRCMark {
		if want, got := le.Uint32(b[56:]), dirEntryCRC(b); want != got {
			return e, fmt.Errorf("tier: checksum %#x, computed %#x: %w", want, got, ErrCorrupt)
		}
	}
	e.Offset = Offset(le.Uint64(b[8:]))
	e.Size = int64(le.Uint64(b[16:]))
	e.Created = time.Unix(0, int64(le.Uint64(b[24:])))
	n := le.Uint32(b[32:])
	if n == 0 || n > dirNameMax {
		return e, fmt.Errorf("tier: name length %d: %w", n, ErrCorrupt)
	}
	e.Name = string(b[64 : 64+n])
	if err := checkDirName(e.Name); err != nil {
		return e, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	e.Run2 = Offset(le.Uint64(b[40:]))
	e.Run2Size = int64(le.Uint64(b[48:]))
	for _, run := range e.runs() {
		if run[1] < 0 || uint64(run[0]) > uint64(regionSize) || uint64(run[1]) > uint64(regionSize)-uint64(run[0]) {
			return e, fmt.Errorf("tier: %q spans %#x+%d outside the %d-byte region: %w", e.Name, run[0], run[1], regionSize, ErrCorrupt)
		}
	}
	return e, nil
}

func encodeDirEntry(b []byte, e DirEntry) {
	le := binary.LittleEndian
	clear(b[4:])
	le.PutUint32(b[4:], e.Kind)
	le.PutUint64(b[8:], uint64(e.Offset))
	le.PutUint64(b[16:], uint64(e.Size))
	le.PutUint64(b[24:], uint64(e.Created.UnixNano()))
	le.PutUint32(b[32:], uint32(len(e.Name)))
	le.PutUint64(b[40:], uint64(e.Run2))
	le.PutUint64(b[48:], uint64(e.Run2Size))
	copy(b[64:], e.Name)
	if e.Kind != 0 {
		le.PutUint32(b[56:], dirEntryCRC(b))
		le.PutUint32(b[60:], dirCRCMark)
	}
}

// readDir reads entry i consistently, retrying while a writer is active.
// An entry that stays odd for tornAfter belongs to a writer that died
// mid-update (a live one finishes in microseconds); it reads as torn.
func (r *Region) readDir(i int) (dirEntry, error) {
	line := r.dirLine(i)
	seq := u32At(line, 0)
	var snap [dirEntryLen]byte
	var start time.Time
	for try := 0; ; try++ {
		r.sync.refresh(line)
		s1 := atomic.LoadUint32(seq)
		copy(snap[:], line)
		if s1%2 == 0 && atomic.LoadUint32(seq) == s1 {
			binary.LittleEndian.PutUint32(snap[0:], s1)
			return decodeDirEntry(snap[:], r.l.size())
		}
		if try == 0 {
			start = time.Now()
		} else if time.Since(start) > tornAfter {
			return dirEntry{seq: s1}, nil
		}
		backoff(try)
	}
}

// DirLookup finds a name without taking any lock.
func (r *Region) DirLookup(name string) (DirEntry, error) {
	if err := r.live("directory"); err != nil {
		return DirEntry{}, err
	}
	for i := 0; i < r.l.DirEntries; i++ {
		e, err := r.readDir(i)
		if err != nil {
			continue // damaged: Audit reports it; it names nothing it can be trusted for
		}
		if !e.empty() && !e.torn() && e.Name == name {
			return e.DirEntry, nil
		}
	}
	return DirEntry{}, fmt.Errorf("tier: directory %q: %w", name, ErrNotFound)
}

// DirList returns every live entry.
func (r *Region) DirList() ([]DirEntry, error) {
	var out []DirEntry
	if err := r.live("directory"); err != nil {
		return nil, err
	}
	for i := 0; i < r.l.DirEntries; i++ {
		e, err := r.readDir(i)
		if err != nil {
			continue // damaged: Audit reports it
		}
		if !e.empty() && !e.torn() {
			out = append(out, e.DirEntry)
		}
	}
	return out, nil
}

// writeDir rewrites entry i under the seqlock; the caller holds the system lock.
func (r *Region) writeDir(i int, e DirEntry) {
	line := r.dirLine(i)
	seq := u32At(line, 0)
	s := atomic.LoadUint32(seq) | 1 // odd: write in progress (also repairs a torn entry)
	atomic.StoreUint32(seq, s)
	r.sync.publish(line[:LineSize])
	encodeDirEntry(line, e)
	r.sync.publish(line)
	atomic.StoreUint32(seq, s+1)
	r.sync.publish(line[:LineSize])
}

// DirPut adds a name. It fails with ErrExists if the name is taken and with
// ErrDirFull when no entry is free.
func (c *Client) DirPut(e DirEntry) error {
	if err := checkDirName(e.Name); err != nil {
		return err
	}
	if e.Kind == 0 {
		return fmt.Errorf("tier: directory %q: kind 0 is reserved: %w", e.Name, ErrInvalidConfig)
	}
	for _, run := range e.runs() {
		if run[1] < 0 || uint64(run[0])+uint64(run[1]) > uint64(c.r.Size()) {
			return fmt.Errorf("tier: directory %q: %#x+%d outside region: %w", e.Name, run[0], run[1], ErrOutOfBounds)
		}
	}
	if e.Created.IsZero() {
		e.Created = time.Now()
	}
	return c.withLock(SystemLock, func() error { return c.r.dirPutLocked(e) })
}

// dirPutLocked adds a checked entry; the caller holds SystemLock.
func (r *Region) dirPutLocked(e DirEntry) error {
	free := -1
	for i := 0; i < r.l.DirEntries; i++ {
		cur, err := r.readDir(i)
		if err != nil {
			continue // damaged: neither free nor comparable; Audit reports it
		}
		switch {
		case cur.torn() || cur.empty():
			if free < 0 {
				free = i
			}
		case cur.Name == e.Name:
			return fmt.Errorf("tier: directory %q: %w", e.Name, ErrExists)
		}
	}
	if free < 0 {
		return fmt.Errorf("tier: directory %q (%d entries): %w", e.Name, r.l.DirEntries, ErrDirFull)
	}
	r.writeDir(free, e)
	return nil
}

// DirSetRun2 records the second run of an existing entry of that name and
// kind written without one (before entries had the field), so that audits
// and reapers learn it. An entry that has one already is left as it is.
func (c *Client) DirSetRun2(name string, kind uint32, off Offset, size int64) error {
	if size <= 0 || uint64(off)+uint64(size) > uint64(c.r.Size()) {
		return fmt.Errorf("tier: directory %q: second run %v+%d outside region: %w", name, off, size, ErrOutOfBounds)
	}
	return c.withLock(SystemLock, func() error {
		for i := 0; i < c.r.l.DirEntries; i++ {
			cur, err := c.r.readDir(i)
			if err != nil || cur.empty() || cur.torn() || cur.Name != name || cur.Kind != kind {
				continue
			}
			if cur.Run2Size == 0 {
				e := cur.DirEntry
				e.Run2, e.Run2Size = off, size
				c.r.writeDir(i, e)
			}
			return nil
		}
		return fmt.Errorf("tier: directory %q: %w", name, ErrNotFound)
	})
}

// DirDelete removes a name.
func (c *Client) DirDelete(name string) error {
	return c.withLock(SystemLock, func() error { return c.dirDeleteLocked(name) })
}

// dirDeleteLocked is DirDelete for a caller holding the system lock.
func (c *Client) dirDeleteLocked(name string) error {
	for i := 0; i < c.r.l.DirEntries; i++ {
		cur, err := c.r.readDir(i)
		if err != nil {
			continue // damaged: Audit reports it
		}
		if !cur.empty() && !cur.torn() && cur.Name == name {
			c.r.writeDir(i, DirEntry{})
			return nil
		}
	}
	return fmt.Errorf("tier: directory %q: %w", name, ErrNotFound)
}
