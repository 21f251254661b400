package rooms

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/cxltier/cxltier/internal/errkind"
)

// A table opened with a key (Config.Key: the tenant key of the prefill and
// decode's index) signs its rooms' records. The area checksum tells damage
// from a good write, but a process that maps the tier without the key
// could write records of its own with a valid checksum: an accept naming
// other pages, a first token of its choosing in the aux data. Each area
// then carries an HMAC-SHA256, cut to 128 bits, of the room's identity
// (room, rank), the claim's generation, the side and the records, under a
// secret derived from the key and the table's name; a reader with the key
// refuses an area without a valid one (ErrUnsigned), so a signed area moved
// to another room, side or claim is refused too. A table without a key
// trusts every writer of the tier, as an index without one does.

// ErrUnsigned: an area's records are not signed with the table's key.
var ErrUnsigned = errkind.New(errkind.Checksum, "rooms: records not signed with the table's key")

const (
	areaMAC  = 32 // [macBytes] in the area header, zero in tables without a key
	macBytes = 16
)

// roomsMAC is the secret of table name opened with key; nil without one.
func roomsMAC(name, key string) *[sha256.Size]byte {
	if key == "" {
		return nil
	}
	k := sha256.Sum256([]byte("cxltier rooms signature\x00" + name + "\x00" + key))
	return &k
}

// areaSignature is the signature of side's records in the room of id
// under claim generation gen. The slot is not covered: a slot whose
// identity and records are copied whole into another is the same room's.
func (t *Table) areaSignature(id identity, gen uint32, side Side, records []byte) (out [macBytes]byte) {
	m := hmac.New(sha256.New, t.mac[:])
	var hdr [17]byte
	binary.LittleEndian.PutUint64(hdr[0:], id.room)
	binary.LittleEndian.PutUint32(hdr[8:], id.rank)
	binary.LittleEndian.PutUint32(hdr[12:], gen)
	hdr[16] = byte(side)
	m.Write(hdr[:])
	m.Write(records)
	copy(out[:], m.Sum(nil))
	return out
}

// signatureFor is, in a keyed table, the signature of side's records of
// rm (nil without a key): taken before the area is opened for writing, so
// that a failure leaves the area as it was.
func (t *Table) signatureFor(rm Room, side Side, records []byte) ([]byte, error) {
	if t.mac == nil {
		return nil, nil
	}
	id, err := t.identityOf(rm)
	if err != nil {
		return nil, err
	}
	sig := t.areaSignature(id, rm.Gen, side, records)
	return sig[:], nil
}

// checkSigned checks, in a keyed table, the signature of an area of rm as
// read (its header line, then its records).
func (t *Table) checkSigned(rm Room, side Side, hdr, records []byte) error {
	if t.mac == nil {
		return nil
	}
	id, err := t.identityOf(rm)
	if err != nil {
		return err
	}
	want := t.areaSignature(id, rm.Gen, side, records)
	if !hmac.Equal(want[:], hdr[areaMAC:areaMAC+macBytes]) {
		return fmt.Errorf("%w: table %q, slot %d: the %s side's records (written by a process without the key, or damaged)", ErrUnsigned, t.name, rm.Slot, side)
	}
	return nil
}

// identityOf is the identity of rm's slot while it is rm's claim.
func (t *Table) identityOf(rm Room) (identity, error) {
	id, ok, err := t.readIdentity(rm.Slot)
	if err != nil {
		return id, err
	}
	if !ok || gen(id.state) != rm.Gen {
		return id, fmt.Errorf("%w: table %q, slot %d", ErrGone, t.name, rm.Slot)
	}
	return id, nil
}
