package rooms

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/cxltier/cxltier/internal/errkind"
	"github.com/cxltier/cxltier/internal/words"
)

// ErrShortBuffer: a record is larger than the buffer given for it.
var ErrShortBuffer = errkind.New(errkind.Range, "rooms: buffer too small for the record")

// Area header offsets: seq u64 · writer token u64 · gen u32 · length u32 ·
// crc u32 (of 8..24 and the records); records from byte 64.
const (
	areaSeq   = 0
	areaToken = 8
	areaGen   = 16
	areaLen   = 20
	areaCRC   = 24
	maxKind   = 64
)

// area is one side's records as read: kinds in the order written.
type area struct {
	token   uint64
	kinds   []string
	records [][]byte
}

func (a *area) has(kind string) bool { return a.find(kind) >= 0 }

func (a *area) find(kind string) int {
	for i, k := range a.kinds {
		if k == kind {
			return i
		}
	}
	return -1
}

func (a *area) set(kind string, data []byte) {
	i := a.find(kind)
	switch {
	case data == nil && i >= 0:
		a.kinds = append(a.kinds[:i], a.kinds[i+1:]...)
		a.records = append(a.records[:i], a.records[i+1:]...)
	case data == nil:
	case i >= 0:
		a.records[i] = data
	default:
		a.kinds, a.records = append(a.kinds, kind), append(a.records, data)
	}
}

func (a *area) encode() []byte {
	var out []byte
	for i, k := range a.kinds {
		out = append(out, byte(len(k)))
		out = append(out, k...)
		out = binary.LittleEndian.AppendUint32(out, uint32(len(a.records[i])))
		out = append(out, a.records[i]...)
	}
	return out
}

// decodeRecords parses an area's records; every length is checked against
// what is left, so damage is an error, never a slice out of range.
func decodeRecords(b []byte) (area, error) {
	var a area
	for len(b) > 0 {
		k := int(b[0])
		if k == 0 || k > maxKind || 1+k+4 > len(b) {
			return a, fmt.Errorf("a record's kind of %d bytes at %d left", k, len(b))
		}
		kind := string(b[1 : 1+k])
		n := int(binary.LittleEndian.Uint32(b[1+k:]))
		b = b[1+k+4:]
		if n > len(b) {
			return a, fmt.Errorf("record %q of %d bytes with %d left", kind, n, len(b))
		}
		a.kinds, a.records = append(a.kinds, kind), append(a.records, b[:n:n])
		b = b[n:]
	}
	return a, nil
}

func areaCRCOf(hdr, records []byte) uint32 {
	return crc32.Update(crc32.Checksum(hdr[8:24], castagnoli), castagnoli, records)
}

// Put sets one record of side's area of room rm (data nil deletes it).
// Only one process writes a side of a room (its goroutines take turns).
func (t *Table) Put(rm Room, side Side, kind string, data []byte) error {
	if err := checkKind(kind); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.check(rm); err != nil {
		return err
	}
	a, err := t.readArea(rm, side)
	if err != nil {
		return err
	}
	if data != nil && len(data) == 0 {
		data = []byte{}
	}
	a.set(kind, data)
	records := a.encode()
	if len(records) > t.AreaBytes() {
		return fmt.Errorf("%w: table %q: the %s side's records would take %d bytes, a room holds %d", ErrTooLarge, t.name, side, len(records), t.AreaBytes())
	}
	if err := t.writeArea(rm, side, records); err != nil {
		return err
	}
	return t.check(rm) // claimed anew meanwhile: what was written is the stale generation's
}

func checkKind(kind string) error {
	if kind == "" || len(kind) > maxKind {
		return fmt.Errorf("%w: record kind %q: want 1..%d bytes", ErrBadConfig, kind, maxKind)
	}
	return nil
}

// writeArea rewrites side's area under its sequence word: odd while the
// records change, even again once the header's checksum covers them.
func (t *Table) writeArea(rm Room, side Side, records []byte) error {
	off := t.areaOff(rm.Slot, side)
	b, err := t.mem(off, line+len(records))
	if err != nil {
		return err
	}
	sig, err := t.signatureFor(rm, side, records)
	if err != nil {
		return err
	}
	seq := words.U64At(b, areaSeq)
	s := atomic.LoadUint64(seq)
	atomic.StoreUint64(seq, s|1)
	if err := t.publish(off, line); err != nil {
		return err
	}
	copy(b[line:], records)
	binary.LittleEndian.PutUint64(b[areaToken:], t.c.Token())
	binary.LittleEndian.PutUint32(b[areaGen:], rm.Gen)
	binary.LittleEndian.PutUint32(b[areaLen:], uint32(len(records)))
	copy(b[areaMAC:areaMAC+macBytes], sig) // without a key, nothing: those bytes are not read
	binary.LittleEndian.PutUint32(b[areaCRC:], areaCRCOf(b[:line], records))
	if err := t.publish(off+line, int64(len(records))); err != nil {
		return err
	}
	atomic.StoreUint64(seq, (s|1)+1)
	return t.publish(off, line)
}

