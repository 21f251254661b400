package main

// #include <stdint.h>
import "C"

import (
	"errors"
	"fmt"
	"github.com/cxltier/cxltier/tier"
	"sync"
	"unsafe"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/prefix"
)

// A KV pool is an inference engine's paged KV buffers (SGLang's device
// pools: K and V of every layer) bound to a prefix index: pages move
// between the buffers and the index's blocks with the tier's gather engine,
// a whole page per entry on store and a layer at a time on load (SGLang's
// unified-cache linker, cxltier.sglang.linker).

// kvPool is an open KV pool.
type kvPool struct {
	child
	index    uint64 // the prefix index's handle, checked open by every call
	a        *attached
	se       *sharedEngine
	mover    *prefix.Mover
	layout   prefix.Layout
	perLayer int
	// mu orders stores and load starts against close: the buffers are the
	// caller's and must not be used after it closed the pool, so closing
	// it closes its loads first.
	mu     sync.Mutex
	closed bool
	loads  map[uint64]*kvLoad
}

func (p *kvPool) shut() error {
	p.mu.Lock()
	p.closed = true
	loads := p.loads
	p.loads = nil
	p.mu.Unlock()
	for h, l := range loads {
		// Abandoned: what a load reports (stopped early, or damaged) is
		// for the caller of its layers, not the pool's.
		l.mu.Lock()
		_ = handles.closeChild(h, l.child)
		l.mu.Unlock()
	}
	return errors.Join(p.mover.Close(), p.a.engines.release(p.se))
}

// whileOpen runs fn under the pool's lock if the pool is still open: the
// buffers fn reaches are the caller's, gone once it closed the pool.
func (p *kvPool) whileOpen(fn func() error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("kv pool: %w", errBadHandle)
	}
	return fn()
}

// forget drops a closed load from the pool's set.
func (p *kvPool) forget(h uint64) {
	p.mu.Lock()
	delete(p.loads, h)
	p.mu.Unlock()
}

// kvLoad is a layer-wise load started on a pool; it pins its entries
// until closed (or until its tier is detached).
type kvLoad struct {
	child
	*prefix.LayerLoad
	mu sync.Mutex // one layer at a time
}

// kvPoolSpec is a pool's buffers as the caller gave them.
type kvPoolSpec struct {
	ptrs       []unsafe.Pointer // layer-major: perLayer buffers per layer
	lens       []int64
	perLayer   int
	chunkBytes int64
	pageStride int64
	where      int
}

// check refuses a malformed spec before any buffer is wrapped.
func (sp kvPoolSpec) check() error {
	n := len(sp.ptrs)
	if n == 0 || sp.perLayer <= 0 || n%sp.perLayer != 0 {
		return fmt.Errorf("kv pool: %w: %d buffers in layers of %d", errBadArg, n, sp.perLayer)
	}
	if sp.chunkBytes <= 0 || sp.chunkBytes > maxBuffer || sp.pageStride < sp.chunkBytes || sp.pageStride > maxBuffer {
		return fmt.Errorf("kv pool: %w: %d-byte chunks %d bytes apart", errBadArg, sp.chunkBytes, sp.pageStride)
	}
	for i, p := range sp.ptrs {
		if p == nil || sp.lens[i] < sp.chunkBytes || sp.lens[i] > maxBuffer {
			return fmt.Errorf("kv pool: %w: buffer %d: %d bytes at %p", errBadArg, i, sp.lens[i], p)
		}
	}
	if sp.where != onHost && sp.where != onDevice {
		return fmt.Errorf("kv pool: %w: memory kind %d (0 host, 1 device)", errBadArg, sp.where)
	}
	return nil
}

// wrap makes each caller buffer a buffer of eng, without a copy.
func (sp kvPoolSpec) wrap(eng kernels.Engine) ([]kernels.Span, error) {
	spans := make([]kernels.Span, len(sp.ptrs))
	for i, p := range sp.ptrs {
		var b kernels.Buffer
		var err error
		switch w := eng.(type) {
		case kernels.HostWrapper:
			if sp.where != onHost {
				return nil, fmt.Errorf("kv pool: %w: the %s engine moves host memory; device buffers need a cuda engine", errBadArg, eng.Name())
			}
			b, err = w.WrapHost(unsafe.Slice((*byte)(p), int(sp.lens[i])))
		case kernels.DeviceWrapper:
			if sp.where != onDevice {
				return nil, fmt.Errorf("kv pool: %w: the %s engine moves device memory; host buffers need the cpu engine", errBadArg, eng.Name())
			}
			b, err = w.WrapDevice(uintptr(p), sp.lens[i])
		default:
			return nil, fmt.Errorf("kv pool: %w: the %s engine cannot reach caller buffers", errBadArg, eng.Name())
		}
		if err != nil {
			return nil, fmt.Errorf("kv pool: buffer %d: %w", i, err)
		}
		spans[i] = kernels.Span{Buf: b}
	}
	return spans, nil
}

