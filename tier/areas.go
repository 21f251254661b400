package tier

import (
	"encoding/binary"
	"fmt"
)

// Every fixed area starts with one line: magic, version, element count and
// element size. Open checks them so a region written by a different build or
// damaged in place is refused before any structure in it is trusted.

type areaSpec struct {
	name  string
	magic uint32
	off   int64
	count int64
	elem  int64
}

func (l *layout) areas() []areaSpec {
	return []areaSpec{
		{"lease table", leaseMagic, l.LeaseOff, int64(l.Nodes * l.ClientsPerNode), leaseSlotLen},
		{"lock area", lockMagic, l.LockOff, int64(l.LockSlots), lockSlotLen(l.Nodes)},
		{"root directory", dirMagic, l.DirOff, int64(l.DirEntries), dirEntryLen},
		{"chunk bitmap", bitmapMagic, l.BitmapOff, (l.ChunkCount + 63) / 64, 8},
		{"chunk owners", ownerMagic, l.OwnerOff, l.ChunkCount, ownerLen},
	}
}

func (r *Region) writeAreaHeaders() {
	le := binary.LittleEndian
	for _, a := range r.l.areas() {
		h := r.ctl[a.off : a.off+areaHeaderLen]
		le.PutUint32(h[0:], a.magic)
		le.PutUint32(h[4:], FormatVersion)
		le.PutUint32(h[8:], uint32(a.count))
		le.PutUint32(h[12:], uint32(a.elem))
		r.sync.publish(h)
	}
}

// checkAreas validates the area headers of a control area. ctl must hold at
// least the control area; l must come from decodeHeader. Directory entries
// are not its business: every reader decodes and checks each entry it
// reads, a damaged one is passed over and reported by Audit, and one bad
// byte in one entry must not make the tier unopenable for inspect and
// repair.
func checkAreas(ctl []byte, l *layout) error {
	if int64(len(ctl)) < l.ControlSize {
		return fmt.Errorf("tier: control area needs %d bytes, have %d: %w", l.ControlSize, len(ctl), ErrTruncated)
	}
	le := binary.LittleEndian
	for _, a := range l.areas() {
		h := ctl[a.off : a.off+areaHeaderLen]
		switch {
		case le.Uint32(h[0:]) != a.magic:
			return fmt.Errorf("tier: %s at %#x: magic %#08x, want %#08x: %w", a.name, a.off, le.Uint32(h[0:]), a.magic, ErrCorrupt)
		case le.Uint32(h[4:]) != FormatVersion:
			return fmt.Errorf("tier: %s: version %d: %w", a.name, le.Uint32(h[4:]), ErrVersion)
		case int64(le.Uint32(h[8:])) != a.count || int64(le.Uint32(h[12:])) != a.elem:
			return fmt.Errorf("tier: %s: %d×%d B, header implies %d×%d B: %w",
				a.name, le.Uint32(h[8:]), le.Uint32(h[12:]), a.count, a.elem, ErrCorrupt)
		}
	}
	return nil
}

// parseControl validates a whole control area given as bytes: the header,
// the areas and the directory. It is what Open trusts, and what fuzzing drives.
func parseControl(b []byte) (layout, error) {
	l, err := decodeHeader(b)
	if err != nil {
		return layout{}, err
	}
	if err := checkAreas(b, &l); err != nil {
		return layout{}, err
	}
	return l, nil
}

// Control-area addressing. Offsets come from a validated layout, so slicing
// cannot leave the control area; u32At/u64At check alignment.

func (r *Region) leaseLine(slot int) []byte {
	off := r.l.LeaseOff + areaHeaderLen + int64(slot)*leaseSlotLen
	return r.ctl[off : off+leaseSlotLen]
}

// lockLines returns node's two lines of lock id: the global state line
// (written by the node, and by the manager to grant) and the node-local
// holder line (written only by that node's processes and daemon).
func (r *Region) lockLines(id, node int) (global, local []byte) {
	base := r.l.LockOff + areaHeaderLen + int64(id)*lockSlotLen(r.l.Nodes) + int64(node)*2*LineSize
	return r.ctl[base : base+LineSize], r.ctl[base+LineSize : base+2*LineSize]
}

func (r *Region) dirLine(i int) []byte {
	off := r.l.DirOff + areaHeaderLen + int64(i)*dirEntryLen
	return r.ctl[off : off+dirEntryLen]
}

func (r *Region) bitmapWord(i int64) *uint64 {
	return u64At(r.ctl, r.l.BitmapOff+areaHeaderLen+i*8)
}

func (r *Region) ownerWord(chunk int64) *uint32 {
	return u32At(r.ctl, r.l.OwnerOff+areaHeaderLen+chunk*ownerLen)
}

func (r *Region) bitmapBytes(fromWord, toWord int64) []byte {
	return r.ctl[r.l.BitmapOff+areaHeaderLen+fromWord*8 : r.l.BitmapOff+areaHeaderLen+toWord*8]
}

func (r *Region) ownerBytes(from, to int64) []byte {
	return r.ctl[r.l.OwnerOff+areaHeaderLen+from*ownerLen : r.l.OwnerOff+areaHeaderLen+to*ownerLen]
}
