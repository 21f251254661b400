package main

// #include <stdint.h>
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

//export cxl_prefix_open
func cxl_prefix_open(h C.uint64_t, name, key *C.char, blocks, blockBytes C.int64_t, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_open", errbuf, errlen, &code)
	k := ""
	if key != nil {
		k = C.GoString(key)
	}
	if out == nil {
		return report(fmt.Errorf("prefix open: %w: no output handle", errBadArg), errbuf, errlen)
	}
	ix, err := prefixOpen(uint64(h), C.GoString(name), k, int64(blocks), int64(blockBytes))
	if err == nil {
		*out = C.uint64_t(ix)
	}
	return report(err, errbuf, errlen)
}

// prefixOpen opens (or, with blocks > 0, creates) an index on tier h and
// returns its handle.
func prefixOpen(h uint64, name, key string, blocks, blockBytes int64) (uint64, error) {
	a, done, err := use[*attached](uint64(h))
	if err != nil {
		return 0, err
	}
	defer done.Done()
	open := func() (*prefix.Store, error) { return prefix.OpenKey(a.c, name, key) }
	create := func() (*prefix.Store, error) {
		return prefix.Create(a.c, prefix.Config{Name: name, Blocks: blocks, BlockBytes: blockBytes, Key: key})
	}
	if blocks <= 0 {
		create = nil
	}
	s, err := openOrCreate(open, create, createRaceWait)
	if err != nil {
		return 0, err
	}
	ix := &index{Store: s, child: child{tier: h, close: s.Close}, link: a.uplink()}
	return handles.addChild(a, ix, ix.child), nil
}

