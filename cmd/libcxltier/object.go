package main

// #include <stdint.h>
import "C"

import (
	"encoding/json"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/cxltier/cxltier/internal/prefetch"
	"github.com/cxltier/cxltier/tier"
)

// Named objects (tier.Object) for callers outside Go: a persistent table
// that every rank, instance and restart finds by name. An open object is a
// child of its tier holding the object (removal refuses while it lives)
// and, when opened read-only, a read-only view of its payload; the address
// handed out is mapping memory, never Go memory, valid until the object or
// its tier is closed.

const (
	objectContiguous = 1 // cxl_object_create: payload on one device in one run
	objectReadOnly   = 1 // cxl_object_open: map the payload read-only
)

type object struct {
	child
	name string
	data []byte // the payload as this process maps it
	r    *tier.Region
}

func objectOf(h uint64) (*object, error) { return get[*object](&handles, h) }

//export cxl_object_create
func cxl_object_create(h C.uint64_t, name *C.char, bytes C.int64_t, flags C.int, out *C.uint64_t, addr *unsafe.Pointer, size *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_object_create", errbuf, errlen, &code)
	err := func() error {
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if out == nil || addr == nil || size == nil || flags&^objectContiguous != 0 {
			return fmt.Errorf("object create: %w: null output or unknown flags %#x", errBadArg, int(flags))
		}
		n := C.GoString(name)
		if _, err := a.c.CreateObject(n, int64(bytes), tier.ObjectOptions{Contiguous: flags&objectContiguous != 0}); err != nil {
			return err
		}
		return openObject(a, uint64(h), n, false, out, addr, size)
	}()
	return report(err, errbuf, errlen)
}

//export cxl_object_open
func cxl_object_open(h C.uint64_t, name *C.char, flags C.int, out *C.uint64_t, addr *unsafe.Pointer, size *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_object_open", errbuf, errlen, &code)
	err := func() error {
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if out == nil || addr == nil || size == nil || flags&^objectReadOnly != 0 {
			return fmt.Errorf("object open: %w: null output or unknown flags %#x", errBadArg, int(flags))
		}
		return openObject(a, uint64(h), C.GoString(name), flags&objectReadOnly != 0, out, addr, size)
	}()
	return report(err, errbuf, errlen)
}

func openObject(a *attached, th uint64, name string, readOnly bool, out *C.uint64_t, addr *unsafe.Pointer, size *C.int64_t) error {
	o, err := a.r.OpenObject(name)
	if err != nil {
		return err
	}
	if !o.Contiguous {
		return fmt.Errorf("object %q spans devices: it has no single address (read it with cxl_object_gather): %w", name, errBadArg)
	}
	if err := a.c.HoldObject(name); err != nil {
		return err
	}
	release := func() error { return a.c.ReleaseObject(name) }
	data, err := a.r.ObjectBytes(o)
	if err == nil && readOnly {
		var v *tier.ReadOnlyView
		if v, err = a.r.MapReadOnly(o.Offset, o.Size); err == nil {
			data = v.Data
			release = func() error {
				err := a.c.ReleaseObject(name)
				if cerr := v.Close(); err == nil {
					err = cerr
				}
				return err
			}
		}
	}
	if err != nil {
		release()
		return err
	}
	ob := &object{name: name, data: data, r: a.r, child: child{tier: th, close: release}}
	ob.handle = handles.addChild(a, ob, ob.child)
	*out, *addr, *size = C.uint64_t(ob.handle), unsafe.Pointer(&data[0]), C.int64_t(len(data))
	return nil
}

