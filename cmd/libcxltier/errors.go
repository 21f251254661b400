package main

// #include <stdint.h>
import "C"

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"unsafe"

	"github.com/cxltier/cxltier/internal/errkind"
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
	codeBusy     = -9
	codeDamaged  = -10
	codeOther    = -99
)

// errRange: a caller's output buffer is too small. errBadArg: a bad
// argument that no package below checks.
var (
	errRange  = errkind.New(errkind.Range, "output buffer too small")
	errBadArg = errkind.New(errkind.Invalid, "bad argument")
)

// codes are the CXL_E* code of each error kind (package errkind's table,
// which every package's sentinels name).
var codes = map[errkind.Kind]C.int{
	errkind.Invalid:  codeInval,
	errkind.NotFound: codeNotFound,
	errkind.Exists:   codeExist,
	errkind.NoSpace:  codeNoSpace,
	errkind.Checksum: codeChecksum,
	errkind.Closed:   codeClosed,
	errkind.Range:    codeRange,
	errkind.Denied:   codeDenied,
	errkind.Busy:     codeBusy,
	errkind.Damaged:  codeDamaged,
}

// codeOf maps an error to the code a C caller can branch on.
func codeOf(err error) C.int {
	if err == nil {
		return codeOK
	}
	if c, ok := codes[errkind.Of(err)]; ok {
		return c
	}
	return codeOther
}

// recoverCall is deferred first by every exported function: a panic (a
// bug in the library) becomes CXL_EOTHER with a message naming the call,
// and its stack goes to stderr, instead of killing the process the library
// runs in (an inference server).
func recoverCall(name string, errbuf *C.char, errlen C.int, code *C.int) {
	if err := recovered(name, recover(), os.Stderr); err != nil {
		*code = report(err, errbuf, errlen)
	}
}

// recovered is the error of a recovered panic p in call name (nil: none),
// its stack written to log.
func recovered(name string, p any, log io.Writer) error {
	if p == nil {
		return nil
	}
	err := fmt.Errorf("%s: internal error, a bug in libcxltier (please report it with the stack printed on stderr): %v", name, p)
	fmt.Fprintf(log, "libcxltier: %v\n%s", err, debug.Stack())
	return err
}

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
