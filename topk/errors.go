package topk

import "github.com/cxltier/cxltier/internal/errkind"

// Sentinel errors; calls wrap them with the request, layer or position.
var (
	ErrBadConfig   = errkind.New(errkind.Invalid, "topk: bad configuration")
	ErrUnknown     = errkind.New(errkind.NotFound, "topk: request not registered")
	ErrRegistered  = errkind.New(errkind.Exists, "topk: request already registered")
	ErrBadPosition = errkind.New(errkind.Invalid, "topk: position outside the sequence")
	ErrBadEntry    = errkind.New(errkind.Invalid, "topk: entry size does not match the pool")
	ErrBadInput    = errkind.New(errkind.Invalid, "topk: malformed input")
	ErrNotAppended = errkind.New(errkind.Invalid, "topk: sequence length beyond the appended entries")
	ErrClosed      = errkind.New(errkind.Closed, "topk: pool closed")
)
