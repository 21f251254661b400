package tier

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"time"
)

// Format constants. The header is encoded field by field (never by casting a
// struct), so the on-media layout is independent of the Go compiler.
const (
	FormatVersion = 1
	LineSize      = 64   // cache line: the unit of flushes and of single-writer ownership
	headerPage    = 4096 // the header occupies the first page of every device
	headerLen     = 256  // encoded bytes of the header; the rest of the page is zero
	areaHeaderLen = LineSize

	leaseSlotLen = LineSize
	dirEntryLen  = 2 * LineSize
	dirNameMax   = 64
	ownerLen     = 4

	maxDevices = 64
	maxNodes   = 64
	maxClients = 4096 // per node
	maxLocks   = 4096
	maxDir     = 65536
)

var magic = [8]byte{'C', 'X', 'L', 'T', 'I', 'E', 'R', 0}

// Area magics, one per fixed area, checked on open.
const (
	leaseMagic  = 0x5345414c // "LEAS"
	lockMagic   = 0x4b434f4c // "LOCK"
	dirMagic    = 0x45524944 // "DIRE"
	bitmapMagic = 0x4d544942 // "BITM"
	ownerMagic  = 0x524e574f // "OWNR"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Geometry is what a tier is formatted with. Every other layout number is
// derived from it by computeLayout, so validation recomputes and compares.
type Geometry struct {
	DeviceSize     int64         // usable bytes of each device (all devices alike)
	Devices        int           // number of backings
	Stripe         int64         // bytes placed on one device before moving to the next
	ChunkSize      int64         // unit of the global allocator; divides Stripe
	Nodes          int           // hosts sharing the tier; node ids are 0..Nodes-1
	ClientsPerNode int           // lease slots per node
	LockSlots      int           // global locks
	DirEntries     int           // root directory capacity
	LeaseTimeout   time.Duration // a client silent this long is dead
}

// DefaultGeometry is the embedded default: one 256 MiB device, one node.
func DefaultGeometry() Geometry {
	return Geometry{
		DeviceSize:     256 << 20,
		Devices:        1,
		Stripe:         2 << 20,
		ChunkSize:      1 << 20,
		Nodes:          1,
		ClientsPerNode: 64,
		LockSlots:      64,
		DirEntries:     256,
		LeaseTimeout:   5 * time.Second,
	}
}

// layout is the geometry plus every derived offset, as stored in the header.
type layout struct {
	Geometry
	Version     uint32
	Flags       uint32
	DeviceIndex int
	ChunkCount  int64
	ControlSize int64 // bytes of control area at the start of every device; data follows
	Created     time.Time
	UUID        [16]byte

	LeaseOff, LockOff, DirOff, BitmapOff, OwnerOff int64
}

// Header flags.
const flagShared = 1 << 0 // formatted for non-coherent sharing (a default, not a lock-in)

func isPow2(v int64) bool { return v > 0 && v&(v-1) == 0 }

func alignUp(v, a int64) int64 { return (v + a - 1) / a * a }

// lockSlotLen is the bytes of one lock: per node, one line for the global
// state word (node ↔ manager handshake) and one for the node-local holder.
func lockSlotLen(nodes int) int64 { return int64(nodes) * 2 * LineSize }

func (g Geometry) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("tier: geometry: %s: %w", fmt.Sprintf(format, a...), ErrInvalidConfig)
	}
	switch {
	case g.Devices < 1 || g.Devices > maxDevices:
		return bad("devices %d not in [1,%d]", g.Devices, maxDevices)
	case g.Nodes < 1 || g.Nodes > maxNodes:
		return bad("nodes %d not in [1,%d]", g.Nodes, maxNodes)
	case g.ClientsPerNode < 1 || g.ClientsPerNode > maxClients:
		return bad("clients per node %d not in [1,%d]", g.ClientsPerNode, maxClients)
	case g.LockSlots < 1 || g.LockSlots > maxLocks:
		return bad("lock slots %d not in [1,%d]", g.LockSlots, maxLocks)
	case g.DirEntries < 1 || g.DirEntries > maxDir:
		return bad("directory entries %d not in [1,%d]", g.DirEntries, maxDir)
	case !isPow2(g.ChunkSize) || g.ChunkSize < headerPage:
		return bad("chunk size %d must be a power of two ≥ %d", g.ChunkSize, headerPage)
	case !isPow2(g.Stripe) || g.Stripe < g.ChunkSize || g.Stripe > 1<<40:
		return bad("stripe %d must be a power of two, ≥ chunk size %d and ≤ 1 TiB", g.Stripe, g.ChunkSize)
	case g.DeviceSize <= 0 || g.DeviceSize > 1<<50:
		return bad("device size %d not in (0, 1 PiB]", g.DeviceSize)
	case g.LeaseTimeout < 10*time.Millisecond || g.LeaseTimeout > time.Hour:
		return bad("lease timeout %v not in [10ms, 1h]", g.LeaseTimeout)
	}
	return nil
}