//export cxl_kvpool_open
func cxl_kvpool_open(ix C.uint64_t, engine *C.char, stream C.uint64_t, nbufs, perLayer C.int64_t, ptrs *unsafe.Pointer, lens *C.int64_t,
	chunkBytes, pageStride C.int64_t, where, verify C.int, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_kvpool_open", errbuf, errlen, &code)
	err := func() error {
		if out == nil || nbufs <= 0 || nbufs > maxKeys || ptrs == nil || lens == nil {
			return fmt.Errorf("kv pool open: %w: %d buffers, output %p", errBadArg, nbufs, out)
		}
		sp := kvPoolSpec{ptrs: unsafe.Slice(ptrs, int(nbufs)), lens: unsafe.Slice((*int64)(unsafe.Pointer(lens)), int(nbufs)),
			perLayer: int(perLayer), chunkBytes: int64(chunkBytes), pageStride: int64(pageStride), where: int(where)}
		p, err := openKVPool(uint64(ix), C.GoString(engine), uintptr(stream), sp, verify != 0)
		if err != nil {
			return err
		}
		*out = C.uint64_t(p.handle)
		return nil
	}()
	return report(err, errbuf, errlen)
}

func openKVPool(ixh uint64, engine string, stream uintptr, sp kvPoolSpec, verify bool) (*kvPool, error) {
	if err := sp.check(); err != nil {
		return nil, err
	}
	ix, done, err := use[*index](ixh)
	if err != nil {
		return nil, err
	}
	defer done.Done()
	a, err := tierOf(ix.tier)
	if err != nil {
		return nil, err
	}
	se, err := a.engines.acquire(engine, stream, a.r.NumDevices(), a.r.Device)
	if err != nil {
		return nil, err
	}
	spans, err := sp.wrap(se.eng)
	var mover *prefix.Mover
	if err == nil {
		mover, err = prefix.NewMover(ix.Store, se.eng, se.ids)
	}
	if err != nil {
		return nil, errors.Join(err, a.engines.release(se))
	}
	mover.Verify = verify
	if _, device := se.eng.(kernels.DeviceWrapper); device {
		mover.FirstToken = a.firstToken // see cxl_kvpool_first_token
	}
	p := &kvPool{index: ixh, a: a, se: se, mover: mover, perLayer: sp.perLayer, loads: map[uint64]*kvLoad{},
		layout: prefix.Layout{ChunkBytes: sp.chunkBytes, Chunks: spans, PageStride: sp.pageStride}}
	p.child = child{tier: ix.tier, close: p.shut}
	p.handle = handles.addChild(a, p, p.child)
	return p, nil
}

