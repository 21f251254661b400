package main

// #include <stdint.h>
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// prefetcher is an Engram prefetcher over the tables of one geometry, on
// its tier's shared engine.
type prefetcher struct {
	*engram.Prefetcher
	child
	a    *attached
	se   *sharedEngine
	eng  kernels.Engine // se.eng
	g    engram.Geometry
	comp *engram.Compressor // nil: the geometry has no lookup table
}

// shut closes the prefetcher and then lets go of its engine.
func (p *prefetcher) shut() error {
	return errors.Join(p.Prefetcher.Close(), p.a.engines.release(p.se))
}

// cacheOf is prefetcher h and its cache buffer for layer, with the tier's
// guard entered until done.
func cacheOf(h C.uint64_t, layer C.int) (p *prefetcher, buf kernels.Buffer, done tier.Hold, err error) {
	p, done, err = use[*prefetcher](uint64(h))
	if err != nil {
		return nil, nil, tier.Hold{}, err
	}
	if buf, err = p.CacheBuffer(int(layer)); err != nil {
		done.Done()
		return nil, nil, tier.Hold{}, err
	}
	return p, buf, done, nil
}

func geometryOf(spec string) (engram.Geometry, error) {
	if strings.HasPrefix(strings.TrimSpace(spec), "{") {
		return engram.ParseGeometry([]byte(spec))
	}
	return engram.Preset(spec)
}

// cxl_engram_open's flags.
const (
	engramCache    = 1 // keep hot rows across calls
	engramOnEngine = 2 // the engine hashes and keeps the cache's tags
)

func plannerOf(flags C.int) engram.Planner {
	if flags&engramOnEngine != 0 {
		return engram.PlanEngine
	}
	return engram.PlanHost
}

//export cxl_engram_open
func cxl_engram_open(h C.uint64_t, spec, engine *C.char, stream C.uint64_t, slots, flags C.int, deadlineNs C.int64_t, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_engram_open", errbuf, errlen, &code)
	err := func() error {
		if out == nil {
			return fmt.Errorf("engram open: %w: no output handle", errBadArg)
		}
		pf, err := openEngram(uint64(h), C.GoString(spec), C.GoString(engine), uintptr(stream), int(slots), int(flags), time.Duration(deadlineNs))
		if err != nil {
			return err
		}
		*out = C.uint64_t(pf.handle)
		return nil
	}()
	return report(err, errbuf, errlen)
}

// openEngram opens a prefetcher over the loaded tables of spec on tier h
// and returns it under its new handle.
func openEngram(h uint64, spec, engine string, stream uintptr, slots, flags int, deadline time.Duration) (*prefetcher, error) {
	if slots < 1 || flags&^(engramCache|engramOnEngine) != 0 {
		return nil, fmt.Errorf("engram open: %w: %d slots, flags %#x (1 cache, 2 plan on the engine)", errBadArg, slots, flags)
	}
	a, done, err := use[*attached](uint64(h))
	if err != nil {
		return nil, err
	}
	defer done.Done()
	g, err := geometryOf(spec)
	if err != nil {
		return nil, err
	}
	hs, err := engram.NewHasher(g)
	if err != nil {
		return nil, err
	}
	var comp *engram.Compressor
	if g.Lookup != "" {
		if comp, err = engram.LoadCompressor(g); err != nil {
			return nil, err
		}
	}
	var tables []*engram.Table
	for _, l := range g.LayerIDs {
		t, err := engram.OpenTable(a.r, g, hs, l, false)
		if errors.Is(err, tier.ErrNotFound) {
			continue // layers without a loaded table are not prefetched
		}
		if err != nil {
			return nil, err
		}
		tables = append(tables, t)
	}
	if len(tables) == 0 {
		return nil, fmt.Errorf("engram open: %w: no table of %q is loaded in the tier (cxltier engram load)", tier.ErrNotFound, g.Name)
	}
	se, err := a.engines.acquireRows(engine, stream, a.r.NumDevices(), a.r.Device)
	if err != nil {
		return nil, err
	}
	opts := engram.PrefetchOptions{Slots: slots, Cache: flags&engramCache != 0, Planner: plannerOf(C.int(flags)),
		Deadline: deadline, Ranges: se.ids}
	if l := a.claimer(); l != nil && deadline > 0 {
		opts.Link = l // each call claims the node's link until its rows are in
	}
	p, err := engram.NewPrefetcher(se.eng, a.c, hs, tables, opts)
	if err != nil {
		return nil, errors.Join(err, a.engines.release(se))
	}
	pf := &prefetcher{Prefetcher: p, a: a, se: se, eng: se.eng, g: g, comp: comp}
	pf.child = child{tier: h, close: pf.shut}
	pf.handle = handles.addChild(a, pf, pf.child)
	return pf, nil
}

