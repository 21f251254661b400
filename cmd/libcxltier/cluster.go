package main

// #include <stdint.h>
import "C"

import (
	"errors"
	"fmt"
	"os"
	"time"
	"unsafe"

	"github.com/cxltier/cxltier/cluster"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

// The cluster tier, both sides of it. Every index handle asks the node's
// uplink (package cluster) on a local miss and tells it what it stored;
// the uplink itself (sglang/cxltier/uplink.py, one process per node) uses
// the calls at the end of this file to move pages between the cluster
// store and the tier in place.

// newLink is the link of a tier attached in this process to its node's
// uplink: nil when CXLTIER_UPLINK=off (the uplink's own process, which
// must not ask itself) or when CXLTIER_UPLINK_TIMEOUT does not parse.
func newLink(r *tier.Region, c *tier.Client) (*cluster.Link, error) {
	if os.Getenv("CXLTIER_UPLINK") == "off" {
		return nil, nil
	}
	var opts cluster.Options
	if s := os.Getenv("CXLTIER_UPLINK_TIMEOUT"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("attach: %w: CXLTIER_UPLINK_TIMEOUT=%q is not a positive duration (e.g. 500ms)", errBadArg, s)
		}
		opts.Timeout = d
	}
	if r.Anonymous() {
		return nil, nil // one process's tier: no node, no uplink
	}
	addr, err := cluster.Address(r, c.Node())
	if err != nil {
		return nil, fmt.Errorf("attach: the node uplink's socket: %w", err)
	}
	return cluster.NewLink(addr, opts), nil
}

// exists is Exists, with the keys past the local prefix asked of the
// uplink once.
func (ix *index) exists(ks []prefix.Key) int {
	n := ix.Exists(ks)
	if n == len(ks) || ix.link == nil {
		return n
	}
	if got, _ := ix.link.Fill(ix.Name(), ks[n:]); got > 0 {
		n += ix.Exists(ks[n:])
	}
	return n
}

// existsPages is ExistsPages, with every part of the pages past the local
// prefix asked of the uplink once.
func (ix *index) existsPages(pages []string, masks []prefix.Key) (int, error) {
	n := ix.ExistsPages(pages, masks)
	if n == len(pages) || ix.link == nil || len(masks) == 0 {
		return n, nil
	}
	rest := pages[n:min(len(pages), n+cluster.MaxFillKeys/len(masks))]
	if len(rest) == 0 {
		return n, nil
	}
	keys := make([]prefix.Key, len(rest)*len(masks))
	if err := prefix.PartKeys(keys, rest, masks); err != nil {
		return n, err
	}
	if got, _ := ix.link.Fill(ix.Name(), keys); got > 0 {
		n += ix.ExistsPages(pages[n:], masks)
	}
	return n, nil
}

// fillMissing asks the uplink for the keys past the served prefix of a
// get, and reports whether it brought any.
func (ix *index) fillMissing(ks []prefix.Key, served int) bool {
	if ix.link == nil || served >= len(ks) {
		return false
	}
	got, _ := ix.link.Fill(ix.Name(), ks[served:])
	return got > 0
}

// stored hands the keys a call stored to the uplink to write behind.
func (ix *index) stored(ks []prefix.Key, st []prefix.Status) {
	if ix.link == nil || len(st) != len(ks) {
		return
	}
	var out []prefix.Key
	for i, s := range st {
		if s == prefix.Reserved { // published: stored
			out = append(out, ks[i])
		}
	}
	if len(out) > 0 {
		ix.link.Stored(ix.Name(), out)
	}
}

// statsWithLink is the index's statistics, and what this process's link
// to the uplink did (under "uplink") when it has one.
func (ix *index) statsWithLink() any {
	type withLink struct {
		prefix.Stats
		Uplink *cluster.Stats `json:"uplink,omitempty"`
	}
	out := withLink{Stats: ix.Stats()}
	if ix.link != nil {
		st := ix.link.Stats()
		out.Uplink = &st
	}
	return out
}

// The uplink's calls.

