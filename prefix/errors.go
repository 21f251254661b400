package prefix

import "github.com/cxltier/cxltier/internal/errkind"

// Sentinel errors; calls wrap them with the key, entry or value at fault.
var (
	ErrBadKey      = errkind.New(errkind.Invalid, "malformed key")
	ErrBadToken    = errkind.New(errkind.Invalid, "token id out of range")
	ErrBadConfig   = errkind.New(errkind.Invalid, "invalid prefix index configuration")
	ErrBadIndex    = errkind.New(errkind.Invalid, "not a valid prefix index")
	ErrTooLarge    = errkind.New(errkind.Invalid, "payload larger than the index's block size")
	ErrNoSpace     = errkind.New(errkind.NoSpace, "no free block and nothing evictable")
	ErrIndexFull   = errkind.New(errkind.NoSpace, "index table full")
	ErrPinsFull    = errkind.New(errkind.NoSpace, "pin table of this client full")
	ErrPinned      = errkind.New(errkind.Busy, "entry pinned by a reader")
	ErrNotFound    = errkind.New(errkind.NotFound, "key not found")
	ErrChecksum    = errkind.New(errkind.Checksum, "payload checksum mismatch")
	ErrUnsigned    = errkind.New(errkind.Checksum, "page not signed with the index's key")
	ErrLost        = errkind.New(errkind.Closed, "reservation lost (reclaimed)")
	ErrOpen        = errkind.New(errkind.Exists, "index already open by this client")
	ErrBadSnapshot = errkind.New(errkind.Invalid, "malformed prefix snapshot")
	ErrDenied      = errkind.New(errkind.Denied, "wrong or missing index key")
	ErrStale       = errkind.New(errkind.Closed, "index destroyed or replaced since this handle opened it")
	ErrIncomplete  = errkind.New(errkind.Invalid, "layer-wise load closed before its last layer")
	ErrPoisoned    = errkind.New(errkind.Closed, "a call on this handle panicked mid-mutation; close it and open the index again")
	ErrFillOver    = errkind.New(errkind.Closed, "the fill was committed or closed")
)
