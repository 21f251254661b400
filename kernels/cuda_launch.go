//go:build cuda

package kernels

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
	"gorgonia.org/cu"
)

// Run implements Launcher. The Launch it lends is valid only until f
// returns; afterwards the stage f used (if any) is marked busy until the
// stream reaches the end of f's work, and the Handle waits for that point.
func (e *CUDA) Run(f func(Launch) error) (Handle, error) {
	leave, err := e.enter()
	if err != nil {
		return nil, err
	}
	defer leave()
	l := &cudaLaunch{e: e}
	defer func() { l.e = nil }()
	ferr := f(l)
	s := l.stage
	if s == nil {
		// Nothing staged: mark f's end with the next stage's event all the
		// same, so the Handle has something to wait on.
		if s, err = e.stage(0); err != nil {
			return nil, err
		}
	}
	if err := s.ev.Record(e.stream); err != nil {
		return nil, fmt.Errorf("kernels: record event: %w", err)
	}
	s.used = true
	if ferr == nil && l.then != nil {
		// The read's bytes land in the stage's host memory, at the offset
		// they have on the device: valid until the stage is reused, which
		// runs this then first (stage).
		then, lo, hi := l.then, l.readOff, l.readOff+l.readLen
		e.later.add(func() { then(s.host[lo:hi]) })
	}
	s.seq = e.later.seq
	if ferr != nil {
		return nil, ferr
	}
	return &cudaHandle{e: e, ev: s.ev, seq: e.later.seq}, nil
}

// cudaLaunch is the Launch of one Run; e is nil once Run returned.
type cudaLaunch struct {
	e       *CUDA
	stage   *stage
	then    func([]byte) // ReadLater's
	readOff int          // where its bytes are in the stage
	readLen int
}

func (l *cudaLaunch) live() (*CUDA, error) {
	if l.e == nil {
		return nil, ErrNotInRun
	}
	return l.e, nil
}

func (l *cudaLaunch) Function(module, ptx, name string) (Function, error) {
	e, err := l.live()
	if err != nil {
		return Function{}, err
	}
	mod, ok := e.modules[module]
	if !ok {
		if mod, err = cu.LoadData(ptx); err != nil {
			return Function{}, fmt.Errorf("kernels: load module %s: %w", module, err)
		}
		if e.modules == nil {
			e.modules = make(map[string]cu.Module)
		}
		e.modules[module] = mod
	}
	fn, err := mod.Function(name)
	if err != nil {
		return Function{}, fmt.Errorf("kernels: %s in module %s: %w", name, module, err)
	}
	return Function{handle: fnHandle(fn)}, nil
}

// fnHandle and cuFunction convert between cu.Function, a struct holding
// exactly one CUfunction (a pointer-sized handle), and Function's handle.
func fnHandle(fn cu.Function) uintptr { return *(*uintptr)(unsafe.Pointer(&fn)) }

func cuFunction(f Function) cu.Function { return *(*cu.Function)(unsafe.Pointer(&f.handle)) }

func (l *cudaLaunch) MaxThreads(fn Function) (int, error) {
	if _, err := l.live(); err != nil {
		return 0, err
	}
	n, err := cuFunction(fn).Attribute(cu.FnMaxThreadsPerBlock)
	if err != nil {
		return 0, fmt.Errorf("kernels: threads per block: %w", err)
	}
	return n, nil
}

func (l *cudaLaunch) SharedLimit() (int, error) {
	e, err := l.live()
	if err != nil {
		return 0, err
	}
	return maxSharedOptin(e.dev)
}

func (l *cudaLaunch) AllowShared(fn Function, bytes int) error {
	if _, err := l.live(); err != nil {
		return err
	}
	return setMaxShared(cuFunction(fn), bytes)
}

func (l *cudaLaunch) MaxBlocks() int {
	if l.e == nil {
		return 1
	}
	return l.e.maxBlocks
}

func (l *cudaLaunch) Bases() uint64 {
	if l.e == nil {
		return 0
	}
	return uint64(l.e.bases)
}

func (l *cudaLaunch) CheckSpan(a Addr, n int64) error {
	e, err := l.live()
	if err != nil {
		return err
	}
	return e.ranges.checkOne(a, n, "span")
}

func (l *cudaLaunch) Ptr(b Buffer, off, n int64) (uint64, error) {
	e, err := l.live()
	if err != nil {
		return 0, err
	}
	db, err := e.own(b)
	if err != nil {
		return 0, err
	}
	if err := checkBufSpan("kernel operand", db.n, off, n); err != nil {
		return 0, err
	}
	return uint64(db.ptr) + uint64(off), nil
}