// cxl_uplink_off switches the link to the uplink off for tier h (for the
// indexes opened on it from now on): the uplink's own attachment, which
// must never ask itself.
//
//export cxl_uplink_off
func cxl_uplink_off(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_uplink_off", errbuf, errlen, &code)
	a, done, err := use[*attached](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	a.mu.Lock()
	link := a.link
	a.link = nil
	a.mu.Unlock()
	if link != nil {
		link.Close()
	}
	return report(nil, errbuf, errlen)
}

// cxl_uplink_address writes the socket path that the uplink of this tier's
// node binds and its clients dial.
//
//export cxl_uplink_address
func cxl_uplink_address(h C.uint64_t, buf *C.char, bufCap C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_uplink_address", errbuf, errlen, &code)
	err := func() error {
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		addr, err := cluster.Address(a.r, a.c.Node())
		if err != nil {
			return err
		}
		return copyString([]byte(addr), buf, bufCap)
	}()
	return report(err, errbuf, errlen)
}

// cxl_tier_mappings writes the address and length of each device mapping
// of the tier in this process (at most cap), and their count: what a
// transfer engine registers to move bytes in and out of the tier in place.
//
//export cxl_tier_mappings
func cxl_tier_mappings(h C.uint64_t, ptrs *unsafe.Pointer, lens *C.int64_t, capacity C.int64_t, n *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_tier_mappings", errbuf, errlen, &code)
	err := func() error {
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if n == nil || capacity < 0 || (capacity > 0 && (ptrs == nil || lens == nil)) {
			return fmt.Errorf("tier mappings: %w", errBadArg)
		}
		devs := a.r.NumDevices()
		*n = C.int64_t(devs)
		if int64(devs) > int64(capacity) {
			return fmt.Errorf("tier mappings: %w: %d devices, room for %d", errRange, devs, capacity)
		}
		ps, ls := unsafe.Slice(ptrs, devs), unsafe.Slice((*int64)(unsafe.Pointer(lens)), devs)
		for i := range devs {
			m := a.r.Device(i)
			ps[i], ls[i] = unsafe.Pointer(unsafe.SliceData(m)), int64(len(m))
		}
		return nil
	}()
	return report(err, errbuf, errlen)
}

// cxl_prefix_namespace writes the index's name across nodes.
//
//export cxl_prefix_namespace
func cxl_prefix_namespace(h C.uint64_t, buf *C.char, bufCap C.int, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_namespace", errbuf, errlen, &code)
	err := func() error {
		s, done, err := use[*index](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		return copyString([]byte(s.Namespace()), buf, bufCap)
	}()
	return report(err, errbuf, errlen)
}

// pinned is a set of hits an uplink holds while it reads their payloads in
// place; closing it releases them.
type pinned struct {
	child
}

// cxl_prefix_pin pins each key's entry where it is present (present[i] 1,
// else 0) and writes where its payload lies in this process, its length,
// and its WireChecksum, computed now from the payload (an entry that fails
// its own checksum is dropped and reported absent). The pins hold until
// cxl_prefix_unpin of *out. The bytes of a block from its payload's end
// to cxl_prefix_room belong to no payload: the uplink writes a page's
// trailer there, to send page and trailer as one transfer.
//
//export cxl_prefix_pin
func cxl_prefix_pin(h C.uint64_t, keys *C.uint8_t, n C.int64_t, addrs *unsafe.Pointer, lens *C.int64_t, crcs *C.uint32_t, present *C.int8_t, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_pin", errbuf, errlen, &code)
	err := func() error {
		s, ks, done, err := indexKeys(h, keys, n)
		defer done.Done()
		if err != nil {
			return err
		}
		if out == nil || (n > 0 && (addrs == nil || lens == nil || crcs == nil || present == nil)) {
			return fmt.Errorf("prefix pin: %w", errBadArg)
		}
		hits, err := pinEach(s, ks, unsafe.Slice(addrs, n), unsafe.Slice((*int64)(unsafe.Pointer(lens)), n),
			unsafe.Slice((*uint32)(unsafe.Pointer(crcs)), n), unsafe.Slice((*int8)(unsafe.Pointer(present)), n))
		if err != nil {
			return err
		}
		a, err := tierOf(s.tier)
		if err != nil {
			s.Release(hits)
			return err
		}
		p := &pinned{child: child{tier: s.tier, close: func() error { s.Release(hits); return nil }}}
		*out = C.uint64_t(handles.addChild(a, p, p.child))
		return nil
	}()
	return report(err, errbuf, errlen)
}

func pinEach(s *index, ks []prefix.Key, addrs []unsafe.Pointer, lens []int64, crcs []uint32, present []int8) ([]prefix.Hit, error) {
	hits := make([]prefix.Hit, 0, len(ks))
	for i := range ks {
		present[i] = 0
		before := len(hits)
		var err error
		hits, err = s.LookupAppend(hits, ks[i:i+1])
		if err != nil {
			s.Release(hits)
			return nil, err
		}
		if len(hits) == before {
			continue
		}
		hit := hits[before]
		b, wire, err := s.WirePayload(hit)
		if err != nil { // damaged in the tier: not for the cluster
			s.Release(hits[before:])
			hits = hits[:before]
			continue
		}
		addrs[i], lens[i], crcs[i], present[i] = unsafe.Pointer(unsafe.SliceData(b)), hit.Len, wire, 1
	}
	return hits, nil
}

//export cxl_prefix_unpin
func cxl_prefix_unpin(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_unpin", errbuf, errlen, &code)
	p, done, err := use[*pinned](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	return report(handles.closeChild(uint64(h), p.child), errbuf, errlen)
}

// reserved is a reservation an uplink fills in place.
type reserved struct {
	child
	s   *index
	res []prefix.Reservation
}

// cxl_prefix_reserve reserves a block of sizes[i] bytes for each key, as
// an insert does (evicting if it must), and writes where each block lies in
// this process (NULL when not reserved) and each key's status as
// cxl_prefix_set does. Fill the blocks, then cxl_prefix_publish_written or
// cxl_prefix_abort *out. A process that dies first leaves reservations
// that the reaper reclaims: never a half-written entry.
//
//export cxl_prefix_reserve
func cxl_prefix_reserve(h C.uint64_t, keys *C.uint8_t, n C.int64_t, sizes *C.int64_t, addrs *unsafe.Pointer, statuses *C.int8_t, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_reserve", errbuf, errlen, &code)
	err := func() error {
		s, ks, done, err := indexKeys(h, keys, n)
		defer done.Done()
		if err != nil {
			return err
		}
		if out == nil || (n > 0 && (sizes == nil || addrs == nil || statuses == nil)) {
			return fmt.Errorf("prefix reserve: %w", errBadArg)
		}
		res, err := s.Reserve(ks, int64sAt(unsafe.Pointer(sizes), int64(n)))
		if res == nil {
			return err
		}
		ptrs := unsafe.Slice(addrs, n)
		for i, r := range res {
			ptrs[i] = nil
			if b, berr := s.Block(r); berr == nil {
				ptrs[i] = unsafe.Pointer(unsafe.SliceData(b))
			}
		}
		writeStatuses(statuses, n, prefix.Statuses(res))
		a, aerr := tierOf(s.tier)
		if aerr != nil {
			s.Abort(res)
			return aerr
		}
		rv := &reserved{s: s, res: res}
		rv.child = child{tier: s.tier, close: func() error { return s.Abort(res) }}
		*out = C.uint64_t(handles.addChild(a, rv, rv.child))
		return err
	}()
	return report(err, errbuf, errlen)
}

// cxl_prefix_room writes how many bytes each block of the index spans
// (its stride; a transfer may fill that much of a reserved block).
//
//export cxl_prefix_room
func cxl_prefix_room(h C.uint64_t, room *C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_room", errbuf, errlen, &code)
	s, done, err := use[*index](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	if room == nil {
		return report(fmt.Errorf("prefix room: %w", errBadArg), errbuf, errlen)
	}
	*room = C.int64_t(s.Room())
	return report(nil, errbuf, errlen)
}

// cxl_prefix_fenced fails with CXL_ECLOSED once this client's lease is
// gone: call it right before a transfer writes into reserved blocks.
//
//export cxl_prefix_fenced
func cxl_prefix_fenced(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_fenced", errbuf, errlen, &code)
	s, done, err := use[*index](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	return report(s.Fenced(), errbuf, errlen)
}

// cxl_prefix_publish_written publishes the reserved blocks of reservation
// h that the transfer filled (published[i] 1 on entry; 0 aborts that one)
// and whose contents match crcs[i] (each key's WireChecksum), aborts the
// others, and closes h; on return published[i] says which were published.
//
//export cxl_prefix_publish_written
func cxl_prefix_publish_written(h C.uint64_t, crcs *C.uint32_t, n C.int64_t, published *C.int8_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_publish_written", errbuf, errlen, &code)
	err := func() error {
		rv, done, err := use[*reserved](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if int(n) != len(rv.res) || (n > 0 && (crcs == nil || published == nil)) {
			return fmt.Errorf("prefix publish written: %w: %d checksums for %d reservations", errBadArg, n, len(rv.res))
		}
		handles.forgetChild(uint64(h), rv.child) // published or aborted below, not closed
		out := unsafe.Slice((*int8)(unsafe.Pointer(published)), n)
		var unfilled []prefix.Reservation
		for i := range out {
			if out[i] != 1 { // not filled: aborted, whatever its checksum
				unfilled = append(unfilled, rv.res[i])
				rv.res[i].Status = prefix.NoSpace
			}
		}
		aerr := rv.s.Abort(unfilled)
		ok, err := rv.s.PublishWritten(rv.res, unsafe.Slice((*uint32)(unsafe.Pointer(crcs)), n))
		err = errors.Join(err, aerr)
		for i := range out {
			out[i] = 0
			if i < len(ok) && ok[i] {
				out[i] = 1
			}
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

//export cxl_prefix_abort
func cxl_prefix_abort(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_abort", errbuf, errlen, &code)
	rv, done, err := use[*reserved](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	return report(handles.closeChild(uint64(h), rv.child), errbuf, errlen)
}
