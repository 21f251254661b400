// Package errkind is the one table of error kinds: what a caller outside
// Go branches on (the C ABI's CXL_E* codes, an exit status). Each domain
// package declares its sentinels with New, naming their kind once where
// they are defined; Of finds the kind of any error that wraps one. A
// sentinel added later therefore reaches callers with its kind, not as
// "other".
package errkind

import "errors"

// Kind is a class of failure.
type Kind uint8

const (
	Other    Kind = iota // a bug, or damage with no better name
	Invalid              // a bad argument, configuration or input
	NotFound             // no such object, handle or entry
	Exists               // already exists or already open
	NoSpace              // the tier, a table or a cache is full
	Checksum             // data failed its checksum
	Closed               // closed, or the client lost its lease
	Range                // a caller's output buffer is too small
	Denied               // a wrong key or permission
	Busy                 // held by another client or call for now (a lock, a pin): retry later
	Damaged              // shared metadata failed a consistency check: repair, do not retry
)

var names = [...]string{"other", "invalid", "not found", "exists", "no space", "checksum", "closed", "range", "denied", "busy", "damaged"}

func (k Kind) String() string {
	if int(k) < len(names) {
		return names[k]
	}
	return "Kind(" + string(rune('0'+k)) + ")"
}

// sentinel is an error value of a kind; callers compare with errors.Is.
type sentinel struct {
	msg  string
	kind Kind
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Kind() Kind    { return e.kind }

// New returns a sentinel error of kind k with message msg.
func New(k Kind, msg string) error { return &sentinel{msg: msg, kind: k} }

// Of is the kind of the first sentinel err wraps (depth first, as
// errors.As looks), Other when it wraps none.
func Of(err error) Kind {
	var k interface{ Kind() Kind }
	if errors.As(err, &k) {
		return k.Kind()
	}
	return Other
}
