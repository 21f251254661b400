package tier

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapAligned maps a devdax device at a 2 MiB-aligned address: devdax refuses
// mappings whose address is not aligned to its page size. It reserves an
// oversized PROT_NONE range, maps the device over an aligned address inside
// it with MAP_FIXED, and gives the slack on both sides back.
//
// Invariant: the returned slice points at memory Go does not manage; it stays
// valid until the mapping's unmap runs, and the Region never touches it after.
func mapAligned(b Backing, f *os.File, size int64, prot int) (*mapping, error) {
	if size%daxAlign != 0 {
		return nil, fmt.Errorf("tier: %s size %d is not a multiple of 2 MiB: %w", b, size, ErrInvalidConfig)
	}
	span := uintptr(size + daxAlign)
	reserve, err := unix.MmapPtr(-1, 0, nil, span, unix.PROT_NONE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("tier: reserve address space for %s: %w", b, err)
	}
	head := (daxAlign - uintptr(reserve)%daxAlign) % daxAlign
	aligned := unsafe.Add(reserve, head)
	addr, err := unix.MmapPtr(int(f.Fd()), 0, aligned, uintptr(size), prot, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		_ = unix.MunmapPtr(reserve, span)
		return nil, fmt.Errorf("tier: mmap %s at %p: %w", b, aligned, err)
	}
	if head > 0 {
		_ = unix.MunmapPtr(reserve, head)
	}
	if tail := span - head - uintptr(size); tail > 0 {
		_ = unix.MunmapPtr(unsafe.Add(addr, size), tail)
	}
	data := unsafe.Slice((*byte)(addr), int(size))
	return &mapping{backing: b, data: data, unmap: func() error { return unix.MunmapPtr(addr, uintptr(size)) }}, nil
}