// CheckGeometry reports whether Format would accept g (the same checks,
// nothing touched): for tools that validate a configuration before they
// start. The error wraps ErrInvalidConfig and names the bad field.
func CheckGeometry(g Geometry) error {
	_, err := computeLayout(g)
	return err
}

// computeLayout derives the areas from a geometry. The control area is sized
// for the largest chunk count the device size allows, then rounded to a
// stripe, so every device's data starts at the same stripe-aligned offset.
func computeLayout(g Geometry) (layout, error) {
	if err := g.check(); err != nil {
		return layout{}, err
	}
	l := layout{Geometry: g, Version: FormatVersion}
	maxChunks := int64(g.Devices) * (g.DeviceSize / g.ChunkSize)
	off := int64(headerPage)
	area := func(count, elem int64) int64 {
		start := off
		off = alignUp(off+areaHeaderLen+count*elem, LineSize)
		return start
	}
	l.LeaseOff = area(int64(g.Nodes*g.ClientsPerNode), leaseSlotLen)
	l.LockOff = area(int64(g.LockSlots), lockSlotLen(g.Nodes))
	l.DirOff = area(int64(g.DirEntries), dirEntryLen)
	l.BitmapOff = area((maxChunks+63)/64, 8)
	l.OwnerOff = area(maxChunks, ownerLen)
	l.ControlSize = alignUp(off, g.Stripe)
	if l.ControlSize >= g.DeviceSize {
		return layout{}, fmt.Errorf("tier: device size %d leaves no data after the %d-byte control area: %w",
			g.DeviceSize, l.ControlSize, ErrTooSmall)
	}
	perDevice := (g.DeviceSize - l.ControlSize) / g.Stripe * g.Stripe
	if perDevice == 0 {
		return layout{}, fmt.Errorf("tier: device size %d holds no full %d-byte stripe after the control area: %w",
			g.DeviceSize, g.Stripe, ErrTooSmall)
	}
	l.ChunkCount = int64(g.Devices) * perDevice / g.ChunkSize
	return l, nil
}

// dataPerDevice is the striped data bytes each device holds.
func (l *layout) dataPerDevice() int64 { return l.ChunkCount * l.ChunkSize / int64(l.Devices) }

// size is the logical size of the region: control area plus all data.
func (l *layout) size() int64 { return l.ControlSize + l.ChunkCount*l.ChunkSize }

func (l *layout) encode() []byte {
	b := make([]byte, headerLen)
	le := binary.LittleEndian
	copy(b[0:8], magic[:])
	le.PutUint32(b[8:], l.Version)
	le.PutUint32(b[12:], headerLen)
	le.PutUint32(b[16:], l.Flags)
	le.PutUint32(b[20:], uint32(l.DeviceIndex))
	le.PutUint32(b[24:], uint32(l.Devices))
	le.PutUint32(b[28:], uint32(l.Nodes))
	le.PutUint64(b[32:], uint64(l.DeviceSize))
	le.PutUint64(b[40:], uint64(l.Stripe))
	le.PutUint64(b[48:], uint64(l.ChunkSize))
	le.PutUint64(b[56:], uint64(l.ChunkCount))
	le.PutUint64(b[64:], uint64(l.ControlSize))
	le.PutUint32(b[72:], uint32(l.ClientsPerNode))
	le.PutUint32(b[76:], uint32(l.LockSlots))
	le.PutUint32(b[80:], uint32(l.DirEntries))
	le.PutUint32(b[84:], uint32(l.LeaseTimeout/time.Millisecond))
	le.PutUint64(b[88:], uint64(l.Created.UnixNano()))
	copy(b[96:112], l.UUID[:])
	le.PutUint64(b[112:], uint64(l.LeaseOff))
	le.PutUint64(b[120:], uint64(l.LockOff))
	le.PutUint64(b[128:], uint64(l.DirOff))
	le.PutUint64(b[136:], uint64(l.BitmapOff))
	le.PutUint64(b[144:], uint64(l.OwnerOff))
	le.PutUint32(b[headerLen-4:], crcOf(b[:headerLen-4]))
	return b
}

