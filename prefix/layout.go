package prefix

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"time"
)

// LayoutVersion is the index layout Create writes (Stats.LayoutVersion
// names an open index's own; docs/abi.md lists the versions).
const LayoutVersion = indexVersion

// DirKind marks prefix indexes in the tier's root directory.
const DirKind = 0x50465831 // "PFX1"

const (
	indexMagic   = 0x3130584650544c43 // "CLTPFX01"
	indexVersion = 6                  // 2: tenant key digest; 3: per-client counters in the pin tables, shards; 4: owner lines per shard; 5: entry CRCs cover the key; 6: a keyed index signs its pages
	lineSize     = 64
	headerBytes  = 4096

	entryBytes    = 2 * lineSize
	pinHeaderSize = lineSize // the line evictors read: token and high-water mark
	pinRecordSize = 8

	maxEntries = 1 << 30
	maxBlocks  = 1 << 30
	maxShards  = 32
)

// Header field offsets. Line 0–1: geometry, written once and covered by the
// CRC at hdrCRC. Line 2: state changed only under the index lock. Line 3:
// counters any process adds to atomically.
const (
	hdrMagic         = 0
	hdrVersion       = 8
	hdrEntries       = 12
	hdrBlocks        = 16
	hdrPins          = 20
	hdrClients       = 24
	hdrLockID        = 28
	hdrBlockBytes    = 32
	hdrBlockStride   = 40
	hdrPayloadOff    = 48
	hdrPayloadChunks = 56
	hdrMetaChunks    = 64
	hdrCreated       = 72
	hdrEntriesOff    = 80
	hdrOwnersOff     = 88
	hdrPinsOff       = 96
	hdrPinStride     = 104
	hdrShards        = 112 // version 3; zero before (one shard)
	hdrCRC           = 124
	hdrImmutable     = 124

	hdrState  = 128 // shard 0's state line
	hdrShard1 = 320 // the state lines of shards 1, 2, … (version 3)

	hdrCounters = 192 // eight u64 counters, in counter order

	// Line 4: the digest of the tenant key (zero: no key), written once and
	// covered by the CRC at hdrCRC with lines 0–1.
	hdrKeyDigest = 256
	keyDigestLen = 32
)

// Fields of a shard's state line, changed only under the shard's lock.
// Shard 0's line is header line 2, where an index of one shard (every
// index before version 3) keeps its state.
const (
	slDirty      = 0  // u64 token of a holder mid-mutation (0: clean)
	slLRUHead    = 8  // u32 entry index+1 of the most recently used
	slLRUTail    = 12 // u32 entry index+1 of the least recently used
	slUsedBlocks = 16
	slReady      = 20
	slReserved   = 24
	slBlockHint  = 28 // u32 where the next block scan starts, within the shard
	slTombstones = 32
	slStrays     = 36 // u32 how many slStray words name a block (see pushStray)
	slStray      = 40 // strayWords × u32: blocks freed far from the scan hint
)

// strayWords is the room for strays in a state line (its bytes 40–63, zero
// and unread in indexes written before the list existed, which needs no
// new version: the list is a hint every reader checks against the owner
// table).
const strayWords = 6

// Counters in the header, in their order there.
const (
	ctrHits = iota
	ctrMisses
	ctrInserts
	ctrEvictions
	ctrChecksumFailures
	ctrReclaimed
	ctrBytesIn
	ctrBytesOut
	numCounters
)

// Entry field offsets. Line 0 is what lookups read; line 1 is touched only
// under the lock.
const (
	entWord     = 0  // gen<<8 | state
	entKey      = 8  // 32 bytes
	entLen      = 40 // u32 payload bytes
	entBlock    = 44 // u32 block index
	entCRC      = 48 // u32 CRC-32C of the payload
	entAccess   = 56 // u64: the link time (even), or ns of the first hit since (odd)
	entOwner    = 64 // u64 lease token of the reserving client
	entCreated  = 72 // u64 ns
	entPrev     = 80 // u32 entry index+1 toward the LRU head (0: none)
	entNext     = 84 // u32 entry index+1 toward the tail
	entLinkedAt = 88 // u64 ns when put at the LRU head
	entMAC      = 96 // [macBytes]: a keyed index's page signature (layout 6), see mac.go
)

// Entry states, the low byte of the state word.
const (
	stEmpty    = 0
	stReserved = 1
	stReady    = 2
	stDeleted  = 3 // tombstone: probes continue past it
	stEvicting = 4 // an evictor is checking pins
)

func mkWord(gen uint64, st uint8) uint64 { return gen<<8 | uint64(st) }
func wordState(w uint64) uint8           { return uint8(w) }
func wordGen(w uint64) uint64            { return w >> 8 }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// geometry is an index's immutable layout, as stored in its header.
type geometry struct {
	Entries       int64
	Blocks        int64
	Pins          int64 // records per client
	Clients       int64
	LockID        int
	BlockBytes    int64
	BlockStride   int64
	PayloadOff    int64 // tier offset of the payload run
	PayloadChunks int64
	MetaChunks    int64
	Created       time.Time
	EntriesOff    int64 // offsets inside the metadata run
	OwnersOff     int64
	PinsOff       int64
	PinStride     int64
	Shards        int64              // a power of two; entries and blocks are split evenly among them
	KeyDigest     [keyDigestLen]byte // zero: the index has no key
	Version       uint32             // layout version of the header read (encode writes indexVersion)
}

