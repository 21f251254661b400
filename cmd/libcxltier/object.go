package main

// #include <stdint.h>
import "C"

import (
	"encoding/json"
	"fmt"
	"math"
	"runtime"
	"unsafe"

	"github.com/cxltier/cxltier/internal/rowgather"
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
// for plane p, row i of its output gets row_bytes[p] at planes[p] +
// ids[i] × row_bytes[p], for ids in [0, rows). The planes' outputs lie
// one after another in out: plane p's n rows start at n × (row_bytes[0] +
// … + row_bytes[p-1]), so that one buffer (one allocation, one pinned
// staging block) holds a lookup. Up to threads threads copy (0: every
// core); small calls stay on the caller's.
//
//export cxl_object_gather
func cxl_object_gather(h C.uint64_t, nPlanes C.int, planes, rowBytes *C.int64_t, rows C.int64_t, ids *C.int64_t, n C.int64_t, out unsafe.Pointer, outCap C.int64_t, threads C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_object_gather", errbuf, errlen, &code)
	err := func() error {
		o, done, err := use[*object](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if nPlanes < 1 || nPlanes > maxPlanes || planes == nil || rowBytes == nil || n < 0 || (n > 0 && (ids == nil || out == nil)) || outCap < 0 || threads < 0 {
			return fmt.Errorf("object gather: %w: %d planes, %d ids, %d threads", errBadArg, nPlanes, n, threads)
		}
		var g [maxPlanes]rowgather.Plane
		need, err := o.planes(g[:nPlanes], unsafe.Slice((*int64)(unsafe.Pointer(planes)), int(nPlanes)),
			unsafe.Slice((*int64)(unsafe.Pointer(rowBytes)), int(nPlanes)), int64(rows), int64(n))
		if err != nil {
			return err
		}
		if need > int64(outCap) {
			return fmt.Errorf("object gather %q: %w: %d rows of %d planes need %d bytes, out has %d", o.name, errRange, n, nPlanes, need, outCap)
		}
		if n == 0 {
			return nil
		}
		idv := unsafe.Slice((*int64)(unsafe.Pointer(ids)), int(n))
		dst := unsafe.Slice((*byte)(out), need)
		for p := range g[:nPlanes] {
			g[p].Dst, dst = dst[:int(n)*g[p].RowBytes], dst[int(n)*g[p].RowBytes:]
		}
		// Copy checks every id before it writes (one pass; an id outside
		// the planes' rows is its ErrBadID, naming id and position).
		if err := gathers.Copy(g[:nPlanes], idv, int(threads)); err != nil {
			return fmt.Errorf("object gather %q: %w: %w", o.name, errBadArg, err)
		}
		return nil
	}()
	return report(err, errbuf, errlen)
}

// gathers copies every object gather of the process: one set of helper
// threads, which stay awake across a batch's back-to-back lookups, however
// many objects and tiers are open (like handles, the library's own).
var gathers = rowgather.NewPool(runtime.NumCPU())

// maxPlanes bounds one gather's planes (a table has a handful).
const maxPlanes = 16

// planes fills g with the object's planes at offsets at of rows rows of
// rb bytes each, every one checked to lie inside the object, and returns
// the bytes n gathered rows of them take.
func (o *object) planes(g []rowgather.Plane, at, rb []int64, rows, n int64) (int64, error) {
	size, need := int64(len(o.data)), int64(0)
	for p := range g {
		if rb[p] <= 0 || rows < 0 || at[p] < 0 || at[p] > size || rows > (size-at[p])/rb[p] {
			return 0, fmt.Errorf("object gather: %w: plane %d: %d rows of %d bytes at %d do not fit object %q of %d bytes", errBadArg, p, rows, rb[p], at[p], o.name, size)
		}
		if n > 0 && rb[p] > (math.MaxInt64-need)/n {
			return 0, fmt.Errorf("object gather: %w: %d rows of plane %d (%d bytes each) overflow", errRange, n, p, rb[p])
		}
		need += n * rb[p]
		g[p] = rowgather.Plane{Src: o.data[at[p] : at[p]+rows*rb[p]], RowBytes: int(rb[p])}
	}
	return need, nil
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
