package main

// #include <stdint.h>
import "C"

import (
	"errors"
	"unsafe"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/topk"
)

// Codes are the CXL_E* values of main.go's C enum.
const (
	codeOK       = 0
	codeInval    = -1
	codeNotFound = -2
	codeExist    = -3
	codeNoSpace  = -4
	codeChecksum = -5
	codeClosed   = -6
	codeRange    = -7
	codeDenied   = -8
	codeOther    = -99
)

// errRange: a caller's output buffer is too small.
var errRange = errors.New("output buffer too small")

// codeOf maps an error to the code a C caller can branch on.
func codeOf(err error) C.int {
	switch {
	case err == nil:
		return codeOK
	case errors.Is(err, errRange):
		return codeRange
	case errors.Is(err, prefix.ErrDenied):
		return codeDenied
	case errors.Is(err, prefix.ErrChecksum):
		return codeChecksum
	case errors.Is(err, tier.ErrNotFound), errors.Is(err, prefix.ErrNotFound), errors.Is(err, tier.ErrNoBacking), errors.Is(err, topk.ErrUnknown):
		return codeNotFound
	case errors.Is(err, tier.ErrExists), errors.Is(err, topk.ErrRegistered):
		return codeExist
	case errors.Is(err, tier.ErrExhausted), errors.Is(err, tier.ErrLeaseTable), errors.Is(err, tier.ErrDirFull), errors.Is(err, prefix.ErrNoSpace), errors.Is(err, prefix.ErrIndexFull), errors.Is(err, prefix.ErrPinsFull):
		return codeNoSpace
	case errors.Is(err, tier.ErrClosed), errors.Is(err, tier.ErrLeaseLost), errors.Is(err, prefix.ErrLost), errors.Is(err, topk.ErrClosed):
		return codeClosed
	case errors.Is(err, tier.ErrInvalidConfig), errors.Is(err, prefix.ErrBadKey), errors.Is(err, prefix.ErrBadConfig),
		errors.Is(err, prefix.ErrTooLarge), errors.Is(err, engram.ErrGeometry), errors.Is(err, engram.ErrInput),
		errors.Is(err, errBadArg), errors.Is(err, topk.ErrBadConfig), errors.Is(err, topk.ErrBadPosition), errors.Is(err, topk.ErrBadEntry),
		errors.Is(err, topk.ErrBadInput), errors.Is(err, topk.ErrNotAppended), errors.Is(err, kernels.ErrNoCUDA), errors.Is(err, kernels.ErrNoDevice):
		return codeInval
	}
	return codeOther
}

var errBadArg = errors.New("bad argument")

// report writes err's message into the caller's buffer (NUL-terminated,
// cut to fit) and returns its code.
func report(err error, buf *C.char, n C.int) C.int {
	if err != nil && buf != nil && n > 0 {
		dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
		msg := err.Error()
		k := copy(dst[:len(dst)-1], msg)
		dst[k] = 0
	}
	return codeOf(err)
}
