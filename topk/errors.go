package topk

import "errors"

// Sentinel errors; calls wrap them with the request, layer or position.
var (
	ErrBadConfig   = errors.New("topk: bad configuration")
	ErrUnknown     = errors.New("topk: request not registered")
	ErrRegistered  = errors.New("topk: request already registered")
	ErrBadPosition = errors.New("topk: position outside the sequence")
	ErrBadEntry    = errors.New("topk: entry size does not match the pool")
	ErrBadInput    = errors.New("topk: malformed input")
	ErrNotAppended = errors.New("topk: sequence length beyond the appended entries")
	ErrClosed      = errors.New("topk: pool closed")
)