//export cxl_object_close
func cxl_object_close(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_object_close", errbuf, errlen, &code)
	err := func() error {
		o, done, err := use[*object](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		return handles.closeChild(uint64(h), o.child)
	}()
	return report(err, errbuf, errlen)
}

// cxl_object_gather copies rows of planes of an open object, all in one
// call (SGLang's Engram tables are two planes: fp8 rows, then scales):
// for plane p, outs[p][i] gets row_bytes[p] at planes[p] + ids[i] ×
// row_bytes[p], for ids in [0, rows). Large calls copy on every core.
//
//export cxl_object_gather
func cxl_object_gather(h C.uint64_t, nPlanes C.int, planes, rowBytes *C.int64_t, rows C.int64_t, ids *C.int64_t, n C.int64_t, outs *unsafe.Pointer, outCaps *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_object_gather", errbuf, errlen, &code)
	err := func() error {
		o, done, err := use[*object](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if nPlanes < 1 || nPlanes > 16 || planes == nil || rowBytes == nil || outs == nil || outCaps == nil || n < 0 || (n > 0 && ids == nil) {
			return fmt.Errorf("object gather: %w: %d planes, %d ids", errBadArg, nPlanes, n)
		}
		np := int(nPlanes)
		at := unsafe.Slice((*int64)(unsafe.Pointer(planes)), np)
		rb := unsafe.Slice((*int64)(unsafe.Pointer(rowBytes)), np)
		caps := unsafe.Slice((*int64)(unsafe.Pointer(outCaps)), np)
		dsts := unsafe.Slice(outs, np)
		g := make([]plane, np)
		for p := range g {
			size := int64(len(o.data))
			switch {
			case rb[p] <= 0 || rows < 0 || at[p] < 0 || at[p] > size || int64(rows) > (size-at[p])/rb[p]:
				return fmt.Errorf("object gather: %w: plane %d: %d rows of %d bytes at %d do not fit object %q of %d bytes", errBadArg, p, rows, rb[p], at[p], o.name, size)
			case int64(n) > caps[p]/rb[p] || (n > 0 && dsts[p] == nil):
				return fmt.Errorf("object gather: %w: plane %d: %d rows of %d bytes need %d bytes, out has %d", errRange, p, n, rb[p], int64(n)*rb[p], caps[p])
			}
			g[p] = plane{src: o.data[at[p]:], rowBytes: rb[p], dst: unsafe.Slice((*byte)(dsts[p]), int(n)*int(rb[p]))}
		}
		var idv []int64
		if n > 0 {
			idv = unsafe.Slice((*int64)(unsafe.Pointer(ids)), int(n))
		}
		return gatherRows(g, int64(rows), idv)
	}()
	return report(err, errbuf, errlen)
}

// plane is one run of fixed-size rows and where its gathered rows go.
type plane struct {
	src      []byte
	rowBytes int64
	dst      []byte
}

// gatherRows copies rows of every plane by id, checking every id first so
// that a bad one leaves the outputs unwritten; above a few thousand rows
// the copy runs on every core.
func gatherRows(planes []plane, rows int64, ids []int64) error {
	for i, id := range ids {
		if id < 0 || id >= rows {
			return fmt.Errorf("object gather: %w: id %d (position %d) outside [0, %d)", errBadArg, id, i, rows)
		}
	}
	// Random rows of a table far larger than the caches each miss: a batch's
	// hints all go out before its copies, so its misses are in flight
	// together instead of one per copy (BenchmarkGatherRows: 768 rows of a
	// 1 GiB table in 0.8x the time of no hints, where hints a fixed
	// distance ahead of each copy took 1.2x).
	const batch = 64
	copyRange := func(lo, hi int) {
		for k := lo; k < hi; k += batch {
			end := min(k+batch, hi)
			for _, p := range planes {
				for _, id := range ids[k:end] {
					prefetch.Lines(&p.src[id*p.rowBytes], uintptr(p.rowBytes))
				}
			}
			for _, p := range planes {
				rb := p.rowBytes
				for i := k; i < end; i++ {
					at := ids[i] * rb
					copy(p.dst[int64(i)*rb:int64(i+1)*rb], p.src[at:at+rb])
				}
			}
		}
	}
	const perWorker = 512
	workers := min(runtime.NumCPU(), (len(ids)+perWorker-1)/perWorker)
	if workers <= 1 {
		copyRange(0, len(ids))
		return nil
	}
	// The calling thread takes the first share itself: it is running
	// already, where a goroutine has to be woken.
	var wg sync.WaitGroup
	step := (len(ids) + workers - 1) / workers
	for lo := step; lo < len(ids); lo += step {
		wg.Add(1)
		go func(lo, hi int) { defer wg.Done(); copyRange(lo, hi) }(lo, min(lo+step, len(ids)))
	}
	copyRange(0, step)
	wg.Wait()
	return nil
}

//export cxl_object_info
func cxl_object_info(h C.uint64_t, name *C.char, buf *C.char, bufCap C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_object_info", errbuf, errlen, &code)
	err := func() error {
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		var v any
		if name == nil {
			v, err = a.r.Objects()
		} else {
			v, err = a.r.OpenObject(C.GoString(name))
		}
		if err != nil {
			return err
		}
		raw, _ := json.Marshal(v)
		return copyString(raw, buf, bufCap)
	}()
	return report(err, errbuf, errlen)
}

//export cxl_object_seal
func cxl_object_seal(h C.uint64_t, name, label *C.char, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_object_seal", errbuf, errlen, &code)
	return report(objectCall(h, func(a *attached) error {
		_, err := a.c.SealObject(C.GoString(name), C.GoString(label))
		return err
	}), errbuf, errlen)
}

//export cxl_object_unseal
func cxl_object_unseal(h C.uint64_t, name *C.char, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_object_unseal", errbuf, errlen, &code)
	return report(objectCall(h, func(a *attached) error {
		_, err := a.c.UnsealObject(C.GoString(name))
		return err
	}), errbuf, errlen)
}

// cxl_object_claim makes this tier client the loader of the named object
// (tier.Client.ClaimObjectLoad): CXL_EBUSY while another running client
// loads it; a sealed object is left unclaimed.
//
//export cxl_object_claim
func cxl_object_claim(h C.uint64_t, name *C.char, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_object_claim", errbuf, errlen, &code)
	return report(objectCall(h, func(a *attached) error {
		_, err := a.c.ClaimObjectLoad(C.GoString(name))
		return err
	}), errbuf, errlen)
}

//export cxl_object_verify
func cxl_object_verify(h C.uint64_t, name *C.char, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_object_verify", errbuf, errlen, &code)
	return report(objectCall(h, func(a *attached) error {
		o, err := a.r.OpenObject(C.GoString(name))
		if err != nil {
			return err
		}
		return a.r.VerifyObject(o)
	}), errbuf, errlen)
}

//export cxl_object_remove
func cxl_object_remove(h C.uint64_t, name *C.char, force C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_object_remove", errbuf, errlen, &code)
	return report(objectCall(h, func(a *attached) error { return a.c.RemoveObject(C.GoString(name), force != 0) }), errbuf, errlen)
}

func objectCall(h C.uint64_t, fn func(*attached) error) error {
	a, done, err := use[*attached](uint64(h))
	if err != nil {
		return err
	}
	defer done.Done()
	return fn(a)
}