func (l *cudaLaunch) Stage(words []uint64) (uint64, error) {
	e, err := l.live()
	if err != nil {
		return 0, err
	}
	if l.stage != nil {
		return 0, fmt.Errorf("%w: a second Stage", ErrNotInRun)
	}
	s, err := e.stage(len(words))
	if err != nil {
		return 0, err
	}
	l.stage = s
	if len(words) == 0 {
		return uint64(s.dev), nil
	}
	copy(s.words(), words)
	if err := cu.MemcpyHtoDAsync(s.dev, unsafe.Pointer(&s.host[0]), int64(len(words))*8, e.stream); err != nil {
		return 0, fmt.Errorf("kernels: stage %d words: %w", len(words), err)
	}
	return uint64(s.dev), nil
}

func (l *cudaLaunch) Memset32(dst uint64, v uint32, n int) error {
	e, err := l.live()
	if err != nil {
		return err
	}
	if err := cu.MemsetD32Async(cu.DevicePtr(dst), uint(v), int64(n), e.stream); err != nil {
		return fmt.Errorf("kernels: set %d words: %w", n, err)
	}
	return nil
}

func (l *cudaLaunch) Kernel(fn Function, blocks, threads, shared int, params ...uint64) error {
	e, err := l.live()
	if err != nil {
		return err
	}
	if fn.IsZero() || blocks < 1 || threads < 1 {
		return fmt.Errorf("%w: launch of %d blocks of %d threads", ErrBadRequest, blocks, threads)
	}
	if err := launch(cuFunction(fn), blocks, threads, shared, e.stream, params...); err != nil {
		return fmt.Errorf("kernels: launch: %w", err)
	}
	return nil
}

func (l *cudaLaunch) Sync() error {
	e, err := l.live()
	if err != nil {
		return err
	}
	return e.stream.Synchronize()
}

// ReadLater implements Launch: the copy goes into the stage's page-locked
// host memory behind the kernels on the stream, so nothing waits here.
func (l *cudaLaunch) ReadLater(src uint64, n int, then func([]byte)) error {
	e, err := l.live()
	if err != nil {
		return err
	}
	var dev uint64
	size := 0
	if l.stage != nil {
		dev, size = uint64(l.stage.dev), len(l.stage.host)
	}
	if err := laterArgs(l.then != nil, dev, size, src, n, then); err != nil {
		return err
	}
	off := int(src - dev)
	if err := cu.MemcpyDtoHAsync(unsafe.Pointer(&l.stage.host[off]), cu.DevicePtr(src), int64(n), e.stream); err != nil {
		return fmt.Errorf("kernels: read %d bytes later: %w", n, err)
	}
	l.then, l.readOff, l.readLen = then, off, n
	return nil
}

func (l *cudaLaunch) Read(dst []byte, src uint64) error {
	e, err := l.live()
	if err != nil {
		return err
	}
	if len(dst) == 0 {
		return nil
	}
	if err := cu.MemcpyDtoHAsync(unsafe.Pointer(&dst[0]), cu.DevicePtr(src), int64(len(dst)), e.stream); err != nil {
		return fmt.Errorf("kernels: read %d bytes: %w", len(dst), err)
	}
	return e.stream.Synchronize()
}

// Mapped implements Launcher.
func (e *CUDA) Mapped(n int) (*Mapped, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: mapped memory of %d bytes", ErrBadRequest, n)
	}
	size := (n + unix.Getpagesize() - 1) &^ (unix.Getpagesize() - 1)
	host, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("kernels: mapped memory of %d bytes: %w", size, err)
	}
	leave, err := e.enter()
	if err != nil {
		unix.Munmap(host)
		return nil, err
	}
	dev, err := hostRegister(host)
	leave()
	if err != nil {
		unix.Munmap(host)
		return nil, err
	}
	free := func() error {
		leave, err := e.enter()
		if err != nil {
			// A closed engine's context may be gone; the pin went with it.
			return unix.Munmap(host)
		}
		defer leave()
		if err := e.stream.Synchronize(); err != nil {
			return fmt.Errorf("kernels: sync before freeing mapped memory: %w", err)
		}
		return errors.Join(hostUnregister(host), unix.Munmap(host))
	}
	return &Mapped{Host: host[:n], Dev: dev, free: free}, nil
}

var _ Launcher = (*CUDA)(nil)
