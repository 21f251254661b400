package main

// #include <stdint.h>
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/cxltier/cxltier/tier"
)

// A region is a run of chunks this client owns, handed to the caller as one
// contiguous range of its mapping: storage for a tensor (SGLang's host KV
// pool) that GPU kernels read after cudaHostRegister. The mapping is not Go
// memory, so its address may cross to C. The chunks are freed by
// cxl_region_free, at detach, or by the daemon when this process dies.

//export cxl_region_alloc
func cxl_region_alloc(h C.uint64_t, bytes C.int64_t, offset *C.uint64_t, addr *unsafe.Pointer, size *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_region_alloc", errbuf, errlen, &code)
	err := func() error {
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if bytes <= 0 || offset == nil || addr == nil || size == nil {
			return fmt.Errorf("region alloc: %w: %d bytes", errBadArg, bytes)
		}
		r := a.r
		if r.NumDevices() != 1 {
			return fmt.Errorf("region alloc: %w: a striped tier (%d devices) has no contiguous range for one tensor", errBadArg, r.NumDevices())
		}
		chunk := r.ChunkSize()
		n := (int64(bytes) + chunk - 1) / chunk
		off, err := a.c.AllocChunks(n)
		if err != nil {
			return err
		}
		mem, err := r.Slice(off, n*chunk)
		if err != nil {
			a.c.FreeChunks(off, n)
			return err
		}
		*offset, *addr, *size = C.uint64_t(off), unsafe.Pointer(&mem[0]), C.int64_t(n*chunk)
		return nil
	}()
	return report(err, errbuf, errlen)
}

//export cxl_region_free
func cxl_region_free(h C.uint64_t, offset C.uint64_t, size C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_region_free", errbuf, errlen, &code)
	err := func() error {
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		chunk := a.r.ChunkSize()
		if size <= 0 || int64(size)%chunk != 0 {
			return fmt.Errorf("region free: %w: %d bytes is not the size cxl_region_alloc returned", errBadArg, size)
		}
		return a.c.FreeChunks(tier.Offset(offset), int64(size)/chunk)
	}()
	return report(err, errbuf, errlen)
}