// decodeHeader parses and validates a header. It refuses, in this order, a
// short buffer, a wrong magic, an unknown version, a bad checksum and a
// geometry whose derived layout disagrees with the stored one.
func decodeHeader(b []byte) (layout, error) {
	if len(b) < headerLen {
		return layout{}, fmt.Errorf("tier: header needs %d bytes, have %d: %w", headerLen, len(b), ErrTruncated)
	}
	if [8]byte(b[0:8]) != magic {
		return layout{}, fmt.Errorf("tier: magic %q: %w", b[0:8], ErrBadMagic)
	}
	le := binary.LittleEndian
	var l layout
	l.Version = le.Uint32(b[8:])
	if l.Version != FormatVersion {
		return layout{}, fmt.Errorf("tier: format version %d, this build reads %d: %w", l.Version, FormatVersion, ErrVersion)
	}
	if n := le.Uint32(b[12:]); n != headerLen {
		return layout{}, fmt.Errorf("tier: header length %d, want %d: %w", n, headerLen, ErrCorrupt)
	}
	if got, want := le.Uint32(b[headerLen-4:]), crcOf(b[:headerLen-4]); got != want {
		return layout{}, fmt.Errorf("tier: header checksum %#08x, computed %#08x: %w", got, want, ErrChecksum)
	}
	l.Flags = le.Uint32(b[16:])
	l.DeviceIndex = int(le.Uint32(b[20:]))
	l.Geometry = Geometry{
		Devices:        int(le.Uint32(b[24:])),
		Nodes:          int(le.Uint32(b[28:])),
		DeviceSize:     int64(le.Uint64(b[32:])),
		Stripe:         int64(le.Uint64(b[40:])),
		ChunkSize:      int64(le.Uint64(b[48:])),
		ClientsPerNode: int(le.Uint32(b[72:])),
		LockSlots:      int(le.Uint32(b[76:])),
		DirEntries:     int(le.Uint32(b[80:])),
		LeaseTimeout:   time.Duration(le.Uint32(b[84:])) * time.Millisecond,
	}
	l.ChunkCount = int64(le.Uint64(b[56:]))
	l.ControlSize = int64(le.Uint64(b[64:]))
	l.Created = time.Unix(0, int64(le.Uint64(b[88:])))
	copy(l.UUID[:], b[96:112])
	l.LeaseOff = int64(le.Uint64(b[112:]))
	l.LockOff = int64(le.Uint64(b[120:]))
	l.DirOff = int64(le.Uint64(b[128:]))
	l.BitmapOff = int64(le.Uint64(b[136:]))
	l.OwnerOff = int64(le.Uint64(b[144:]))
	if err := l.checkDerived(); err != nil {
		return layout{}, err
	}
	return l, nil
}

// checkDerived recomputes the layout from the stored geometry and compares.
// A header that passed its checksum but disagrees was written by a buggy or
// hostile writer; refusing it keeps every later offset computation in bounds.
func (l *layout) checkDerived() error {
	want, err := computeLayout(l.Geometry)
	if err != nil {
		return fmt.Errorf("tier: stored geometry: %w: %w", ErrCorrupt, err)
	}
	if l.DeviceIndex < 0 || l.DeviceIndex >= l.Devices {
		return fmt.Errorf("tier: device index %d of %d: %w", l.DeviceIndex, l.Devices, ErrCorrupt)
	}
	type pair struct {
		name      string
		got, want int64
	}
	for _, p := range []pair{
		{"chunk count", l.ChunkCount, want.ChunkCount},
		{"control size", l.ControlSize, want.ControlSize},
		{"lease offset", l.LeaseOff, want.LeaseOff},
		{"lock offset", l.LockOff, want.LockOff},
		{"directory offset", l.DirOff, want.DirOff},
		{"bitmap offset", l.BitmapOff, want.BitmapOff},
		{"owner offset", l.OwnerOff, want.OwnerOff},
	} {
		if p.got != p.want {
			return fmt.Errorf("tier: %s %d, geometry implies %d: %w", p.name, p.got, p.want, ErrCorrupt)
		}
	}
	return nil
}

func crcOf(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }
