// Package cluster is a node tier's side of its uplink: the one process on a
// node that joins the tier to a cluster store (Mooncake Store), written in
// Python because Mooncake's client is (python/cxltier/cluster/uplink.py). Every
// process that opens a prefix index on the tier finds the uplink through
// the tier itself (a socket named after the tier's UUID and the node, in
// the directory of the tier's sockets), asks it to fill local misses from the cluster, and tells it which
// pages it stored so that it writes them behind. Without an uplink, or with
// one that is dead, stalled or slow, every call here gives up at once or
// within its deadline: a miss stays a local miss, never an error.
//
// This package owns the wire format between the two (wire.go) and the
// client (link.go); placement, replication and membership are the cluster
// store's, never cxltier's.
package cluster

import (
	"encoding/binary"
	"fmt"

	"github.com/cxltier/cxltier/internal/errkind"
	"github.com/cxltier/cxltier/prefix"
)

// Op is what a message asks of the uplink.
type Op uint8

const (
	// OpFill asks the uplink to bring keys into the local index from the
	// cluster, in order, stopping at the first the cluster lacks; it
	// answers with a Reply once it is done.
	OpFill Op = 1
	// OpStored tells the uplink that keys were stored in the local index,
	// to be written behind to the cluster. It has no reply.
	OpStored Op = 2
)

// Limits of one message: an index name is a directory name, and a
// message must fit a socket's send buffer whole.
const (
	MaxName      = 64
	MaxFillKeys  = 2048
	MaxNoticeKey = 1024
	headerBytes  = 12
	keyBytes     = len(prefix.Key{})
	replyBytes   = 12
)

var (
	requestMagic = [4]byte{'C', 'X', 'U', '1'}
	replyMagic   = [4]byte{'C', 'X', 'R', '1'}
)

// ErrBadMessage is what a malformed message parses to.
var ErrBadMessage = errkind.New(errkind.Invalid, "malformed uplink message")

// Request is one message to the uplink.
type Request struct {
	Op    Op
	Index string // the prefix index's name on this tier
	Keys  []prefix.Key
}

// AppendBinary appends r's wire form to b: the magic, op, a reserved
// byte, the name's length (u16), the key count (u32), the name, the keys.
func (r *Request) AppendBinary(b []byte) ([]byte, error) {
	if err := r.check(); err != nil {
		return b, err
	}
	b = append(b, requestMagic[:]...)
	b = append(b, byte(r.Op), 0)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(r.Index)))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(r.Keys)))
	b = append(b, r.Index...)
	for i := range r.Keys {
		b = append(b, r.Keys[i][:]...)
	}
	return b, nil
}

func (r *Request) check() error {
	limit := MaxFillKeys
	switch r.Op {
	case OpFill:
	case OpStored:
		limit = MaxNoticeKey
	default:
		return fmt.Errorf("cluster: %w: op %d", ErrBadMessage, r.Op)
	}
	if r.Index == "" || len(r.Index) > MaxName {
		return fmt.Errorf("cluster: %w: index name of %d bytes (1 to %d)", ErrBadMessage, len(r.Index), MaxName)
	}
	if len(r.Keys) == 0 || len(r.Keys) > limit {
		return fmt.Errorf("cluster: %w: %d keys (1 to %d)", ErrBadMessage, len(r.Keys), limit)
	}
	return nil
}

// ParseRequest reads one message, which must be exactly one request.
func ParseRequest(b []byte) (Request, error) {
	if len(b) < headerBytes || [4]byte(b[:4]) != requestMagic {
		return Request{}, fmt.Errorf("cluster: %w: %d bytes without the request magic", ErrBadMessage, len(b))
	}
	r := Request{Op: Op(b[4])}
	nameLen := int(binary.LittleEndian.Uint16(b[6:]))
	nKeys := int64(binary.LittleEndian.Uint32(b[8:]))
	if want := int64(headerBytes) + int64(nameLen) + nKeys*int64(keyBytes); int64(len(b)) != want {
		return Request{}, fmt.Errorf("cluster: %w: %d bytes for a %d-byte name and %d keys (%d bytes)", ErrBadMessage, len(b), nameLen, nKeys, want)
	}
	r.Index = string(b[headerBytes : headerBytes+nameLen])
	keys := b[headerBytes+nameLen:]
	r.Keys = make([]prefix.Key, nKeys)
	for i := range r.Keys {
		copy(r.Keys[i][:], keys[i*keyBytes:])
	}
	if err := r.check(); err != nil {
		return Request{}, err
	}
	return r, nil
}

