package main

// #include <stdint.h>
import "C"

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/cxltier/cxltier/prefix"
)

// Pages of SGLang host pools lie in pieces (one per layer in a layer-first
// pool), and their keys are SGLang's hex digests: these calls store, load
// and name such pages without a staging copy and without a hash per key.

//export cxl_prefix_setv
func cxl_prefix_setv(h C.uint64_t, keys *C.uint8_t, n, per C.int64_t, ptrs *unsafe.Pointer, sizes *C.int64_t, statuses *C.int8_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_setv", errbuf, errlen, &code)
	err := func() error {
		s, ks, done, err := indexKeys(h, keys, n)
		defer done.Done()
		if err != nil {
			return err
		}
		pieces, err := piecesArg(ptrs, sizes, n, per)
		if err != nil {
			return err
		}
		st, err := s.SetPieces(ks, pieces)
		writeStatuses(statuses, n, st)
		s.stored(ks, st)
		return err
	}()
	return report(err, errbuf, errlen)
}

//export cxl_prefix_getv
func cxl_prefix_getv(h C.uint64_t, keys *C.uint8_t, n, per C.int64_t, ptrs *unsafe.Pointer, sizes *C.int64_t, served *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_getv", errbuf, errlen, &code)
	err := func() error {
		s, ks, done, err := indexKeys(h, keys, n)
		defer done.Done()
		if err != nil {
			return err
		}
		if served == nil {
			return fmt.Errorf("prefix getv: %w: no output count", errBadArg)
		}
		pieces, err := piecesArg(ptrs, sizes, n, per)
		if err != nil {
			return err
		}
		got, err := s.GetPieces(ks, pieces)
		if err == nil && s.fillMissing(ks, got) {
			more, merr := s.GetPieces(ks[got:], pieces[got:])
			got, err = got+more, merr
		}
		*served = C.int64_t(got)
		return err
	}()
	return report(err, errbuf, errlen)
}

// piecesArg views n keys' buffers, per pieces each, key-major.
func piecesArg(ptrs *unsafe.Pointer, sizes *C.int64_t, n, per C.int64_t) ([][][]byte, error) {
	return piecesAt(unsafe.Pointer(ptrs), unsafe.Pointer(sizes), int64(n), int64(per))
}

//export cxl_prefix_part_keys
func cxl_prefix_part_keys(text *C.char, ends *C.int64_t, n C.int64_t, masks *C.uint8_t, nMasks C.int64_t, out *C.uint8_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_part_keys", errbuf, errlen, &code)
	err := func() error {
		pages, err := stringsAt(unsafe.Pointer(text), unsafe.Pointer(ends), int64(n))
		if err != nil {
			return err
		}
		return partKeys(pages, masks, nMasks, out)
	}()
	return report(err, errbuf, errlen)
}

// cxl_prefix_part_keys_joined is cxl_prefix_part_keys for n page strings
// given joined by NUL bytes (text_len bytes in all), which a caller builds
// in one step where an array of ends costs it a loop: HiCache's Python
// backend, 30k pages a batch. A text that splits into other than n strings
// (a page holding a NUL) is refused with CXL_EINVAL; the caller then uses
// the call with ends.
//
//export cxl_prefix_part_keys_joined
func cxl_prefix_part_keys_joined(text *C.char, textLen C.int64_t, n C.int64_t, masks *C.uint8_t, nMasks C.int64_t, out *C.uint8_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_part_keys_joined", errbuf, errlen, &code)
	err := withJoined(unsafe.Pointer(text), int64(textLen), int64(n), func(pages []string) error {
		return partKeys(pages, masks, nMasks, out)
	})
	return report(err, errbuf, errlen)
}

// cxl_prefix_exists_pages is how many leading pages (n strings joined by
// NUL bytes, as for cxl_prefix_part_keys_joined) have every part (each of
// n_masks masks) stored: HiCache's batch_exists in one call that derives
// each key as it probes and stops at the first page missing a part.
//
//export cxl_prefix_exists_pages
func cxl_prefix_exists_pages(h C.uint64_t, text *C.char, textLen C.int64_t, n C.int64_t, masks *C.uint8_t, nMasks C.int64_t, leading *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_exists_pages", errbuf, errlen, &code)
	err := func() error {
		s, done, err := use[*index](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		ms, err := keysAt(unsafe.Pointer(masks), int64(nMasks))
		if err != nil {
			return err
		}
		if leading == nil || len(ms) == 0 {
			return fmt.Errorf("prefix exists pages: %w: %d masks, leading %p", errBadArg, len(ms), leading)
		}
		return withJoined(unsafe.Pointer(text), int64(textLen), int64(n), func(pages []string) error {
			got, err := s.existsPages(pages, ms)
			*leading = C.int64_t(got)
			return err
		})
	}()
	return report(err, errbuf, errlen)
}

// pageLists keeps the page-string slices of the joined calls between
// calls (a pool, as the exported calls have nowhere else to keep it): a
// fresh slice of 30k string headers per HiCache batch was most of the cost
// of splitting the text.
var pageLists = sync.Pool{New: func() any { return new([]string) }}

// withJoined calls fn with the n NUL-joined strings at text, in a slice
// from pageLists, cleared afterwards: its strings point into the caller's
// memory, which is gone once the call returns, and the garbage collector
// must not meet them later.
func withJoined(text unsafe.Pointer, textLen, n int64, fn func(pages []string) error) error {
	list := pageLists.Get().(*[]string)
	defer pageLists.Put(list)
	pages, err := joinedAt((*list)[:0], text, textLen, n)
	if err == nil {
		err = fn(pages)
	}
	clear(pages)
	*list = pages[:0]
	return err
}

// partKeys writes the part keys of pages under the caller's masks to out.
func partKeys(pages []string, masks *C.uint8_t, nMasks C.int64_t, out *C.uint8_t) error {
	ms, err := keysAt(unsafe.Pointer(masks), int64(nMasks))
	if err != nil {
		return err
	}
	n := int64(len(pages))
	if n*int64(nMasks) > maxKeys || (n > 0 && nMasks > 0 && out == nil) {
		return fmt.Errorf("prefix part keys: %w: %d pages × %d parts", errBadArg, n, nMasks)
	}
	dst, err := keysAt(unsafe.Pointer(out), n*int64(nMasks))
	if err != nil {
		return err
	}
	if err := prefix.PartKeys(dst, pages, ms); err != nil {
		return fmt.Errorf("%w: %v", errBadArg, err)
	}
	return nil
}

// writeStatuses copies each key's insert status to the caller's array.
func writeStatuses(statuses *C.int8_t, n C.int64_t, st []prefix.Status) {
	if statuses == nil || len(st) == 0 {
		return
	}
	out := unsafe.Slice((*int8)(unsafe.Pointer(statuses)), int(n))
	for i, x := range st {
		out[i] = int8(x)
	}
}