// openOrCreate opens an index, or creates it when it is missing and create
// is given. Processes that start together (a prefill and a decode worker)
// may both find it missing and both create it: the second then fails,
// with ErrExists or, when the first one's blocks took the space it
// needed, with ErrNoSpace. Either way it opens the index the first made,
// and reports its own failure only when there is none.
func openOrCreate(open, create func() (*prefix.Store, error), wait time.Duration) (*prefix.Store, error) {
	s, err := open()
	if !errors.Is(err, tier.ErrNotFound) || create == nil {
		return s, err
	}
	s, err = create()
	if err == nil {
		return s, nil
	}
	// The first creator formats the index before it names it: for a large
	// index that takes a while, during which its space is taken and its
	// name not yet there. A bounded wait, then the creator's own error.
	deadline := time.Now().Add(wait)
	for {
		if again, oerr := open(); oerr == nil {
			return again, nil
		}
		if !errors.Is(err, tier.ErrExhausted) || time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// createRaceWait bounds how long a creator that found no space waits for
// another process's index of the same name to appear.
const createRaceWait = 5 * time.Second

//export cxl_prefix_close
func cxl_prefix_close(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_close", errbuf, errlen, &code)
	ix, done, err := use[*index](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	return report(handles.closeChild(uint64(h), ix.child), errbuf, errlen)
}

// keysArg views n 32-byte keys at p.
func keysArg(p *C.uint8_t, n C.int64_t) ([]prefix.Key, error) {
	return keysAt(unsafe.Pointer(p), int64(n))
}

//export cxl_prefix_keys
func cxl_prefix_keys(pageSize C.int, tokens *C.int64_t, n C.int64_t, prior *C.uint8_t, out *C.uint8_t, outCap C.int64_t, nKeys *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_keys", errbuf, errlen, &code)
	return report(prefixKeys(int(pageSize), tokens, n, prior, out, outCap, nKeys), errbuf, errlen)
}

func prefixKeys(pageSize int, tokens *C.int64_t, n C.int64_t, prior, out *C.uint8_t, outCap C.int64_t, nKeys *C.int64_t) error {
	if n < 0 || (n > 0 && tokens == nil) || nKeys == nil {
		return fmt.Errorf("prefix keys: %w: %d tokens", errBadArg, n)
	}
	var ids []int64
	if n > 0 {
		ids = unsafe.Slice((*int64)(unsafe.Pointer(tokens)), int(n))
	}
	var parent *prefix.Key
	if prior != nil {
		k := *(*prefix.Key)(unsafe.Pointer(prior))
		parent = &k
	}
	keys, err := prefix.PageKeys(parent, ids, pageSize)
	if err != nil {
		return err
	}
	return putKeys("prefix keys", keys, out, outCap, nKeys)
}

// putKeys writes keys to the caller's out (room for outCap keys) and their
// count to n; with too little room, the count only, and a range error the
// caller can grow out from.
func putKeys(what string, keys []prefix.Key, out *C.uint8_t, outCap C.int64_t, n *C.int64_t) error {
	*n = C.int64_t(len(keys))
	if int64(len(keys)) > int64(outCap) {
		return fmt.Errorf("%s: %w: %d keys, room for %d", what, errRange, len(keys), outCap)
	}
	dst, err := keysArg(out, C.int64_t(len(keys)))
	if err != nil {
		return err
	}
	copy(dst, keys)
	return nil
}

// indexKeys is the start of every keyed call: the index and its n keys,
// with the tier's guard entered until done (never nil).
func indexKeys(h C.uint64_t, keys *C.uint8_t, n C.int64_t) (*index, []prefix.Key, tier.Hold, error) {
	s, done, err := use[*index](uint64(h))
	if err != nil {
		return nil, nil, tier.Hold{}, err
	}
	ks, err := keysArg(keys, n)
	return s, ks, done, err
}

//export cxl_prefix_exists
func cxl_prefix_exists(h C.uint64_t, keys *C.uint8_t, n C.int64_t, leading *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_exists", errbuf, errlen, &code)
	err := func() error {
		s, ks, done, err := indexKeys(h, keys, n)
		defer done.Done()
		if s == nil {
			return err
		}
		if err != nil || leading == nil {
			return errors.Join(err, fmt.Errorf("prefix exists: %w", errBadArg))
		}
		*leading = C.int64_t(s.exists(ks))
		return nil
	}()
	return report(err, errbuf, errlen)
}

// cxl_prefix_verify_reads sets whether gets through this handle check each
// payload against its checksum (on: nonzero, the default).
//
//export cxl_prefix_verify_reads
func cxl_prefix_verify_reads(h C.uint64_t, on C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_verify_reads", errbuf, errlen, &code)
	s, done, err := use[*index](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	s.VerifyReads(on != 0)
	return report(nil, errbuf, errlen)
}

// buffersArg views n caller buffers: ptrs[i] with sizes[i] bytes.
func buffersArg(ptrs *unsafe.Pointer, sizes *C.int64_t, n C.int64_t) ([][]byte, error) {
	return buffersAt(unsafe.Pointer(ptrs), unsafe.Pointer(sizes), int64(n))
}

//export cxl_prefix_set
func cxl_prefix_set(h C.uint64_t, keys *C.uint8_t, n C.int64_t, ptrs *unsafe.Pointer, sizes *C.int64_t, statuses *C.int8_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_set", errbuf, errlen, &code)
	err := func() error {
		s, ks, done, err := indexKeys(h, keys, n)
		defer done.Done()
		if err != nil {
			return err
		}
		bufs, err := buffersArg(ptrs, sizes, n)
		if err != nil {
			return err
		}
		st, err := s.Set(ks, bufs)
		writeStatuses(statuses, n, st)
		s.stored(ks, st)
		return err
	}()
	return report(err, errbuf, errlen)
}

//export cxl_prefix_get
func cxl_prefix_get(h C.uint64_t, keys *C.uint8_t, n C.int64_t, ptrs *unsafe.Pointer, caps, lens *C.int64_t, served *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_get", errbuf, errlen, &code)
	err := func() error {
		s, ks, done, err := indexKeys(h, keys, n)
		defer done.Done()
		if s == nil {
			return err
		}
		if err != nil || served == nil {
			return errors.Join(err, fmt.Errorf("prefix get: %w", errBadArg))
		}
		bufs, err := buffersArg(ptrs, caps, n)
		if err != nil {
			return err
		}
		got, err := s.Get(ks, bufs)
		if err == nil && s.fillMissing(ks, got) {
			more, merr := s.Get(ks[got:], bufs[got:])
			got, err = got+more, merr
		}
		*served = C.int64_t(got)
		if lens != nil {
			out := unsafe.Slice((*int64)(unsafe.Pointer(lens)), int(n))
			for i := range got {
				out[i] = int64(len(bufs[i]))
			}
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

//export cxl_prefix_delete
func cxl_prefix_delete(h C.uint64_t, keys *C.uint8_t, n C.int64_t, deleted *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_delete", errbuf, errlen, &code)
	err := func() error {
		s, ks, done, err := indexKeys(h, keys, n)
		defer done.Done()
		if err != nil {
			return err
		}
		d, err := s.Delete(ks)
		if deleted != nil {
			*deleted = C.int64_t(d)
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

//export cxl_prefix_stats
func cxl_prefix_stats(h C.uint64_t, buf *C.char, bufCap C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_stats", errbuf, errlen, &code)
	err := func() error {
		s, done, err := use[*index](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		raw, _ := json.Marshal(s.statsWithLink())
		return copyString(raw, buf, bufCap)
	}()
	return report(err, errbuf, errlen)
}

// copyString writes raw and a NUL into the caller's buffer.
func copyString(raw []byte, buf *C.char, n C.int) error {
	if buf == nil || int(n) < len(raw)+1 {
		return fmt.Errorf("%w: %d bytes needed", errRange, len(raw)+1)
	}
	dst := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	copy(dst, raw)
	dst[len(raw)] = 0
	return nil
}

// cxl_prefix_list writes the keys of the index's ready entries to out (room
// for outCap keys) and their count to n. With too little room it writes
// the count only and fails with a range error, so the caller can grow out
// and ask again.
//
//export cxl_prefix_list
func cxl_prefix_list(h C.uint64_t, out *C.uint8_t, outCap C.int64_t, n *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_list", errbuf, errlen, &code)
	err := func() error {
		s, done, err := use[*index](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if n == nil || outCap < 0 {
			return fmt.Errorf("prefix list: %w", errBadArg)
		}
		keys, err := s.Keys(nil)
		if err != nil {
			return err
		}
		return putKeys("prefix list", keys, out, outCap, n)
	}()
	return report(err, errbuf, errlen)
}

// cxl_prefix_has sets present[i] to 1 when keys[i] has a ready entry, else 0.
//
//export cxl_prefix_has
func cxl_prefix_has(h C.uint64_t, keys *C.uint8_t, n C.int64_t, present *C.int8_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_has", errbuf, errlen, &code)
	err := func() error {
		s, ks, done, err := indexKeys(h, keys, n)
		defer done.Done()
		if s == nil {
			return err
		}
		if err != nil || (n > 0 && present == nil) {
			return errors.Join(err, fmt.Errorf("prefix has: %w", errBadArg))
		}
		have := make([]bool, len(ks))
		if err := s.Has(ks, have); err != nil {
			return err
		}
		out := unsafe.Slice((*int8)(unsafe.Pointer(present)), len(ks))
		for i, ok := range have {
			out[i] = 0
			if ok {
				out[i] = 1
			}
		}
		return nil
	}()
	return report(err, errbuf, errlen)
}

// cxl_prefix_keep pins each key's ready entry (present[i] 1, else 0)
// without reading its payload, so that no eviction takes it until
// cxl_prefix_unpin of *out: a prefill keeps the pages it published for a
// decode until the decode has landed them. The pins count against this
// client's pin table (a full one fails with CXL_ENOSPACE, nothing kept),
// hold the tier until released (a detach waits for them, bounded), and end
// with the client's lease.
//
//export cxl_prefix_keep
func cxl_prefix_keep(h C.uint64_t, keys *C.uint8_t, n C.int64_t, present *C.int8_t, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_keep", errbuf, errlen, &code)
	err := func() error {
		s, ks, done, err := indexKeys(h, keys, n)
		defer done.Done()
		if err != nil {
			return err
		}
		if out == nil || (n > 0 && present == nil) {
			return fmt.Errorf("prefix keep: %w", errBadArg)
		}
		id, err := keepKeys(s, ks, unsafe.Slice((*int8)(unsafe.Pointer(present)), len(ks)))
		if err == nil {
			*out = C.uint64_t(id)
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

// keepKeys pins ks's ready entries of index s, marking which in present,
// and returns the pins' handle, which holds the tier until it is closed.
func keepKeys(s *index, ks []prefix.Key, present []int8) (uint64, error) {
	return holdPins(s, func() ([]prefix.Hit, error) {
		have := make([]bool, len(ks))
		hits, err := s.Keep(ks, have)
		for i, ok := range have {
			present[i] = 0
			if ok {
				present[i] = 1
			}
		}
		return hits, err
	})
}

// cxl_prefix_names writes the names of the tier's prefix indexes to buf,
// each followed by a NUL byte, and the bytes that takes to n. With too
// little room it writes n only and fails with a range error.
//
//export cxl_prefix_names
func cxl_prefix_names(h C.uint64_t, buf *C.char, bufLen C.int64_t, n *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_names", errbuf, errlen, &code)
	err := func() error {
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if n == nil || bufLen < 0 || (bufLen > 0 && buf == nil) {
			return fmt.Errorf("prefix names: %w", errBadArg)
		}
		names, err := prefix.Names(a.c.Region())
		if err != nil {
			return err
		}
		var joined []byte
		for _, name := range names {
			joined = append(append(joined, name...), 0)
		}
		*n = C.int64_t(len(joined))
		if int64(len(joined)) > int64(bufLen) {
			return fmt.Errorf("prefix names: %w: %d bytes, room for %d", errRange, len(joined), bufLen)
		}
		if len(joined) > 0 {
			copy(unsafe.Slice((*byte)(unsafe.Pointer(buf)), len(joined)), joined)
		}
		return nil
	}()
	return report(err, errbuf, errlen)
}