// Reply is the uplink's answer to a fill: how many of the keys it asked
// for are now in the local index (leading, in order), and whether it
// failed (Err: the cluster store did not answer, say).
type Reply struct {
	Filled uint32
	Failed bool
}

// AppendBinary appends the reply's 12 bytes: magic, status, 3 reserved
// bytes, the count.
func (r Reply) AppendBinary(b []byte) []byte {
	status := byte(0)
	if r.Failed {
		status = 1
	}
	b = append(b, replyMagic[:]...)
	b = append(b, status, 0, 0, 0)
	return binary.LittleEndian.AppendUint32(b, r.Filled)
}

// ParseReply reads a reply to a fill of asked keys.
func ParseReply(b []byte, asked int) (Reply, error) {
	if len(b) != replyBytes || [4]byte(b[:4]) != replyMagic || b[4] > 1 {
		return Reply{}, fmt.Errorf("cluster: %w: not a reply (%d bytes)", ErrBadMessage, len(b))
	}
	r := Reply{Filled: binary.LittleEndian.Uint32(b[8:]), Failed: b[4] == 1}
	if int64(r.Filled) > int64(asked) {
		return Reply{}, fmt.Errorf("cluster: %w: %d filled of %d asked", ErrBadMessage, r.Filled, asked)
	}
	return r, nil
}

// A page travels between nodes as its payload and a trailer: the magic,
// the version, flags, the payload's length, its WireChecksum (CRC-32C of
// the key, then the payload) and, from a node given the cluster's key, a
// MAC of the page (PageAuth), little endian. The receiving node checks
// them before it publishes the page. The trailer follows the payload in
// one transfer where the block has room after the payload (written there
// by Go under the sender's pin, flushed), and travels as a second piece
// from the uplink's registered memory where not.
const TrailerBytes = 32

var trailerMagic = [4]byte{'C', 'X', 'L', 'P'}

const (
	trailerVersion = 2
	trailerHasMAC  = 1 << 0 // flags: the trailer carries a MAC
)

// Trailer is a page's trailer.
type Trailer struct {
	Length uint32
	CRC    uint32 // prefix.WireChecksum of the key and the payload
	MAC    [MACBytes]byte
	Signed bool // MAC holds the page's MAC (the sender had the cluster key)
}

// Put writes t's wire form into b (at least TrailerBytes long).
func (t Trailer) Put(b []byte) {
	var flags uint16
	if t.Signed {
		flags |= trailerHasMAC
	}
	copy(b, trailerMagic[:])
	binary.LittleEndian.PutUint16(b[4:], trailerVersion)
	binary.LittleEndian.PutUint16(b[6:], flags)
	binary.LittleEndian.PutUint32(b[8:], t.Length)
	binary.LittleEndian.PutUint32(b[12:], t.CRC)
	copy(b[16:32], t.MAC[:])
}

// ParseTrailer reads a trailer; the length must be the payload's.
func ParseTrailer(b []byte, length int64) (Trailer, error) {
	if len(b) < TrailerBytes || [4]byte(b[:4]) != trailerMagic {
		return Trailer{}, fmt.Errorf("cluster: %w: no page trailer", ErrBadMessage)
	}
	if v := binary.LittleEndian.Uint16(b[4:]); v != trailerVersion {
		return Trailer{}, fmt.Errorf("cluster: %w: trailer version %d, this build reads %d", ErrBadMessage, v, trailerVersion)
	}
	flags := binary.LittleEndian.Uint16(b[6:])
	if flags&^trailerHasMAC != 0 {
		return Trailer{}, fmt.Errorf("cluster: %w: trailer flags %#x", ErrBadMessage, flags)
	}
	t := Trailer{Length: binary.LittleEndian.Uint32(b[8:]), CRC: binary.LittleEndian.Uint32(b[12:]), Signed: flags&trailerHasMAC != 0}
	copy(t.MAC[:], b[16:32])
	if int64(t.Length) != length {
		return Trailer{}, fmt.Errorf("cluster: %w: trailer of a %d-byte payload on %d bytes", ErrBadMessage, t.Length, length)
	}
	return t, nil
}
