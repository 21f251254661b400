package main

// #include <stdint.h>
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/cxltier/cxltier/tier"
	"sync"
	"unsafe"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/topk"
)

// Where the caller's step arrays live (cxl_topk_append, cxl_topk_resolve).
const (
	onHost   = 0
	onDevice = 1 // GPU memory of the pool's engine, ordered on its stream
)

// topkPool is a top-k pool on its tier's shared engine.
type topkPool struct {
	*topk.Pool
	child
	a   *attached
	se  *sharedEngine
	eng kernels.Engine // se.eng
	// stage guards hostTopK and hostOut, which stage device-resident step
	// arrays: two threads may resolve on one pool.
	stage             sync.Mutex
	hostTopK, hostOut []int32
}

func (p *topkPool) shut() error {
	return errors.Join(p.Pool.Close(), p.a.engines.release(p.se))
}

//export cxl_topk_open
func cxl_topk_open(h C.uint64_t, engine *C.char, stream C.uint64_t, layers C.int, entryBytes C.int64_t, slots, k, maxRequests C.int,
	planner *C.char, maxContext C.int64_t, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_topk_open", errbuf, errlen, &code)
	err := func() error {
		if out == nil {
			return fmt.Errorf("topk open: %w: no output handle", errBadArg)
		}
		pl, err := topk.ParsePlanner(C.GoString(planner))
		if err != nil {
			return err
		}
		cfg := topk.Config{Layers: int(layers), EntryBytes: int64(entryBytes), Slots: int(slots), TopK: int(k), MaxRequests: int(maxRequests),
			Planner: pl, MaxContext: int64(maxContext)}
		p, err := openTopk(uint64(h), C.GoString(engine), uintptr(stream), cfg)
		if err != nil {
			return err
		}
		*out = C.uint64_t(p.handle)
		return nil
	}()
	return report(err, errbuf, errlen)
}

// openTopk opens a top-k pool on tier h and returns it under its new
// handle.
func openTopk(h uint64, engine string, stream uintptr, cfg topk.Config) (*topkPool, error) {
	a, done, err := use[*attached](uint64(h))
	if err != nil {
		return nil, err
	}
	defer done.Done()
	se, err := a.engines.acquireRows(engine, stream, a.r.NumDevices(), a.r.Device)
	if err != nil {
		return nil, err
	}
	pool, err := topk.New(a.c, se.eng, se.ids, cfg)
	if err != nil {
		return nil, errors.Join(err, a.engines.release(se))
	}
	p := &topkPool{Pool: pool, a: a, se: se, eng: se.eng}
	p.child = child{tier: h, close: p.shut}
	p.handle = handles.addChild(a, p, p.child)
	return p, nil
}

