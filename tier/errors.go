package tier

import "errors"

// Sentinel errors. Functions wrap them with context; test with errors.Is.
var (
	ErrBadMagic      = errors.New("not a cxltier region (bad magic)")
	ErrVersion       = errors.New("unsupported region format version")
	ErrChecksum      = errors.New("header checksum mismatch")
	ErrTruncated     = errors.New("region truncated")
	ErrSizeMismatch  = errors.New("region size mismatch")
	ErrCorrupt       = errors.New("region metadata inconsistent")
	ErrNoBacking     = errors.New("backing does not exist")
	ErrTooSmall      = errors.New("backing too small")
	ErrPermission    = errors.New("backing permission denied")
	ErrExists        = errors.New("already exists")
	ErrExhausted     = errors.New("tier space exhausted")
	ErrOutOfBounds   = errors.New("offset out of bounds")
	ErrNotContiguous = errors.New("range crosses a stripe boundary")
	ErrInvalidConfig = errors.New("invalid configuration")
	ErrNotFound      = errors.New("not found")
	ErrDirFull       = errors.New("root directory full")
	ErrLeaseTable    = errors.New("client lease table full")
	ErrLeaseLost     = errors.New("client lease lost (reaped)")
	ErrClosed        = errors.New("closed")
	ErrReadOnly      = errors.New("region opened read-only")
	ErrInvalidFree   = errors.New("invalid free")
	ErrNotOwner      = errors.New("chunk not owned by this client")
	ErrDeviceOrder   = errors.New("device does not belong at this position in the tier")
)
