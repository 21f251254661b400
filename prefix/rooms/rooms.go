// Package rooms owns the rendezvous of prefill-to-decode transfers in the
// tier: a table of rooms, each the records two processes (a decode and a
// prefill rank of one request) leave each other. A room is claimed by the
// decode, found by the prefill, and freed by the second side to end it
// (End); nothing evicts a live room, so a table with every
// slot in flight refuses a new room (ErrFull) instead of losing an old one.
//
// The table is a named tier object ("rooms/<name>") of fixed slots:
//
//	slot 0: the header line: magic u64 · version u32 · slots u32 ·
//	        slot bytes u32 · crc u32 at 60 (of 0..60)
//	slot i+1: room i:
//	  line 0: state u64 (gen<<32 | claimed) · room u64 · rank u32 ·
//	          ready u32 (= gen once the identity is written) ·
//	          claimant lease token u64 · crc u32 at 60 (of room, rank, token)
//	  then two areas, the decode's and the prefill's, each written by its
//	  side alone: seq u64 (odd while written) · writer token u64 ·
//	  gen u32 · length u32 · crc u32 (of 8..24 and the records) · in a
//	  table with a key, a signature [16] at 32 (sign.go), and from
//	  byte 64 the records: kind length u8 · kind · data length u32 · data.
//
// The state words change only under the table's tier lock (claims,
// frees); an area changes only by its side's writer, under a sequence
// word, so readers take no lock. Every word read is bounds-checked and
// checksummed: damage reads as ErrCorrupt naming the table and the slot.
// On a tier shared by several hosts every write is published and every
// read refreshed first.
package rooms

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cxltier/cxltier/internal/errkind"
	"github.com/cxltier/cxltier/internal/words"
	"github.com/cxltier/cxltier/tier"
)

// Errors callers test with errors.Is.
var (
	// ErrFull: every slot holds a live room.
	ErrFull = errkind.New(errkind.NoSpace, "rooms: every slot holds a live room")
	// ErrGone: the room was freed, reclaimed or claimed anew since the
	// handle was taken.
	ErrGone = errkind.New(errkind.NotFound, "rooms: room gone")
	// ErrCorrupt: a slot or the header failed its checks.
	ErrCorrupt = errkind.New(errkind.Damaged, "rooms: table damaged")
	// ErrWriterGone: a side's process died while it wrote its records;
	// they are lost (an ErrCorrupt too).
	ErrWriterGone = fmt.Errorf("%w: a writer died mid-write", ErrCorrupt)
	// ErrTooLarge: a record does not fit its side's area.
	ErrTooLarge = errkind.New(errkind.Invalid, "rooms: record too large")
	// ErrBadConfig: a table of that shape cannot be made.
	ErrBadConfig = errkind.New(errkind.Invalid, "rooms: bad table configuration")
	// ErrBusy: an area kept changing under a reader.
	ErrBusy = errkind.New(errkind.Busy, "rooms: room being written")
	// ErrInFlight: a claim of a room another decode holds and has not
	// ended (rooms are one request's).
	ErrInFlight = errkind.New(errkind.Exists, "rooms: room in flight")
)

// Side names the writer of one area of a room.
type Side int

const (
	Decode  Side = 0
	Prefill Side = 1
)

func (s Side) String() string {
	if s == Decode {
		return "decode"
	}
	return "prefill"
}

const (
	magic        = 0x314d4f4f524c5843 // "CXLROOM1"
	version      = 1
	line         = 64
	minSlotBytes = 1024
	maxSlotBytes = 1 << 20
	maxSlots     = 1 << 20
	claimed      = 1
	// A reader retries an area that changed under it spinTries times,
	// then for readWait more before it says ErrBusy. A writer's window is
	// one copy of at most a slot, but a busy machine can preempt the
	// writer's process inside it for a few time slices: a bound on tries
	// alone (the old one, 1000 yields) failed a room's End under CI's load.
	spinTries = 64
	readWait  = time.Second
)

// Config shapes a table created by Open.
type Config struct {
	Name string
	// Slots is how many rooms can be in flight at once; 0 opens an
	// existing table only.
	Slots int
	// SlotBytes is a room's size, a power of two from 1 KiB to 1 MiB: each
	// side's records (aux data included) get about half of it.
	SlotBytes int
	// Key, when set, signs every area this handle writes and refuses every
	// area it reads that the key did not sign (sign.go): the tenant key of
	// the index whose pages the rooms hand over. Both sides of a room need
	// the same key.
	Key string
}

// Table is one process's handle on a table of rooms. Safe for concurrent
// use by the goroutines of one process.
type Table struct {
	c         *tier.Client
	r         *tier.Region
	name      string
	base      tier.Offset
	slots     int
	slotBytes int
	lock      int
	mac       *[32]byte  // the signing secret of a keyed table (sign.go); nil without a key
	mu        sync.Mutex // this process's writers of an area take turns
	// sim, in tests only, gives this handle a host's caches of its own
	// (tier.CacheSim over a one-device tier): nil outside them.
	sim *tier.CacheSim
}