// headerCRC covers the immutable fields: lines 0–1 up to the CRC word and
// the key digest.
func headerCRC(b []byte) uint32 {
	return crc32.Update(crc32.Checksum(b[:hdrImmutable], castagnoli), castagnoli, b[hdrKeyDigest:hdrKeyDigest+keyDigestLen])
}

func alignUp(v, a int64) int64 { return (v + a - 1) / a * a }

// pinHeader is the bytes before a pin table's records: one line, and from
// version 3 a second for the holder's counters, which it writes on every
// call while evictors read the first.
func (g *geometry) pinHeader() int64 {
	if g.Version != 0 && g.Version < 3 {
		return pinHeaderSize
	}
	return 2 * lineSize
}

// ownerStride is the bytes between the owner tables of two shards. From
// version 4 each shard's owner words start a line of their own: on a tier
// without coherence two hosts holding the locks of neighbouring shards must
// never write one line, whose write-backs would undo each other. Before,
// the table is one run of words.
func (g *geometry) ownerStride() int64 {
	if g.Version != 0 && g.Version < 4 {
		return 0
	}
	shards := max(g.Shards, 1)               // place may run before check
	most := (g.Blocks + shards - 1) / shards // the largest shard's blocks
	return alignUp(4*most, lineSize)
}

// crcSeed is where the checksum of key k's payload starts. From version 5
// it is the CRC-32C of the key, so an entry's CRC covers its key and its
// payload: an entry whose length, block and CRC words were copied from
// another key's entry (a stray or damaged write of 12 bytes) fails its
// check instead of serving that key's payload. Before, 0: the payload
// alone.
func (g *geometry) crcSeed(k *Key) uint32 {
	if g.Version != 0 && g.Version < 5 {
		return 0
	}
	return crc32.Checksum(k[:], castagnoli)
}

// ownersBytes is the size of the owner table.
func (g *geometry) ownersBytes() int64 {
	if stride := g.ownerStride(); stride > 0 {
		return max(g.Shards, 1) * stride
	}
	return 4 * g.Blocks
}

// place lays out the metadata run for the counts in g and returns its size.
func (g *geometry) place() int64 {
	g.EntriesOff = headerBytes
	g.OwnersOff = alignUp(g.EntriesOff+g.Entries*entryBytes, lineSize)
	g.PinsOff = alignUp(g.OwnersOff+g.ownersBytes(), lineSize)
	g.PinStride = alignUp(g.pinHeader()+g.Pins*pinRecordSize, lineSize)
	return g.PinsOff + g.Clients*g.PinStride
}

func (g *geometry) encode(b []byte) {
	le := binary.LittleEndian
	v := g.Version
	if v == 0 {
		v = indexVersion
	}
	le.PutUint64(b[hdrMagic:], indexMagic)
	le.PutUint32(b[hdrVersion:], v)
	le.PutUint32(b[hdrEntries:], uint32(g.Entries))
	le.PutUint32(b[hdrBlocks:], uint32(g.Blocks))
	le.PutUint32(b[hdrPins:], uint32(g.Pins))
	le.PutUint32(b[hdrClients:], uint32(g.Clients))
	le.PutUint32(b[hdrLockID:], uint32(g.LockID))
	le.PutUint64(b[hdrBlockBytes:], uint64(g.BlockBytes))
	le.PutUint64(b[hdrBlockStride:], uint64(g.BlockStride))
	le.PutUint64(b[hdrPayloadOff:], uint64(g.PayloadOff))
	le.PutUint64(b[hdrPayloadChunks:], uint64(g.PayloadChunks))
	le.PutUint64(b[hdrMetaChunks:], uint64(g.MetaChunks))
	le.PutUint64(b[hdrCreated:], uint64(g.Created.UnixNano()))
	le.PutUint64(b[hdrEntriesOff:], uint64(g.EntriesOff))
	le.PutUint64(b[hdrOwnersOff:], uint64(g.OwnersOff))
	le.PutUint64(b[hdrPinsOff:], uint64(g.PinsOff))
	le.PutUint64(b[hdrPinStride:], uint64(g.PinStride))
	if v >= 3 {
		le.PutUint32(b[hdrShards:], uint32(g.Shards))
	}
	copy(b[hdrKeyDigest:], g.KeyDigest[:])
	le.PutUint32(b[hdrCRC:], headerCRC(b))
	if v == 1 {
		le.PutUint32(b[hdrCRC:], crc32.Checksum(b[:hdrImmutable], castagnoli))
	}
}