//export cxl_kvpool_close
func cxl_kvpool_close(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_kvpool_close", errbuf, errlen, &code)
	p, done, err := use[*kvPool](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	return report(handles.closeChild(uint64(h), p.child), errbuf, errlen)
}

// A KV pool's loads are first-token transfers on the tier's link
// (tier/link: stores, write-behind and fills wait for them) by default on
// a GPU's engine only. There the copies of every process queue first in,
// first out on one PCIe link, so a burst of stores delays a request's
// load by its whole length. On the CPU engine the link is the host's cores
// and memory, and a load that wakes gets a core of its own: bench/link
// -with ttft measured on 2 cores that a request's load beside two KV
// processes and a fill takes what it takes alone at the median with or
// without the class, while the stores and fills waiting for the loads
// kept 0.48-0.87x of their throughput (bench/results/link-cpu-ttft*.json).
// cxl_kvpool_first_token turns the class on or off for one pool.

// cxl_kvpool_first_token makes the pool's loads first-token transfers on
// the tier's link (loads > 0) or bulk (loads == 0; below 0: as they are,
// the engine's default), and with stores != 0 its stores take the class
// of its loads (a prefill's pages, which its decode's first token waits
// on).
//
//export cxl_kvpool_first_token
func cxl_kvpool_first_token(h C.uint64_t, loads, stores C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_kvpool_first_token", errbuf, errlen, &code)
	p, done, err := use[*kvPool](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	return report(p.firstToken(int(loads), stores != 0), errbuf, errlen)
}

// firstToken sets the class of the pool's loads (loads > 0: first-token,
// 0: bulk, below 0: unchanged) and whether its stores take theirs.
func (p *kvPool) firstToken(loads int, stores bool) error {
	return p.whileOpen(func() error {
		switch {
		case loads > 0:
			p.mover.FirstToken = p.a.firstToken
		case loads == 0:
			p.mover.FirstToken = nil
		}
		p.mover.FirstTokenStores = stores
		return nil
	})
}

// poolPages is the start of the keyed pool calls: the pool, its n keys and
// their n pages, with the tier's guard entered until done (never nil), and
// the pool's index checked still open.
func poolPages(h C.uint64_t, keys *C.uint8_t, n C.int64_t, pages *C.int64_t) (*kvPool, []prefix.Key, []int64, tier.Hold, error) {
	p, done, err := use[*kvPool](uint64(h))
	if err != nil {
		return nil, nil, nil, tier.Hold{}, err
	}
	if _, err := indexOf(p.index); err != nil {
		return nil, nil, nil, done, fmt.Errorf("kv pool: its prefix index: %w", err)
	}
	ks, err := keysArg(keys, n)
	if err != nil {
		return nil, nil, nil, done, err
	}
	if n > 0 && pages == nil {
		return nil, nil, nil, done, fmt.Errorf("kv pool: %w: %d keys without pages", errBadArg, n)
	}
	return p, ks, int64sAt(unsafe.Pointer(pages), int64(n)), done, nil
}

// cxl_kvpool_store stores page pages[i] of the pool under keys[i], a whole
// page per entry, with one scatter launch; statuses as cxl_prefix_set's.
//
//export cxl_kvpool_store
func cxl_kvpool_store(h C.uint64_t, keys *C.uint8_t, n C.int64_t, pages *C.int64_t, statuses *C.int8_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_kvpool_store", errbuf, errlen, &code)
	err := func() error {
		p, ks, pg, done, err := poolPages(h, keys, n, pages)
		defer done.Done()
		if err != nil || len(ks) == 0 {
			return err
		}
		return p.whileOpen(func() error {
			st, err := p.mover.Put(ks, p.layout, pg)
			writeStatuses(statuses, n, st)
			if ix, ierr := indexOf(p.index); ierr == nil {
				ix.stored(ks, st)
			}
			return err
		})
	}()
	return report(err, errbuf, errlen)
}

// cxl_kvpool_get lands the entries of keys in pages[i], all of them or
// none (CXL_ENOTFOUND when one is not in the index, before anything is
// copied), each page whole, with one gather launch for the batch: a load
// with no model to overlap layer by layer (a prefill's pages landing in a
// decode). The pages' checksums are compared as they land: CXL_ECHECKSUM
// means a page was damaged (every damaged page's entry is dropped) and
// what landed must not be used.
//
//export cxl_kvpool_get
func cxl_kvpool_get(h C.uint64_t, keys *C.uint8_t, n C.int64_t, pages *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_kvpool_get", errbuf, errlen, &code)
	err := func() error {
		p, ks, pg, done, err := poolPages(h, keys, n, pages)
		defer done.Done()
		if err != nil {
			return err
		}
		if len(ks) == 0 {
			return fmt.Errorf("kv pool get: %w: %d keys", errBadArg, n)
		}
		return p.whileOpen(func() error { return p.mover.GetAll(ks, p.layout, pg) })
	}()
	return report(err, errbuf, errlen)
}

// cxl_kvpool_load_start pins the entries of keys, all of them or none
// (CXL_ENOTFOUND when one is gone), to land in pages[i]; the load then
// goes a layer at a time (cxl_kvpool_load_layer) and is closed with
// cxl_kvpool_load_close.
//
//export cxl_kvpool_load_start
func cxl_kvpool_load_start(h C.uint64_t, keys *C.uint8_t, n C.int64_t, pages *C.int64_t, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_kvpool_load_start", errbuf, errlen, &code)
	err := func() error {
		p, ks, pg, done, err := poolPages(h, keys, n, pages)
		defer done.Done()
		if err != nil {
			return err
		}
		if out == nil || len(ks) == 0 {
			return fmt.Errorf("kv pool load: %w: %d keys, output %p", errBadArg, n, out)
		}
		l, err := p.startLoad(ks, pg)
		if err == nil {
			*out = C.uint64_t(l)
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

// startLoad pins the entries of keys for a layer-wise load into pages and
// returns the load's handle.
func (p *kvPool) startLoad(ks []prefix.Key, pg []int64) (uint64, error) {
	var h uint64
	err := p.whileOpen(func() error {
		ld, err := p.mover.StartLoad(ks, p.layout, p.perLayer, pg)
		if err != nil {
			return err
		}
		l := &kvLoad{LayerLoad: ld}
		l.child = child{tier: p.tier, close: func() error { p.forget(l.handle); return ld.Close() }}
		l.handle = handles.addChild(p.a, l, l.child)
		p.loads[l.handle] = l
		h = l.handle
		return nil
	})
	return h, err
}

// cxl_kvpool_load_layer copies layer `layer` of every page of the load
// (layers in order from 0) and returns once it has landed; the next
// layer's copy is queued before the wait, so the load's pages are written
// until cxl_kvpool_load_close, which waits for it. After the last
// layer the pages' checksums are compared: CXL_ECHECKSUM means a page was
// damaged (its entry is dropped) and what landed must not be used.
//
//export cxl_kvpool_load_layer
func cxl_kvpool_load_layer(h C.uint64_t, layer C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_kvpool_load_layer", errbuf, errlen, &code)
	err := func() error {
		l, done, err := use[*kvLoad](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.Layer(int(layer))
	}()
	return report(err, errbuf, errlen)
}

// cxl_kvpool_load_close releases the load's pins and reports its failure,
// or CXL_EINVAL when it stopped before its last layer.
//
//export cxl_kvpool_load_close
func cxl_kvpool_load_close(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_kvpool_load_close", errbuf, errlen, &code)
	l, done, err := use[*kvLoad](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	l.mu.Lock()
	defer l.mu.Unlock()
	return report(handles.closeChild(uint64(h), l.child), errbuf, errlen)
}