// Room names a claimed room: its slot and the claim's generation. A
// handle whose generation is no longer the slot's reads ErrGone.
type Room struct {
	Slot int
	Gen  uint32
}

// DirName is the tier object of the table called name.
func DirName(name string) string { return "rooms/" + name }

// headerWait bounds how long Open waits for a table another process has
// named but not yet given its header: its creator writes the one line
// right after naming it, so a header missing that long is one its creator
// died before writing.
const headerWait = 2 * time.Second

// Open opens the table called cfg.Name, creating it with cfg's shape when
// it is missing and cfg.Slots > 0.
func Open(c *tier.Client, cfg Config) (*Table, error) {
	return open(c, cfg, headerWait)
}

func open(c *tier.Client, cfg Config, wait time.Duration) (*Table, error) {
	r := c.Region()
	o, err := r.OpenObject(DirName(cfg.Name))
	if errors.Is(err, tier.ErrNotFound) && cfg.Slots > 0 {
		o, err = create(c, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("rooms: open %q: %w", cfg.Name, err)
	}
	t := &Table{c: c, r: r, name: cfg.Name, base: o.Offset, mac: roomsMAC(cfg.Name, cfg.Key)}
	if err := t.awaitHeader(o.Size, wait); err != nil {
		return nil, err
	}
	t.lock = r.UserLockFor("rooms\x00" + cfg.Name)
	return t, nil
}

// awaitHeader reads the header, waiting up to wait while it is all zeros:
// a table is named (zero-filled) before its creator writes the header, so
// the ranks of one server opening it at once found it named and read that
// as damage.
func (t *Table) awaitHeader(size int64, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		err := t.readHeader(size)
		if !errors.Is(err, errUnwritten) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: table %q: header never written within %v (its creator died before writing it? "+
				"remove the table with the workers stopped)", ErrCorrupt, t.name, wait)
		}
		time.Sleep(time.Millisecond)
	}
}

// errUnwritten: the header line is all zeros, as the creator's object was
// before it wrote it.
var errUnwritten = errors.New("rooms: header not written yet")

func create(c *tier.Client, cfg Config) (tier.Object, error) {
	if cfg.SlotBytes < minSlotBytes || cfg.SlotBytes > maxSlotBytes || cfg.SlotBytes&(cfg.SlotBytes-1) != 0 {
		return tier.Object{}, fmt.Errorf("%w: slot bytes %d: want a power of two in [%d, %d]", ErrBadConfig, cfg.SlotBytes, minSlotBytes, maxSlotBytes)
	}
	if cfg.Slots > maxSlots {
		return tier.Object{}, fmt.Errorf("%w: %d slots: at most %d", ErrBadConfig, cfg.Slots, maxSlots)
	}
	size := int64(cfg.Slots+1) * int64(cfg.SlotBytes)
	o, err := c.CreateObject(DirName(cfg.Name), size, tier.ObjectOptions{})
	if errors.Is(err, tier.ErrExists) { // made by another process meanwhile
		return c.Region().OpenObject(DirName(cfg.Name))
	}
	if err != nil {
		return o, err
	}
	return o, writeHeader(c.Region(), o, cfg)
}

