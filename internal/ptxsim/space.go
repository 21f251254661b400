package ptxsim

import (
	"errors"
	"fmt"
	"sort"
)

// Errors a launch returns, wrapped in a *Fault that says where.
var (
	ErrFault     = errors.New("ptxsim: kernel fault")
	ErrDeadlock  = errors.New("ptxsim: kernel deadlock")
	ErrStepLimit = errors.New("ptxsim: kernel ran past its step limit")
	ErrRace      = errors.New("ptxsim: shared-memory race")
	ErrLaunch    = errors.New("ptxsim: bad launch")
)

// Fault is a kernel's failure: the instruction and thread where it
// happened (for a deadlock, where every thread waits).
type Fault struct {
	Kernel string
	Line   int    // PTX line of the instruction
	Inst   string // the instruction as written
	Block  int
	Thread int
	Reason string
	Kind   error // ErrFault, ErrDeadlock, ErrStepLimit or ErrRace
}

func (f *Fault) Error() string {
	if f.Line == 0 {
		return fmt.Sprintf("%v in %s block %d: %s", f.Kind, f.Kernel, f.Block, f.Reason)
	}
	return fmt.Sprintf("%v in %s line %d (%s), block %d thread %d: %s",
		f.Kind, f.Kernel, f.Line, f.Inst, f.Block, f.Thread, f.Reason)
}

func (f *Fault) Unwrap() error { return f.Kind }

// Space is the global memory kernels see: host memory mapped at device
// addresses of its own. Device addresses start at 1<<48, above every
// user-space host address of x86-64 and arm64 with 48-bit virtual
// addresses, so a host pointer handed to a kernel faults instead of
// reading host memory; allocations are spaced by a guard gap so an access
// just past one faults too. A Space is not safe for concurrent use: its
// user (one engine) serializes maps, unmaps and launches.
type Space struct {
	allocs []alloc // by base
	next   uint64
	last   int // the allocation the previous access hit
	// Instructions counts the thread-instructions launches on this space
	// have run (a guard that fails counts too).
	Instructions uint64
}

type alloc struct {
	base uint64
	mem  []byte
}

const (
	deviceBase = 1 << 48
	guardGap   = 1 << 20
)

// NewSpace returns an empty global memory.
func NewSpace() *Space { return &Space{next: deviceBase} }

// Map gives mem a device address. Kernels read and write mem itself, so
// the caller keeps it alive until Unmap.
func (s *Space) Map(mem []byte) (uint64, error) {
	if len(mem) == 0 {
		return 0, fmt.Errorf("%w: mapping of 0 bytes", ErrLaunch)
	}
	// The device address keeps the host address's offset in its page, as
	// a GPU's mapping of registered host memory does, so an access is
	// aligned on the device exactly when it is on the host.
	base := s.next + hostPageOffset(mem)
	s.next = (base + uint64(len(mem)) + 2*guardGap - 1) &^ (guardGap - 1)
	s.allocs = append(s.allocs, alloc{base: base, mem: mem})
	return base, nil
}

// Unmap forgets the allocation at base.
func (s *Space) Unmap(base uint64) error {
	i := s.find(base)
	if i < 0 || s.allocs[i].base != base {
		return fmt.Errorf("%w: no allocation at %#x", ErrLaunch, base)
	}
	s.allocs = append(s.allocs[:i], s.allocs[i+1:]...)
	s.last = 0
	return nil
}

// find is the allocation holding addr, or -1.
func (s *Space) find(addr uint64) int {
	if l := s.last; l < len(s.allocs) && addr-s.allocs[l].base < uint64(len(s.allocs[l].mem)) {
		return l
	}
	i := sort.Search(len(s.allocs), func(i int) bool { return s.allocs[i].base > addr }) - 1
	if i < 0 || addr-s.allocs[i].base >= uint64(len(s.allocs[i].mem)) {
		return -1
	}
	s.last = i
	return i
}

// Bytes is the n bytes at device address addr, which must lie in one
// allocation.
func (s *Space) Bytes(addr uint64, n int) ([]byte, error) {
	i := s.find(addr)
	if i < 0 {
		return nil, fmt.Errorf("address %#x is in no allocation", addr)
	}
	a := &s.allocs[i]
	off := addr - a.base
	if uint64(n) > uint64(len(a.mem))-off {
		return nil, fmt.Errorf("%d bytes at %#x run %d bytes past the end of the allocation at %#x",
			n, addr, uint64(n)-(uint64(len(a.mem))-off), a.base)
	}
	return a.mem[off : off+uint64(n)], nil
}