//export cxl_engram_compress
func cxl_engram_compress(h C.uint64_t, ids *C.int64_t, n C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_engram_compress", errbuf, errlen, &code)
	err := func() error {
		p, done, err := use[*prefetcher](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if p.comp == nil {
			return fmt.Errorf("engram compress: %w: geometry %q has no lookup table (set \"lookup\")", errBadArg, p.g.Name)
		}
		if n < 0 || n > maxSeqIDs || (n > 0 && ids == nil) {
			return fmt.Errorf("engram compress: %w: %d ids", errBadArg, n)
		}
		s := int64sAt(unsafe.Pointer(ids), int64(n))
		return p.comp.Compress(s, s)
	}()
	return report(err, errbuf, errlen)
}

//export cxl_engram_close
func cxl_engram_close(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_engram_close", errbuf, errlen, &code)
	p, done, err := use[*prefetcher](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	return report(handles.closeChild(uint64(h), p.child), errbuf, errlen)
}

// sequences splits ids into sequences of lens[i] ids each.
func sequences(ids, lens *C.int64_t, nseq C.int64_t) ([][]int64, error) {
	return sequencesAt(unsafe.Pointer(ids), unsafe.Pointer(lens), int64(nseq))
}

//export cxl_engram_prefetch
func cxl_engram_prefetch(h C.uint64_t, layer C.int, ids, lens *C.int64_t, nseq C.int64_t, histIDs, histLens *C.int64_t,
	slots *C.int32_t, slotsCap C.int64_t, nSlots *C.int64_t, pending *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_engram_prefetch", errbuf, errlen, &code)
	err := func() error {
		p, done, err := use[*prefetcher](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if nSlots == nil || pending == nil {
			return fmt.Errorf("engram prefetch: %w: no outputs", errBadArg)
		}
		seqs, err := sequences(ids, lens, nseq)
		if err != nil {
			return err
		}
		var hist [][]int64
		if histLens != nil {
			if hist, err = sequences(histIDs, histLens, nseq); err != nil {
				return err
			}
		}
		pd, err := p.Prefetch(int(layer), hist, seqs)
		if err != nil {
			return err
		}
		*nSlots = C.int64_t(pd.Rows())
		if int64(pd.Rows()) > int64(slotsCap) || (pd.Rows() > 0 && slots == nil) {
			pd.Wait()
			return fmt.Errorf("engram prefetch: %w: %d slots, room for %d", errRange, pd.Rows(), slotsCap)
		}
		// Slots known now are written now; an engine-planned call's are
		// written by cxl_engram_wait.
		if len(pd.Slots) > 0 {
			copy(unsafe.Slice((*int32)(unsafe.Pointer(slots)), len(pd.Slots)), pd.Slots)
		}
		*pending = C.uint64_t(handles.add(pd))
		return nil
	}()
	return report(err, errbuf, errlen)
}

//export cxl_engram_wait
func cxl_engram_wait(pending C.uint64_t, slots *C.int32_t, slotsCap C.int64_t, readyNs *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_engram_wait", errbuf, errlen, &code)
	err := func() error {
		pd, err := get[*engram.Pending](&handles, uint64(pending))
		if err != nil {
			return err
		}
		if slots != nil && int64(slotsCap) < int64(pd.Rows()) {
			return fmt.Errorf("engram wait: %w: %d slots, room for %d", errRange, pd.Rows(), slotsCap)
		}
		handles.remove(uint64(pending))
		d, err := pd.Wait()
		if readyNs != nil {
			*readyNs = C.int64_t(d)
		}
		if slots != nil && len(pd.Slots) > 0 {
			copy(unsafe.Slice((*int32)(unsafe.Pointer(slots)), len(pd.Slots)), pd.Slots)
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

//export cxl_engram_buffer
func cxl_engram_buffer(h C.uint64_t, layer C.int, ptr *C.uint64_t, size, rowBytes *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_engram_buffer", errbuf, errlen, &code)
	err := func() error {
		p, buf, done, err := cacheOf(h, layer)
		if err != nil {
			return err
		}
		defer done.Done()
		dp, ok := buf.(kernels.DeviceBuffer)
		if !ok {
			return fmt.Errorf("engram buffer: %w: the %s engine's cache is host memory owned by Go; read rows with cxl_engram_read (Python: EngramPrefetcher.read_row)", errBadArg, p.eng.Name())
		}
		if ptr == nil || size == nil || rowBytes == nil {
			return fmt.Errorf("engram buffer: %w: no outputs", errBadArg)
		}
		*ptr, *size, *rowBytes = C.uint64_t(dp.DevicePtr()), C.int64_t(buf.Len()), C.int64_t(p.g.RowBytes)
		return nil
	}()
	return report(err, errbuf, errlen)
}

//export cxl_engram_read
func cxl_engram_read(h C.uint64_t, layer C.int, slot C.int64_t, out unsafe.Pointer, outCap C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_engram_read", errbuf, errlen, &code)
	err := func() error {
		p, buf, done, err := cacheOf(h, layer)
		if err != nil {
			return err
		}
		defer done.Done()
		rb := p.g.RowBytes
		if out == nil || int64(outCap) < rb || slot < 0 || (int64(slot)+1)*rb > buf.Len() {
			return fmt.Errorf("engram read: %w: slot %d, %d-byte rows, room for %d", errBadArg, slot, rb, outCap)
		}
		return p.eng.Download(unsafe.Slice((*byte)(out), int(rb)), buf, int64(slot)*rb)
	}()
	return report(err, errbuf, errlen)
}

//export cxl_engram_stats
func cxl_engram_stats(h C.uint64_t, buf *C.char, bufCap C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_engram_stats", errbuf, errlen, &code)
	err := func() error {
		p, done, err := use[*prefetcher](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		m := p.Metrics()
		raw, _ := json.Marshal(map[string]any{"calls": m.Calls.Load(), "rows": m.Rows.Load(), "hits": m.Hits.Load(),
			"fetched": m.Fetched.Load(), "deadline_misses": m.DeadlineMisses.Load(), "ready_ns": m.ReadyNanos.Load(),
			"layers": p.Layers(), "max_ngram": p.g.MaxNgram, "row_bytes": p.g.RowBytes, "lookup": p.comp != nil, "cache": p.Options().Cache,
			"planner": p.Options().Planner.String()})
		return copyString(raw, buf, bufCap)
	}()
	return report(err, errbuf, errlen)
}