//export cxl_topk_close
func cxl_topk_close(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_topk_close", errbuf, errlen, &code)
	p, done, err := use[*topkPool](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	return report(handles.closeChild(uint64(h), p.child), errbuf, errlen)
}

//export cxl_topk_register
func cxl_topk_register(h C.uint64_t, req C.int, capacity C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_topk_register", errbuf, errlen, &code)
	err := func() error {
		p, done, err := use[*topkPool](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		c := p.Config()
		return p.Register(int(req), topk.Sequence{Layers: c.Layers, EntryBytes: c.EntryBytes, Capacity: int64(capacity)})
	}()
	return report(err, errbuf, errlen)
}

//export cxl_topk_free
func cxl_topk_free(h C.uint64_t, req C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_topk_free", errbuf, errlen, &code)
	p, done, err := use[*topkPool](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	return report(p.Free(int(req)), errbuf, errlen)
}

//export cxl_topk_len
func cxl_topk_len(h C.uint64_t, req, layer C.int, n *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_topk_len", errbuf, errlen, &code)
	err := func() error {
		p, done, err := use[*topkPool](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if n == nil {
			return fmt.Errorf("topk len: %w: no output", errBadArg)
		}
		l, err := p.Len(int(req), int(layer))
		*n = C.int64_t(l)
		return err
	}()
	return report(err, errbuf, errlen)
}

//export cxl_topk_append
func cxl_topk_append(h C.uint64_t, req, layer C.int, src unsafe.Pointer, n C.int64_t, where C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_topk_append", errbuf, errlen, &code)
	err := func() error {
		p, done, err := use[*topkPool](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		eb := p.Config().EntryBytes
		if n < 0 || int64(n) > maxBuffer/eb || (n > 0 && src == nil) {
			return fmt.Errorf("topk append: %w: %d entries at %p", errBadArg, n, src)
		}
		if n == 0 {
			return nil
		}
		switch where {
		case onHost:
			return p.Append(int(req), int(layer), unsafe.Slice((*byte)(src), int64(n)*eb))
		case onDevice:
			buf, err := p.wrap(uintptr(src), int64(n)*eb)
			if err != nil {
				return err
			}
			return p.AppendFrom(int(req), int(layer), buf, 0, int64(n))
		}
		return fmt.Errorf("topk append: %w: memory kind %d (0 host, 1 device)", errBadArg, where)
	}()
	return report(err, errbuf, errlen)
}

// wrap makes n bytes of caller GPU memory at ptr a buffer of the pool's
// engine, which must be a GPU engine.
func (p *topkPool) wrap(ptr uintptr, n int64) (kernels.Buffer, error) {
	w, ok := p.eng.(kernels.DeviceWrapper)
	if !ok {
		return nil, fmt.Errorf("topk: %w: the %s engine has no device memory; pass host memory (kind 0)", errBadArg, p.eng.Name())
	}
	return w.WrapDevice(ptr, n)
}

//export cxl_topk_resolve
func cxl_topk_resolve(h C.uint64_t, layer C.int, reqs, seqLens *C.int64_t, batch C.int64_t, sel, out *C.int32_t, where C.int,
	step *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_topk_resolve", errbuf, errlen, &code)
	err := func() error {
		p, done, err := use[*topkPool](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		k := p.Config().TopK
		rs, lens, err := stepAt(unsafe.Pointer(reqs), unsafe.Pointer(seqLens), int64(batch), p.Config().MaxRequests)
		if err != nil {
			return err
		}
		n := len(rs) * k
		if n > 0 && (sel == nil || out == nil) {
			return fmt.Errorf("topk resolve: %w: no selections or no output for %d requests", errBadArg, len(rs))
		}
		var st topk.Step
		switch where {
		case onHost:
			st, err = p.Resolve(int(layer), rs, lens, int32sAt(unsafe.Pointer(sel), n), int32sAt(unsafe.Pointer(out), n))
		case onDevice:
			st, err = p.resolveDevice(int(layer), rs, lens, uintptr(unsafe.Pointer(sel)), uintptr(unsafe.Pointer(out)), n)
		default:
			err = fmt.Errorf("topk resolve: %w: memory kind %d (0 host, 1 device)", errBadArg, where)
		}
		if err == nil && step != nil {
			copy(unsafe.Slice((*int64)(unsafe.Pointer(step)), 5),
				[]int64{int64(st.Hits), int64(st.Misses), int64(st.Fills), int64(st.Newest), st.Bytes})
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

// resolveDevice resolves a step whose selections and output are n int32
// each in GPU memory. With engine planning (the default on a GPU) the
// kernels read and write them in place; otherwise it reads the selections
// (after every call before it on the stream), plans on the host, gathers
// and writes the output back.
func (p *topkPool) resolveDevice(layer int, reqs []int, lens []int64, sel, out uintptr, n int) (topk.Step, error) {
	if n == 0 {
		return p.Resolve(layer, reqs, lens, nil, nil)
	}
	selBuf, err := p.wrap(sel, int64(n)*4)
	if err != nil {
		return topk.Step{}, err
	}
	outBuf, err := p.wrap(out, int64(n)*4)
	if err != nil {
		return topk.Step{}, err
	}
	if p.Planner() == topk.PlanEngine { // the selections never leave the GPU
		return p.ResolveIn(layer, reqs, lens, kernels.Span{Buf: selBuf}, kernels.Span{Buf: outBuf})
	}
	p.stage.Lock()
	defer p.stage.Unlock()
	p.hostTopK, p.hostOut = grow(p.hostTopK, n), grow(p.hostOut, n)
	if err := p.eng.Download(kernels.AsBytes(p.hostTopK), selBuf, 0); err != nil {
		return topk.Step{}, fmt.Errorf("topk resolve: read selections: %w", err)
	}
	st, err := p.Resolve(layer, reqs, lens, p.hostTopK, p.hostOut)
	if err != nil {
		return st, err
	}
	if err := p.eng.Upload(outBuf, 0, kernels.AsBytes(p.hostOut)); err != nil {
		return st, fmt.Errorf("topk resolve: write slots: %w", err)
	}
	return st, nil
}

func grow(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}

//export cxl_topk_buffer
func cxl_topk_buffer(h C.uint64_t, layer C.int, ptr *C.uint64_t, size, rowBytes, rowsPerRequest *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_topk_buffer", errbuf, errlen, &code)
	err := func() error {
		p, buf, done, err := topkBuffer(h, layer)
		if err != nil {
			return err
		}
		defer done.Done()
		dp, ok := buf.(kernels.DeviceBuffer)
		if !ok {
			return fmt.Errorf("topk buffer: %w: the %s engine's buffer is host memory owned by Go; read slots with cxl_topk_read (Python: TopKPool.read_slot)", errBadArg, p.eng.Name())
		}
		if ptr == nil || size == nil || rowBytes == nil || rowsPerRequest == nil {
			return fmt.Errorf("topk buffer: %w: no outputs", errBadArg)
		}
		*ptr, *size = C.uint64_t(dp.DevicePtr()), C.int64_t(buf.Len())
		*rowBytes, *rowsPerRequest = C.int64_t(p.Config().EntryBytes), C.int64_t(p.Config().Slots+1)
		return nil
	}()
	return report(err, errbuf, errlen)
}

// topkBuffer is pool h and its layer's buffer, with the tier's guard
// entered until done.
func topkBuffer(h C.uint64_t, layer C.int) (p *topkPool, buf kernels.Buffer, done tier.Hold, err error) {
	p, done, err = use[*topkPool](uint64(h))
	if err != nil {
		return nil, nil, tier.Hold{}, err
	}
	if layer < 0 || int(layer) >= p.Config().Layers {
		done.Done()
		return nil, nil, tier.Hold{}, fmt.Errorf("topk: %w: layer %d of %d", errBadArg, layer, p.Config().Layers)
	}
	return p, p.Buffer(int(layer)), done, nil
}

//export cxl_topk_read
func cxl_topk_read(h C.uint64_t, layer, req, slot C.int, out unsafe.Pointer, outCap C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_topk_read", errbuf, errlen, &code)
	err := func() error {
		p, buf, done, err := topkBuffer(h, layer)
		if err != nil {
			return err
		}
		defer done.Done()
		c := p.Config()
		if out == nil || int64(outCap) < c.EntryBytes || req < 0 || int(req) >= c.MaxRequests || slot < 0 || int(slot) > c.Slots {
			return fmt.Errorf("topk read: %w: request %d slot %d (of %d+1), room for %d of %d bytes", errBadArg, req, slot, c.Slots, outCap, c.EntryBytes)
		}
		return p.eng.Download(unsafe.Slice((*byte)(out), int(c.EntryBytes)), buf, p.Row(int(req), int(slot))*c.EntryBytes)
	}()
	return report(err, errbuf, errlen)
}

//export cxl_topk_stats
func cxl_topk_stats(h C.uint64_t, buf *C.char, bufCap C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_topk_stats", errbuf, errlen, &code)
	err := func() error {
		p, done, err := use[*topkPool](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		raw, _ := json.Marshal(struct {
			topk.Stats
			Planner string `json:"planner"`
		}{p.Stats(), p.Planner().String()})
		return copyString(raw, buf, bufCap)
	}()
	return report(err, errbuf, errlen)
}
