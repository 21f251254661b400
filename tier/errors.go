package tier

import "github.com/cxltier/cxltier/internal/errkind"

// Sentinel errors. Functions wrap them with context; test with errors.Is.
var (
	ErrBadMagic      = errkind.New(errkind.Invalid, "not a cxltier region (bad magic)")
	ErrVersion       = errkind.New(errkind.Invalid, "unsupported region format version")
	ErrChecksum      = errkind.New(errkind.Checksum, "header checksum mismatch")
	ErrTruncated     = errkind.New(errkind.Invalid, "region truncated")
	ErrSizeMismatch  = errkind.New(errkind.Invalid, "region size mismatch")
	ErrCorrupt       = errkind.New(errkind.Damaged, "region metadata inconsistent")
	ErrNoBacking     = errkind.New(errkind.NotFound, "backing does not exist")
	ErrTooSmall      = errkind.New(errkind.Invalid, "backing too small")
	ErrPermission    = errkind.New(errkind.Denied, "backing permission denied")
	ErrExists        = errkind.New(errkind.Exists, "already exists")
	ErrExhausted     = errkind.New(errkind.NoSpace, "tier space exhausted")
	ErrOutOfBounds   = errkind.New(errkind.Invalid, "offset out of bounds")
	ErrNotContiguous = errkind.New(errkind.Invalid, "range crosses a stripe boundary")
	ErrInvalidConfig = errkind.New(errkind.Invalid, "invalid configuration")
	ErrNotFound      = errkind.New(errkind.NotFound, "not found")
	ErrDirFull       = errkind.New(errkind.NoSpace, "root directory full")
	ErrLeaseTable    = errkind.New(errkind.NoSpace, "client lease table full")
	ErrLeaseLost     = errkind.New(errkind.Closed, "client lease lost (reaped)")
	ErrClosed        = errkind.New(errkind.Closed, "closed")
	ErrReadOnly      = errkind.New(errkind.Denied, "region opened read-only")
	ErrInvalidFree   = errkind.New(errkind.Invalid, "invalid free")
	ErrNotOwner      = errkind.New(errkind.Invalid, "not owned by this client")
	ErrLockHeld      = errkind.New(errkind.Invalid, "lock already held by this client (locks do not nest)")
	ErrLockTimeout   = errkind.New(errkind.Busy, "lock wait timed out")
	ErrPayload       = errkind.New(errkind.Checksum, "payload checksum mismatch")
	ErrObjectBusy    = errkind.New(errkind.Exists, "object is held by live clients")
	ErrDeviceOrder   = errkind.New(errkind.Invalid, "device does not belong at this position in the tier")
)
