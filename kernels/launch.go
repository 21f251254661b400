package kernels

import (
	"unsafe"

	"github.com/cxltier/cxltier/internal/errkind"
)

// The launch API: how packages that own a kernel (topk, engram) run it on
// an engine without this package knowing what the kernel does. A package
// embeds its PTX, asks the engine for a function by module name, and runs
// its checks and launches inside one Run, where the engine's lock is held:
// what the checks saw (registered ranges, buffers) stays true until the
// kernels are queued, so a concurrent Unregister cannot unpin memory a
// launched kernel reads.

// ErrNotInRun is returned by Launch methods used outside the Run that lent
// them, or in a way Run allows once.
var ErrNotInRun = errkind.New(errkind.Invalid, "kernels: launch used outside its Run")

// Function is a kernel of a module an engine loaded (on CUDA, a CUfunction
// handle). The zero Function is none.
type Function struct{ handle uintptr }

// IsZero reports the zero Function.
func (f Function) IsZero() bool { return f.handle == 0 }

// Launcher is implemented by engines that run kernels compiled to PTX (the
// CUDA engine). Run calls f with the engine's lock held and its context
// current on a locked OS thread, then marks the end of everything f queued
// and returns a Handle on it. f must not call the engine's own methods (it
// would wait for its own lock) nor keep the Launch.
type Launcher interface {
	Engine
	Run(f func(Launch) error) (Handle, error)
	// Mapped allocates n bytes of page-locked host memory mapped for the
	// device: kernels read and write it in place at its device address.
	Mapped(n int) (*Mapped, error)
}

// Launch is what Run lends f: the engine's launch primitives, all ordered
// on the engine's stream. Device addresses are plain uint64s, as kernels
// take them.
type Launch interface {
	// Function returns kernel name of the module called module, loading
	// ptx the first time the engine sees module (it stays loaded until the
	// engine closes, so every handle on the engine shares it).
	Function(module, ptx, name string) (Function, error)
	// MaxThreads is the most threads a block of fn may have.
	MaxThreads(fn Function) (int, error)
	// SharedLimit is the most dynamic shared memory a block may opt in to.
	SharedLimit() (int, error)
	// AllowShared lets fn's launches use up to bytes of dynamic shared
	// memory (needed above 48 KiB).
	AllowShared(fn Function, bytes int) error
	// MaxBlocks is the engine's cap on a launch's grid.
	MaxBlocks() int
	// Bases is the device address of the range base table: MaxRanges
	// words, the device address of each registered range (0 if none), by
	// which kernels resolve an Addr.
	Bases() uint64
	// CheckSpan reports whether n bytes at a lie in a registered range.
	CheckSpan(a Addr, n int64) error
	// Ptr is the device address of byte off of an engine buffer, checking
	// that n bytes from there lie inside it.
	Ptr(b Buffer, off, n int64) (uint64, error)
	// Stage copies words to device memory that stays untouched until the
	// kernels queued in this Run are done, and returns its address. Once
	// per Run.
	Stage(words []uint64) (uint64, error)
	// Memset32 sets n 32-bit words at the device address dst to v.
	Memset32(dst uint64, v uint32, n int) error
	// Kernel queues fn on a grid of blocks blocks of threads threads with
	// shared bytes of dynamic shared memory; every parameter is 8 bytes.
	Kernel(fn Function, blocks, threads, shared int, params ...uint64) error
	// Sync waits for everything queued on the engine so far.
	Sync() error
	// Read copies device memory at src to dst and waits for it.
	Read(dst []byte, src uint64) error
	// ReadLater is Read without the wait: it queues a copy of n bytes of
	// device memory at src, which must lie in this Run's Stage, back to
	// the host, and hands them to then once the Run's kernels are done —
	// when its Handle is waited for, or earlier, before the engine reuses
	// the stage. So a caller can queue the next Run while the device
	// still works on this one. Thens run one at a time, in the order of
	// their Runs (a Wait runs those of earlier Runs first), on the
	// waiting goroutine with the engine's lock held, and never after the
	// Run's work failed; then must not keep the slice. Once per Run.
	ReadLater(src uint64, n int, then func([]byte)) error
}

// Mapped is page-locked host memory that kernels reach over the bus.
// Kernels queued on it must be done before it is freed.
type Mapped struct {
	Host []byte // the memory, host side
	Dev  uint64 // its address for kernels
	free func() error
}

// Words views the memory as uint64s (it is page aligned, so the view is
// aligned).
func (m *Mapped) Words() []uint64 {
	if len(m.Host) == 0 {
		return nil
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&m.Host[0])), len(m.Host)/8)
}

// Free unpins and unmaps the memory; call it outside Run.
func (m *Mapped) Free() error {
	if m == nil || m.free == nil {
		return nil
	}
	err := m.free()
	m.free, m.Host, m.Dev = nil, nil, 0
	return err
}
