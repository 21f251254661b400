package main

// #include <stdint.h>
import "C"

import (
	"fmt"
	"os"
	"slices"
	"time"
	"unsafe"

	"github.com/cxltier/cxltier/cluster"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
)

// The cluster tier, both sides of it. Every index handle asks the node's
// uplink (package cluster) on a local miss and tells it what it stored;
// the uplink itself (python/cxltier/cluster/uplink.py, one process per node) uses
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
// The addresses stay mapped under a hold on the tier, whose handle goes to
// *hold: give it back (cxl_tier_release) once the transfer engine no
// longer uses them (unregistered); a detach waits for it (bounded).
//
//export cxl_tier_mappings
func cxl_tier_mappings(h C.uint64_t, ptrs *unsafe.Pointer, lens *C.int64_t, capacity C.int64_t, n *C.int64_t, hold *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_tier_mappings", errbuf, errlen, &code)
	err := func() error {
		a, done, err := use[*attached](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if n == nil || hold == nil || capacity < 0 || (capacity > 0 && (ptrs == nil || lens == nil)) {
			return fmt.Errorf("tier mappings: %w", errBadArg)
		}
		devs := a.r.NumDevices()
		*n = C.int64_t(devs)
		if int64(devs) > int64(capacity) {
			return fmt.Errorf("tier mappings: %w: %d devices, room for %d", errRange, devs, capacity)
		}
		maps, id, err := mappings(uint64(h))
		if err != nil {
			return err
		}
		ps, ls := unsafe.Slice(ptrs, devs), unsafe.Slice((*int64)(unsafe.Pointer(lens)), devs)
		for i, m := range maps {
			ps[i], ls[i] = unsafe.Pointer(unsafe.SliceData(m)), int64(len(m))
		}
		*hold = C.uint64_t(id)
		return nil
	}()
	return report(err, errbuf, errlen)
}

// mappings is each device mapping of tier h, and the handle of the hold
// that keeps them mapped.
func mappings(h uint64) ([][]byte, uint64, error) {
	a, err := tierOf(h)
	if err != nil {
		return nil, 0, err
	}
	id, err := tierHold(h)
	if err != nil {
		return nil, 0, err
	}
	out := make([][]byte, a.r.NumDevices())
	for i := range out {
		out[i] = a.r.Device(i)
	}
	return out, id, nil
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
// place, under a hold on the tier: the mapping stays under the reads until
// the pins are released.
type pinned struct {
	child
}

// cxl_prefix_pin pins each key's entry where it is present (present[i] 1,
// else 0) and writes where its payload lies in this process, its length,
// and its page trailer (cluster.TrailerBytes at trailers + i*TrailerBytes:
// the payload's length and WireChecksum, computed now from the payload; an
// entry that fails its own checksum is dropped and reported absent). Where
// the block has room after the payload, the trailer is written there too,
// flushed, under a lease check (inplace[i] 1): the page and its trailer
// then leave as one transfer of length + TrailerBytes. The pins, and a
// hold on the tier that keeps the addresses mapped, last until
// cxl_prefix_unpin of *out; a detach waits for them (bounded).
//
//export cxl_prefix_pin
func cxl_prefix_pin(h C.uint64_t, keys *C.uint8_t, n C.int64_t, addrs *unsafe.Pointer, lens *C.int64_t, trailers *C.uint8_t, inplace, present *C.int8_t, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_pin", errbuf, errlen, &code)
	err := func() error {
		s, ks, done, err := indexKeys(h, keys, n)
		defer done.Done()
		if err != nil {
			return err
		}
		if out == nil || (n > 0 && (addrs == nil || lens == nil || trailers == nil || inplace == nil || present == nil)) {
			return fmt.Errorf("prefix pin: %w", errBadArg)
		}
		id, err := pinKeys(s, ks, pinOut{
			addrs:    unsafe.Slice(addrs, n),
			lens:     unsafe.Slice((*int64)(unsafe.Pointer(lens)), n),
			trailers: unsafe.Slice((*byte)(unsafe.Pointer(trailers)), int(n)*cluster.TrailerBytes),
			inplace:  unsafe.Slice((*int8)(unsafe.Pointer(inplace)), n),
			present:  unsafe.Slice((*int8)(unsafe.Pointer(present)), n),
		})
		if err == nil {
			*out = C.uint64_t(id)
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

// pinKeys pins ks's present entries of index s, answering into o, and
// returns the pins' handle, which holds the tier until it is closed.
func pinKeys(s *index, ks []prefix.Key, o pinOut) (uint64, error) {
	return holdPins(s, func() ([]prefix.Hit, error) { return pinEach(s, ks, o) })
}

// holdPins takes a hold on s's tier, then the hits pin takes, and returns
// a handle that gives back both when it is closed (a detach waits for it).
func holdPins(s *index, pin func() ([]prefix.Hit, error)) (uint64, error) {
	a, err := tierOf(s.tier)
	if err != nil {
		return 0, err
	}
	held, err := a.c.Hold()
	if err != nil {
		return 0, err
	}
	hits, err := pin()
	if err != nil {
		held.Done()
		return 0, err
	}
	p := &pinned{child: child{tier: s.tier, close: func() error { s.Release(hits); held.Done(); return nil }}}
	return handles.addChild(a, p, p.child), nil
}

// pinOut is where cxl_prefix_pin writes each key's answer.
type pinOut struct {
	addrs    []unsafe.Pointer
	lens     []int64
	trailers []byte
	inplace  []int8
	present  []int8
}

func pinEach(s *index, ks []prefix.Key, o pinOut) ([]prefix.Hit, error) {
	hits := make([]prefix.Hit, 0, len(ks))
	for i := range ks {
		o.present[i], o.inplace[i] = 0, 0
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
		b, checked, wire, err := s.WirePayload(hit)
		if err != nil { // damaged in the tier: not for the cluster
			s.Release(hits[before:])
			hits = hits[:before]
			continue
		}
		tr := o.trailers[i*cluster.TrailerBytes : (i+1)*cluster.TrailerBytes]
		t := cluster.Trailer{Length: uint32(hit.Len), CRC: wire}
		if auth := s.auth.Load(); auth != nil {
			_, t.MAC = auth.Seal(hit.Key, checked)
			t.Signed = true
		}
		t.Put(tr)
		written, err := s.WriteSlack(hit, tr)
		if err != nil {
			s.Release(hits)
			return nil, err
		}
		if written {
			o.inplace[i] = 1
		}
		o.addrs[i], o.lens[i], o.present[i] = unsafe.Pointer(unsafe.SliceData(b)), hit.Len, 1
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

// filling is a fill (prefix.Fill) an uplink's transfer writes into: Go
// owns its lease checks, its hold on the tier, its commit and its abort.
type filling struct {
	child
	f    *prefix.Fill
	s    *index
	keys []prefix.Key
	lens []int64
}

// cxl_prefix_fill_begin reserves a block of sizes[i] bytes for each key,
// as an insert does (evicting if it must), writes each key's status as
// cxl_prefix_set does, and starts a fill of the reserved blocks (*out):
// cxl_prefix_fill_blocks right before the transfer, then
// cxl_prefix_fill_commit, or cxl_prefix_fill_close to abort. Until then
// the fill holds the tier mapped (a detach waits for it, bounded). A
// process that dies first leaves reservations the reaper reclaims: never
// a half-written entry.
//
//export cxl_prefix_fill_begin
func cxl_prefix_fill_begin(h C.uint64_t, keys *C.uint8_t, n C.int64_t, sizes *C.int64_t, statuses *C.int8_t, out *C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_fill_begin", errbuf, errlen, &code)
	err := func() error {
		s, ks, done, err := indexKeys(h, keys, n)
		defer done.Done()
		if err != nil {
			return err
		}
		if out == nil || (n > 0 && (sizes == nil || statuses == nil)) {
			return fmt.Errorf("prefix fill begin: %w", errBadArg)
		}
		id, st, err := fillBegin(s, ks, slices.Clone(int64sAt(unsafe.Pointer(sizes), int64(n))))
		if st != nil {
			writeStatuses(statuses, n, st)
			*out = C.uint64_t(id)
		}
		return err
	}()
	return report(err, errbuf, errlen)
}

// fillBegin starts a fill of ks in index s and returns its handle (which
// holds the tier until the fill ends) and each key's status.
func fillBegin(s *index, ks []prefix.Key, lens []int64) (uint64, []prefix.Status, error) {
	f, err := s.BeginFill(ks, lens)
	if f == nil {
		return 0, nil, err
	}
	a, aerr := tierOf(s.tier)
	if aerr != nil {
		f.Close()
		return 0, nil, aerr
	}
	if l := a.claimer(); l != nil {
		f.Pace(l) // the commit's checks read every page: bulk on the node's link
	}
	fl := &filling{f: f, s: s, keys: slices.Clone(ks), lens: lens}
	fl.child = child{tier: s.tier, close: f.Close}
	return handles.addChild(a, fl, fl.child), f.Statuses(), err
}

// cxl_prefix_fill_blocks checks this client's lease and writes where each
// reserved block lies in this process (NULL for a key without a block):
// call it right before the transfer. A block may be filled with its
// payload and, right after it, its page trailer where cxl_prefix_room
// leaves room for both.
//
//export cxl_prefix_fill_blocks
func cxl_prefix_fill_blocks(h C.uint64_t, addrs *unsafe.Pointer, n C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_fill_blocks", errbuf, errlen, &code)
	err := func() error {
		fl, done, err := use[*filling](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if int(n) != len(fl.lens) || (n > 0 && addrs == nil) {
			return fmt.Errorf("prefix fill blocks: %w: room for %d of %d keys", errBadArg, n, len(fl.lens))
		}
		blocks, err := fl.f.Blocks()
		if err != nil {
			return err
		}
		ps := unsafe.Slice(addrs, n)
		for i, b := range blocks {
			ps[i] = nil
			if b != nil {
				ps[i] = unsafe.Pointer(unsafe.SliceData(b))
			}
		}
		return nil
	}()
	return report(err, errbuf, errlen)
}

// cxl_prefix_fill_commit ends fill h: each reserved key whose transfer
// filled its block (published[i] 1 on entry) is checked against its page
// trailer (trailers[i], or, where NULL, the trailer right after the payload
// in its block) and published if its payload matches; every other
// reservation is aborted. On return published[i] says which were
// published. A client reaped meanwhile publishes nothing (CXL_ECLOSED).
//
//export cxl_prefix_fill_commit
func cxl_prefix_fill_commit(h C.uint64_t, trailers *unsafe.Pointer, n C.int64_t, published *C.int8_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_fill_commit", errbuf, errlen, &code)
	err := func() error {
		fl, done, err := use[*filling](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if int(n) != len(fl.lens) || (n > 0 && (trailers == nil || published == nil)) {
			return fmt.Errorf("prefix fill commit: %w: %d answers for %d keys", errBadArg, n, len(fl.lens))
		}
		handles.forgetChild(uint64(h), fl.child) // committed below, not closed
		out := unsafe.Slice((*int8)(unsafe.Pointer(published)), n)
		filled, parsed := fillTrailers(fl, unsafe.Slice(trailers, n), out)
		auth := fl.s.auth.Load()
		ok, err := fl.f.Commit(filled, func(i int, payload []byte) (uint32, error) {
			return auth.Check(parsed[i], fl.keys[i], payload)
		})
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

// fillTrailers reads each filled key's trailer: where it came apart from
// the payload (trailers[i]), or right after the payload in its block. A
// trailer that does not parse, or names another length, unfills the key.
func fillTrailers(fl *filling, trailers []unsafe.Pointer, published []int8) ([]bool, []cluster.Trailer) {
	filled, parsed := make([]bool, len(fl.lens)), make([]cluster.Trailer, len(fl.lens))
	blocks, _ := fl.f.Slack(cluster.TrailerBytes)
	for i := range fl.lens {
		if published[i] != 1 {
			continue
		}
		var raw []byte
		switch {
		case trailers[i] != nil:
			raw = unsafe.Slice((*byte)(trailers[i]), cluster.TrailerBytes)
		case blocks != nil && blocks[i] != nil:
			raw = blocks[i]
		default:
			continue
		}
		t, err := cluster.ParseTrailer(raw, fl.lens[i])
		if err != nil {
			continue
		}
		filled[i], parsed[i] = true, t
	}
	return filled, parsed
}

// cxl_prefix_fill_close aborts what fill h did not commit and ends it.
//
//export cxl_prefix_fill_close
func cxl_prefix_fill_close(h C.uint64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_fill_close", errbuf, errlen, &code)
	fl, done, err := use[*filling](uint64(h))
	if err != nil {
		return report(err, errbuf, errlen)
	}
	defer done.Done()
	return report(handles.closeChild(uint64(h), fl.child), errbuf, errlen)
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

// cxl_prefix_cluster_key gives index h the cluster's key (n bytes at key;
// n 0 takes it away): from then on the pages it pins for the cluster carry
// a MAC, and a fill into it publishes only pages whose MAC checks
// (cluster.PageAuth). Every uplink of a cluster needs the same key.
//
//export cxl_prefix_cluster_key
func cxl_prefix_cluster_key(h C.uint64_t, key *C.uint8_t, n C.int64_t, errbuf *C.char, errlen C.int) (code C.int) {
	defer recoverCall("cxl_prefix_cluster_key", errbuf, errlen, &code)
	err := func() error {
		s, done, err := use[*index](uint64(h))
		if err != nil {
			return err
		}
		defer done.Done()
		if n < 0 || (n > 0 && key == nil) {
			return fmt.Errorf("prefix cluster key: %w", errBadArg)
		}
		if n == 0 {
			s.auth.Store(nil)
			return nil
		}
		auth, err := cluster.NewPageAuth(unsafe.Slice((*byte)(unsafe.Pointer(key)), n), s.Namespace(), s.TenantSecret())
		if err != nil {
			return err
		}
		s.auth.Store(auth)
		return nil
	}()
	return report(err, errbuf, errlen)
}

// cxl_page_trailer_bytes is the size of a page's trailer on the wire.
//
//export cxl_page_trailer_bytes
func cxl_page_trailer_bytes() C.int { return cluster.TrailerBytes }