// writeHeader writes and publishes the header line of a table just
// created (named already, and zero-filled until this is done).
func writeHeader(r *tier.Region, o tier.Object, cfg Config) error {
	h := make([]byte, line)
	binary.LittleEndian.PutUint64(h[0:], magic)
	binary.LittleEndian.PutUint32(h[8:], version)
	binary.LittleEndian.PutUint32(h[12:], uint32(cfg.Slots))
	binary.LittleEndian.PutUint32(h[16:], uint32(cfg.SlotBytes))
	binary.LittleEndian.PutUint32(h[60:], crc32.Checksum(h[:60], castagnoli))
	if err := r.WriteAt(h, o.Offset); err != nil {
		return err
	}
	return r.Publish(o.Offset, line)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (t *Table) readHeader(size int64) error {
	h := make([]byte, line)
	if err := t.refresh(t.base, line); err != nil {
		return err
	}
	if err := t.r.ReadAt(h, t.base); err != nil {
		return err
	}
	if bytes.Count(h, []byte{0}) == len(h) {
		return errUnwritten
	}
	if binary.LittleEndian.Uint64(h) != magic || binary.LittleEndian.Uint32(h[8:]) != version ||
		binary.LittleEndian.Uint32(h[60:]) != crc32.Checksum(h[:60], castagnoli) {
		return fmt.Errorf("%w: table %q: header fails its magic, version or checksum", ErrCorrupt, t.name)
	}
	t.slots = int(binary.LittleEndian.Uint32(h[12:]))
	t.slotBytes = int(binary.LittleEndian.Uint32(h[16:]))
	if t.slots <= 0 || t.slots > maxSlots || t.slotBytes < minSlotBytes || t.slotBytes > maxSlotBytes ||
		t.slotBytes&(t.slotBytes-1) != 0 || int64(t.slots+1)*int64(t.slotBytes) > size {
		return fmt.Errorf("%w: table %q: header says %d slots of %d bytes in an object of %d", ErrCorrupt, t.name, t.slots, t.slotBytes, size)
	}
	return nil
}

// Slots is the table's capacity.
func (t *Table) Slots() int { return t.slots }

// AreaBytes is the most one side's records take, headers included.
func (t *Table) AreaBytes() int { return t.areaSize() - line }

func (t *Table) areaSize() int { return (t.slotBytes - line) / 2 &^ (line - 1) }

func (t *Table) slotOff(i int) tier.Offset { return t.base + tier.Offset((i+1)*t.slotBytes) }

func (t *Table) areaOff(i int, s Side) tier.Offset {
	return t.slotOff(i) + tier.Offset(line+int(s)*t.areaSize())
}

// mem is n bytes of the table at off, as this process maps them (a slot
// never crosses a chunk: slots are powers of two from a chunk's start).
// Under the cache simulator, this host's private view of them.
func (t *Table) mem(off tier.Offset, n int) ([]byte, error) {
	if t.sim != nil {
		_, at, run, err := t.r.Locate(off)
		if err != nil || run < int64(n) {
			return nil, fmt.Errorf("rooms: table %q: %d bytes at %#x: %w", t.name, n, off, tier.ErrOutOfBounds)
		}
		return t.sim.Private()[at : at+int64(n)], nil
	}
	b, err := t.r.Slice(off, int64(n))
	if err != nil {
		return nil, fmt.Errorf("rooms: table %q: %w", t.name, err)
	}
	return b, nil
}

// publish makes n bytes at off visible to the tier's other hosts.
func (t *Table) publish(off tier.Offset, n int64) error {
	return t.sync(off, n, (*tier.CacheSim).Publish, t.r.Publish)
}

// refresh drops this host's stale copies of n bytes at off.
func (t *Table) refresh(off tier.Offset, n int64) error {
	return t.sync(off, n, (*tier.CacheSim).Refresh, t.r.Refresh)
}

func (t *Table) sync(off tier.Offset, n int64, sim func(*tier.CacheSim, int64, int64), real func(tier.Offset, int64) error) error {
	if t.sim == nil {
		return real(off, n)
	}
	_, at, _, err := t.r.Locate(off)
	sim(t.sim, at, n)
	return err
}

func stateWord(b []byte) *uint64 { return words.U64At(b, 0) }
func readyWord(b []byte) *uint32 { return words.U32At(b, 20) }

func gen(state uint64) uint32 { return uint32(state >> 32) }

// identity is what line 0 of a claimed slot says.
type identity struct {
	state uint64
	room  uint64
	rank  uint32
	token uint64
}

// identityCRC covers room, rank and claimant token, not ready (written
// after it).
func identityCRC(b []byte) uint32 {
	return crc32.Update(crc32.Checksum(b[8:20], castagnoli), castagnoli, b[24:32])
}

// readIdentity reads slot i's line 0; ok is false for a free slot or one
// whose identity is not written yet.
func (t *Table) readIdentity(i int) (identity, bool, error) {
	off := t.slotOff(i)
	if err := t.refresh(off, line); err != nil {
		return identity{}, false, err
	}
	b, err := t.mem(off, line)
	if err != nil {
		return identity{}, false, err
	}
	id := identity{state: atomic.LoadUint64(stateWord(b))}
	if id.state&claimed == 0 || atomic.LoadUint32(readyWord(b)) != gen(id.state) {
		return id, false, nil
	}
	var l [line]byte
	copy(l[:], b)
	if atomic.LoadUint64(stateWord(b)) != id.state {
		return id, false, nil // claimed anew while read
	}
	if binary.LittleEndian.Uint32(l[60:]) != identityCRC(l[:]) {
		return id, false, fmt.Errorf("%w: table %q, slot %d: identity fails its checksum", ErrCorrupt, t.name, i)
	}
	id.room = binary.LittleEndian.Uint64(l[8:])
	id.rank = binary.LittleEndian.Uint32(l[16:])
	id.token = binary.LittleEndian.Uint64(l[24:])
	return id, true, nil
}

func (t *Table) home(room uint64, rank uint32) int {
	var k [12]byte
	binary.LittleEndian.PutUint64(k[:], room)
	binary.LittleEndian.PutUint32(k[8:], rank)
	h := fnv.New64a()
	h.Write(k[:])
	return int(h.Sum64() % uint64(t.slots))
}

// Find looks up the room of (room, rank) that a decode claimed; ok is
// false when there is none.
func (t *Table) Find(room uint64, rank uint32) (Room, bool, error) {
	if err := t.c.Err(); err != nil {
		return Room{}, false, err
	}
	start := t.home(room, rank)
	for k := 0; k < t.slots; k++ {
		i := (start + k) % t.slots
		id, ok, err := t.readIdentity(i)
		if err != nil {
			return Room{}, false, err
		}
		if ok && id.room == room && id.rank == rank {
			return Room{Slot: i, Gen: gen(id.state)}, true, nil
		}
		if id.state == 0 {
			return Room{}, false, nil // never claimed: no room was placed past it
		}
	}
	return Room{}, false, nil
}
