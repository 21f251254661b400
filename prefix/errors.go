package prefix

import "errors"

// Sentinel errors; calls wrap them with the key, entry or value at fault.
var (
	ErrBadKey      = errors.New("malformed key")
	ErrBadToken    = errors.New("token id out of range")
	ErrBadConfig   = errors.New("invalid prefix index configuration")
	ErrBadIndex    = errors.New("not a valid prefix index")
	ErrTooLarge    = errors.New("payload larger than the index's block size")
	ErrNoSpace     = errors.New("no free block and nothing evictable")
	ErrIndexFull   = errors.New("index table full")
	ErrPinsFull    = errors.New("pin table of this client full")
	ErrPinned      = errors.New("entry pinned by a reader")
	ErrNotFound    = errors.New("key not found")
	ErrChecksum    = errors.New("payload checksum mismatch")
	ErrLost        = errors.New("reservation lost (reclaimed)")
	ErrOpen        = errors.New("index already open by this client")
	ErrBadSnapshot = errors.New("malformed prefix snapshot")
	ErrDenied      = errors.New("wrong or missing index key")
)