// Get copies record kind of side's area of room rm into buf: its length
// and whether the side wrote it. A record larger than buf is
// ErrShortBuffer with its length.
func (t *Table) Get(rm Room, side Side, kind string, buf []byte) (int, bool, error) {
	if err := t.check(rm); err != nil {
		return 0, false, err
	}
	a, err := t.readArea(rm, side)
	if err != nil {
		return 0, false, err
	}
	i := a.find(kind)
	if i < 0 {
		return 0, false, nil
	}
	if len(a.records[i]) > len(buf) {
		return len(a.records[i]), true, fmt.Errorf("%w: record %q of %d bytes, a buffer of %d", ErrShortBuffer, kind, len(a.records[i]), len(buf))
	}
	return copy(buf, a.records[i]), true, nil
}

// readArea reads side's area of rm as a consistent snapshot: the sequence
// word even and unchanged across the copy. An area of another generation
// (an earlier claim's) is empty.
func (t *Table) readArea(rm Room, side Side) (area, error) {
	off := t.areaOff(rm.Slot, side)
	max := t.AreaBytes()
	b, err := t.mem(off, line+max)
	if err != nil {
		return area{}, err
	}
	snap := make([]byte, line, line+max)
	var deadline time.Time
	for try := 0; ; try++ {
		if err := t.refresh(off, line); err != nil {
			return area{}, err
		}
		s1 := atomic.LoadUint64(words.U64At(b, areaSeq))
		if s1&1 == 0 {
			copy(snap, b[:line])
			// Only the length the header gives (bounded by the area): a
			// torn header is caught by the sequence word or the checksum.
			n := min(int(binary.LittleEndian.Uint32(snap[areaLen:])), max)
			if err := t.refresh(off+line, int64(n)); err != nil {
				return area{}, err
			}
			snap = append(snap[:line], b[line:line+n]...)
			if atomic.LoadUint64(words.U64At(b, areaSeq)) == s1 {
				return t.parseArea(rm, side, snap, max)
			}
		} else if done, err := t.midWrite(rm, side, b); done {
			return area{}, err
		}
		if try == spinTries {
			deadline = time.Now().Add(readWait)
		} else if try > spinTries && time.Now().After(deadline) {
			break
		}
		pause(try)
	}
	return area{}, fmt.Errorf("%w: table %q, slot %d: the %s side's writer stayed mid-write for %v", ErrBusy, t.name, rm.Slot, side, readWait)
}

// midWrite judges an area whose sequence word is odd, header b: done with
// no error when the writer writes another generation's records (this
// room's has none yet: the write is not done), done with ErrWriterGone
// when this generation's writer died inside its window (its records are
// lost, and its area is never even again until the next generation's
// first write mends it), not done while that writer may still run. The
// writer stores its token and the generation before the sequence word
// turns even, so a generation read as this room's comes with its
// writer's token.
func (t *Table) midWrite(rm Room, side Side, b []byte) (bool, error) {
	if binary.LittleEndian.Uint32(b[areaGen:]) != rm.Gen {
		return true, nil
	}
	token := binary.LittleEndian.Uint64(b[areaToken:])
	if token != t.c.Token() && !t.r.TokenRuns(token) {
		return true, fmt.Errorf("%w: table %q, slot %d, the %s side's records", ErrWriterGone, t.name, rm.Slot, side)
	}
	return false, nil
}

// pause waits a little longer on each try of a reader: yield to the
// writer first, then sleep, so that a writer whose process the kernel
// preempted mid-write (a busy machine) gets the core back.
func pause(try int) {
	if try < spinTries {
		runtime.Gosched()
		return
	}
	time.Sleep(time.Duration(1<<min(try-spinTries, 10)) * time.Microsecond)
}

func (t *Table) parseArea(rm Room, side Side, snap []byte, max int) (area, error) {
	if binary.LittleEndian.Uint32(snap[areaGen:]) != rm.Gen {
		return area{}, nil
	}
	n := int(binary.LittleEndian.Uint32(snap[areaLen:]))
	if n > max || n > len(snap)-line {
		return area{}, fmt.Errorf("%w: table %q, slot %d: the %s side's records say %d bytes, a room holds %d", ErrCorrupt, t.name, rm.Slot, side, n, max)
	}
	records := snap[line : line+n]
	if binary.LittleEndian.Uint32(snap[areaCRC:]) != areaCRCOf(snap[:line], records) {
		return area{}, fmt.Errorf("%w: table %q, slot %d: the %s side's records fail their checksum", ErrCorrupt, t.name, rm.Slot, side)
	}
	if err := t.checkSigned(rm, side, snap[:line], records); err != nil {
		return area{}, err
	}
	a, err := decodeRecords(records)
	if err != nil {
		return area{}, fmt.Errorf("%w: table %q, slot %d: the %s side's records: %v", ErrCorrupt, t.name, rm.Slot, side, err)
	}
	a.token = binary.LittleEndian.Uint64(snap[areaToken:])
	return a, nil
}