// decodeGeometry reads and checks an index header: magic, version, CRC,
// and that the derived layout matches what the counts imply and fits in
// metaBytes of metadata. It never trusts a field before checking it, since
// the header crosses a process boundary.
func decodeGeometry(b []byte, metaBytes int64) (geometry, error) {
	le := binary.LittleEndian
	var g geometry
	if len(b) < headerBytes {
		return g, fmt.Errorf("%w: header of %d bytes", ErrBadIndex, len(b))
	}
	if m := le.Uint64(b[hdrMagic:]); m != indexMagic {
		return g, fmt.Errorf("%w: magic %#x", ErrBadIndex, m)
	}
	v := le.Uint32(b[hdrVersion:])
	want := headerCRC(b)
	switch v {
	case 1: // before tenant keys: no digest, and the CRC covers lines 0–1 only
		want = crc32.Checksum(b[:hdrImmutable], castagnoli)
	case 2, 3, 4, 5, indexVersion: // 3 adds per-client counters to the pin tables' headers, 4 a line-aligned owner table per shard, 5 key-covering entry CRCs, 6 signed pages in keyed indexes
	default:
		return g, fmt.Errorf("%w: version %d, this build reads 1 to %d", ErrBadIndex, v, indexVersion)
	}
	if got := le.Uint32(b[hdrCRC:]); want != got {
		return g, fmt.Errorf("%w: header CRC %#x, computed %#x", ErrBadIndex, got, want)
	}
	g = geometry{
		Entries: int64(le.Uint32(b[hdrEntries:])), Blocks: int64(le.Uint32(b[hdrBlocks:])),
		Pins: int64(le.Uint32(b[hdrPins:])), Clients: int64(le.Uint32(b[hdrClients:])),
		LockID: int(le.Uint32(b[hdrLockID:])), BlockBytes: int64(le.Uint64(b[hdrBlockBytes:])),
		BlockStride: int64(le.Uint64(b[hdrBlockStride:])), PayloadOff: int64(le.Uint64(b[hdrPayloadOff:])),
		PayloadChunks: int64(le.Uint64(b[hdrPayloadChunks:])), MetaChunks: int64(le.Uint64(b[hdrMetaChunks:])),
		Created: time.Unix(0, int64(le.Uint64(b[hdrCreated:]))), Version: v, Shards: 1,
	}
	if v >= 3 {
		g.Shards = int64(le.Uint32(b[hdrShards:]))
	}
	if v >= 2 {
		copy(g.KeyDigest[:], b[hdrKeyDigest:])
	}
	if err := g.check(); err != nil {
		return g, err
	}
	lay := g
	size := lay.place()
	got := [4]int64{int64(le.Uint64(b[hdrEntriesOff:])), int64(le.Uint64(b[hdrOwnersOff:])),
		int64(le.Uint64(b[hdrPinsOff:])), int64(le.Uint64(b[hdrPinStride:]))}
	if got != [4]int64{lay.EntriesOff, lay.OwnersOff, lay.PinsOff, lay.PinStride} {
		return g, fmt.Errorf("%w: area offsets %v do not match the counts (%d entries, %d blocks, %d pins × %d clients)",
			ErrBadIndex, got, g.Entries, g.Blocks, g.Pins, g.Clients)
	}
	if size > metaBytes {
		return g, fmt.Errorf("%w: layout needs %d bytes, metadata run has %d", ErrBadIndex, size, metaBytes)
	}
	return lay, nil
}

// check validates the counts of a geometry, from a caller or from a header.
func (g *geometry) check() error {
	switch {
	case g.Entries < 2 || g.Entries > maxEntries || g.Entries&(g.Entries-1) != 0:
		return fmt.Errorf("%w: %d entries (want a power of two in [2, %d])", ErrBadConfig, g.Entries, maxEntries)
	case g.Blocks < 1 || g.Blocks > maxBlocks:
		return fmt.Errorf("%w: %d blocks (want 1 to %d)", ErrBadConfig, g.Blocks, maxBlocks)
	case g.Blocks > g.Entries:
		return fmt.Errorf("%w: %d blocks exceed %d entries", ErrBadConfig, g.Blocks, g.Entries)
	case g.Pins < 1 || g.Pins > 1<<24:
		return fmt.Errorf("%w: %d pins per client (want 1 to %d)", ErrBadConfig, g.Pins, 1<<24)
	case g.Clients < 1 || g.Clients > 1<<20:
		return fmt.Errorf("%w: %d client slots", ErrBadConfig, g.Clients)
	case g.BlockBytes < 1 || g.BlockBytes > 1<<40:
		return fmt.Errorf("%w: block of %d bytes", ErrBadConfig, g.BlockBytes)
	case g.BlockStride < g.BlockBytes || g.BlockStride%lineSize != 0:
		return fmt.Errorf("%w: block stride %d for %d-byte blocks", ErrBadConfig, g.BlockStride, g.BlockBytes)
	case g.LockID < 0:
		return fmt.Errorf("%w: lock %d", ErrBadConfig, g.LockID)
	case g.Shards < 1 || g.Shards > maxShards || g.Shards&(g.Shards-1) != 0 || g.Shards > g.Blocks || g.Entries/g.Shards < 2:
		return fmt.Errorf("%w: %d shards (want a power of two in [1, %d], at most the %d blocks, two entries each)",
			ErrBadConfig, g.Shards, maxShards, g.Blocks)
	}
	return nil
}
