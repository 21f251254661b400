package prefix

import (
	"fmt"
	"hash"
	"slices"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// Layout is a paged KV pool in engine buffers (GPU memory for the CUDA
// engine): page p's chunk c is ChunkBytes at Chunks[c].Offset +
// p*PageStride in Chunks[c].Buf — typically one chunk per layer and K/V.
// A tier block holds a page's chunks back to back.
type Layout struct {
	ChunkBytes int64
	Chunks     []kernels.Span
	PageStride int64 // 0: ChunkBytes
}

// BlockBytes is the size of one page's tier block.
func (l Layout) BlockBytes() int64 { return int64(len(l.Chunks)) * l.ChunkBytes }

// Mover moves whole pages between a paged pool and an index's blocks with
// the engine's block gather and scatter: one launch per batch, however many
// chunks a page has.
type Mover struct {
	s     *Store
	eng   kernels.Engine
	ids   []kernels.RangeID
	owned bool
	// Verify checks every hit's CRC (default true): the engine checksums
	// the bytes as it gathers them, in the same pass, and a page whose
	// checksum differs from its entry's is not served. Turn it off only
	// where the tier is trusted. Stores are checksummed either way: the
	// entry's checksum is what every reader verifies. A keyed index checks
	// every page, and its signature, whatever Verify says (mac.go).
	Verify bool

	// FirstToken, when set, begins a transfer that a request's first
	// token waits on: each load (Get, GetAll, and a LayerLoad until its
	// last layer has landed) and, with FirstTokenStores, each Put. The
	// transfer's pieces take turns with pace in place of the engine's
	// pacer, and end is called once it no longer moves. libcxltier sets it
	// on a tier that joined its node's link (link.Link.BeginFirst), so a
	// request's KV load goes ahead of the stores, write-behind and fills.
	FirstToken func() (pace kernels.Pacer, end func())
	// FirstTokenStores makes Put a first-token transfer too: the stores
	// of a prefill whose decode waits for its pages.
	FirstTokenStores bool

	afterReserve func() // tests only: a pause between Put's reserve and its scatter
}

// NewMover moves s's blocks with eng. ids are the engine ranges of the
// tier's devices if the caller registered them already (an engine maps a
// tier once; the CUDA engine cannot register the same memory twice); nil
// registers them here and Close unregisters them.
func NewMover(s *Store, eng kernels.Engine, ids []kernels.RangeID) (*Mover, error) {
	m := &Mover{s: s, eng: eng, ids: ids, Verify: true}
	if ids != nil {
		if len(ids) != s.r.NumDevices() {
			return nil, fmt.Errorf("prefix: mover: %d ranges for %d tier devices: %w", len(ids), s.r.NumDevices(), ErrBadConfig)
		}
		return m, nil
	}
	var err error
	if m.ids, err = kernels.RegisterAll(eng, s.r.NumDevices(), s.r.Device); err != nil {
		return nil, fmt.Errorf("prefix: mover: %w", err)
	}
	m.owned = true
	return m, nil
}

// Close unregisters the ranges NewMover registered.
func (m *Mover) Close() error {
	var first error
	if m.owned {
		first = kernels.UnregisterAll(m.eng, m.ids)
		m.ids = nil
	}
	return first
}

func (m *Mover) addr(off tier.Offset) (kernels.Addr, error) {
	dev, devOff, _, err := m.s.r.Locate(off)
	if err != nil {
		return 0, err
	}
	return kernels.At(m.ids[dev], devOff), nil
}

func (m *Mover) check(keys []Key, l Layout, pages []int64) error {
	if len(pages) != len(keys) {
		return fmt.Errorf("prefix: %q: %d keys but %d pages: %w", m.s.name, len(keys), len(pages), ErrBadConfig)
	}
	for i, p := range pages {
		if p < 0 {
			return fmt.Errorf("prefix: %q: page %d of key %d: %w", m.s.name, p, i, ErrBadConfig)
		}
	}
	if len(l.Chunks) == 0 || l.ChunkBytes <= 0 {
		return fmt.Errorf("prefix: %q: layout of %d chunks × %d B: %w", m.s.name, len(l.Chunks), l.ChunkBytes, ErrBadConfig)
	}
	if l.BlockBytes() > m.s.g.BlockBytes {
		return fmt.Errorf("prefix: %q: %d-byte pages: %w (%d)", m.s.name, l.BlockBytes(), ErrTooLarge, m.s.g.BlockBytes)
	}
	return nil
}

// Put stores pages[i] of the pool under keys[i]: reserve, one scatter
// launch for the batch that checksums the bytes it writes, wait, publish.
func (m *Mover) Put(keys []Key, l Layout, pages []int64) ([]Status, error) {
	held, herr := m.s.hold("put")
	if herr != nil {
		return nil, herr
	}
	defer held.Done()
	if err := m.check(keys, l, pages); err != nil {
		return nil, err
	}
	sizes := make([]int64, len(keys))
	for i := range sizes {
		sizes[i] = l.BlockBytes()
	}
	res, err := m.s.Reserve(keys, sizes)
	if err != nil && res == nil {
		return nil, err
	}
	b := kernels.Blocks{ChunkBytes: l.ChunkBytes, Chunks: l.Chunks, PageStride: l.PageStride, CRCs: []uint32{}}
	for i, r := range res {
		if r.Status == Reserved {
			a, aerr := m.addr(r.Offset)
			if aerr != nil {
				m.s.Abort(res)
				return nil, aerr
			}
			b.Tier = append(b.Tier, a)
			b.Pages = append(b.Pages, pages[i])
			b.CRCs = append(b.CRCs, m.s.g.crcSeed(&r.Key))
		}
	}
	if m.afterReserve != nil {
		m.afterReserve()
	}
	if len(b.Tier) > 0 {
		// Outside the lock the blocks are this client's only while its
		// lease is: a client reaped since it reserved (stalled past the
		// lease timeout) had the reservations reclaimed, and the blocks
		// may hold another's payload now.
		if ferr := held.Fenced(); ferr != nil {
			m.s.Abort(res)
			return nil, fmt.Errorf("prefix: %q: scatter %d pages: %w", m.s.name, len(b.Tier), ferr)
		}
		// Nobody waits on a store soon, unless it is a first-token one: a
		// CPU engine with background threads copies it at their priority.
		b.Background = !(m.FirstTokenStores && m.FirstToken != nil)
		if werr := m.move(m.eng.ScatterBlocks, &b, m.FirstTokenStores); werr != nil {
			m.s.Abort(res)
			return nil, fmt.Errorf("prefix: %q: scatter %d pages: %w", m.s.name, len(b.Tier), werr)
		}
	}
	if serr := m.signStored(res, l, pages); serr != nil {
		m.s.Abort(res)
		return nil, serr
	}
	crcs := make([]uint32, len(res))
	j := 0
	for i, r := range res {
		if r.Status != Reserved {
			continue
		}
		crcs[i] = b.CRCs[j]
		j++
		if m.s.shared {
			// A CPU engine's stores may sit in this host's cache: write
			// them back before the entry says the block is there.
			if ferr := m.s.r.Publish(r.Offset, r.Len); ferr != nil {
				m.s.Abort(res)
				return nil, ferr
			}
		}
	}
	if perr := m.s.Publish(res, crcs); perr != nil && err == nil {
		err = perr
	}
	return Statuses(res), err
}

// Get gathers the longest ready prefix of keys into pages[0:n] of the pool
// with one launch and returns n. Hits are pinned until the copy is done.
// With Verify, the gather checksums what it reads and n ends before the
// first page whose checksum fails (the error is ErrChecksum); every page
// it read with a bad checksum has its entry dropped, as a layer-wise load
// drops them, so that the next reader does not meet them again. Pages past
// n may have been written all the same.
func (m *Mover) Get(keys []Key, l Layout, pages []int64) (int, error) {
	return m.get(keys, l, pages, false)
}

// GetAll is Get of every key or none: a key that is not ready (never
// stored, or evicted since the caller looked) fails it with ErrNotFound
// before anything is copied, as a transfer that must land a request's
// every page wants (a prefill-to-decode landing). Each page moves whole,
// with the batch's one launch: a load with no model to overlap needs no
// layer at a time, and one pass over each block reads the tier in order.
func (m *Mover) GetAll(keys []Key, l Layout, pages []int64) error {
	n, err := m.get(keys, l, pages, true)
	if err == nil && n < len(keys) {
		err = fmt.Errorf("prefix: %q: %d of %d pages landed: %w", m.s.name, n, len(keys), ErrNotFound)
	}
	return err
}

func (m *Mover) get(keys []Key, l Layout, pages []int64, all bool) (int, error) {
	held, herr := m.s.hold("get")
	if herr != nil {
		return 0, herr
	}
	defer held.Done()
	if err := m.check(keys, l, pages); err != nil {
		return 0, err
	}
	hits, err := m.s.Lookup(keys)
	if err != nil {
		return 0, err
	}
	defer func() { m.s.Release(hits) }()
	if all && len(hits) < len(keys) {
		return 0, fmt.Errorf("prefix: %q: get of %d pages: page %d (%v): %w", m.s.name, len(keys), len(hits), keys[len(hits)], ErrNotFound)
	}
	b := kernels.Blocks{ChunkBytes: l.ChunkBytes, Chunks: l.Chunks, PageStride: l.PageStride}
	verify := m.verifying()
	if verify {
		b.CRCs = make([]uint32, 0, len(hits))
	}
	for i, h := range hits {
		if h.Len != l.BlockBytes() {
			m.s.Release(hits[i:])
			hits = hits[:i]
			return 0, fmt.Errorf("prefix: %q: %v holds %d bytes, pages are %d: %w", m.s.name, h.Key, h.Len, l.BlockBytes(), ErrBadConfig)
		}
		a, aerr := m.fresh(h.Offset, h.Len)
		if aerr != nil {
			return 0, aerr
		}
		b.Tier = append(b.Tier, a)
		b.Pages = append(b.Pages, pages[i])
		if verify {
			b.CRCs = append(b.CRCs, m.s.g.crcSeed(&h.Key))
		}
	}
	if len(b.Tier) > 0 {
		if werr := m.move(m.eng.GatherBlocks, &b, true); werr != nil {
			return 0, fmt.Errorf("prefix: %q: gather %d pages: %w", m.s.name, len(b.Tier), werr)
		}
	}
	n := len(b.Tier)
	var damaged []Key // every page the gather read with a bad checksum, not only the first
	for i := range b.CRCs {
		if h := hits[i]; b.CRCs[i] != h.CRC {
			if damaged == nil {
				n, err = i, fmt.Errorf("prefix: %q: %v: %w: stored %#x, read %#x", m.s.name, h.Key, ErrChecksum, h.CRC, b.CRCs[i])
			}
			damaged = append(damaged, h.Key)
		}
	}
	if bad, serr := m.checkLoaded(hits[:n], l, pages); serr != nil {
		n, err = bad, serr
		damaged = append(damaged, hits[bad].Key)
	}
	if n < len(hits) && err != nil {
		m.s.Release(hits[n:])
		hits = hits[:n]
		for _, k := range damaged {
			m.s.dropCorrupt(k)
		}
	}
	m.s.count(ctrBytesOut, uint64(n)*uint64(l.BlockBytes()))
	return n, err
}

// move runs the block call and waits for it, as a first-token transfer
// when first says it is one and the Mover has FirstToken.
func (m *Mover) move(call func(kernels.Blocks) (kernels.Handle, error), b *kernels.Blocks, first bool) error {
	if first && m.FirstToken != nil {
		pace, end := m.FirstToken()
		defer end()
		b.Pacer = pace
	}
	return wait(call(*b))
}

// fresh is the engine address of n bytes of the tier at off, which the
// engine is about to read: on a non-coherent tier this host's cached
// copies of them are dropped first, so what the engine reads (and
// checksums) is what the writer published.
func (m *Mover) fresh(off tier.Offset, n int64) (kernels.Addr, error) {
	if m.s.shared {
		if err := m.s.r.Refresh(off, n); err != nil {
			return 0, err
		}
	}
	return m.addr(off)
}

func wait(h kernels.Handle, err error) error {
	if err != nil {
		return err
	}
	return h.Wait()
}

// A LayerLoad is a Get done a layer at a time, so that the model computes
// layer l while later layers land (SGLang's layer-wise loading): the
// entries are found and pinned once, then each call copies one layer's
// chunks of every page with one launch. A page's block is its layers in
// order, perLayer chunks each (Layout.Chunks is layer-major).
//
// The checksum covers a whole block, so it is accumulated a layer at a
// time, by the gather that moves each layer, and compared after the last
// layer: a damaged entry fails the load
// (its caller must not use what landed) and is dropped, so later lookups
// miss it. A LayerLoad is for one goroutine at a time.
//
// Layer(i) queues layer i+1's gather before it waits for layer i's, so
// the engine never idles between layers while the caller works on layer
// i (on a GPU, the wait and the checksum read back between two layers
// cost as much as a tenth of the layer's copy). So the pages' destination
// belongs to the load until Close, which waits for a gather queued ahead.
type LayerLoad struct {
	m        *Mover
	l        Layout
	perLayer int
	hits     []Hit
	pages    []int64
	crcs     []uint32
	macs     []hash.Hash    // a keyed index's signatures, a layer at a time
	next     int            // the layer the next call must copy
	ahead    kernels.Handle // layer next's gather, queued by the call before; nil if none
	err      error          // the first failure; every later call reports it
	released bool
	// first is the pacer of the load's first-token transfer, and end ends
	// it (nil: none, or ended).
	first kernels.Pacer
	end   func()
}

// Layers is how many layers a load of l in perLayer chunks has.
func layersOf(l Layout, perLayer int) (int, error) {
	if perLayer <= 0 || len(l.Chunks)%perLayer != 0 {
		return 0, fmt.Errorf("prefix: %d chunks do not split into layers of %d: %w", len(l.Chunks), perLayer, ErrBadConfig)
	}
	return len(l.Chunks) / perLayer, nil
}

// StartLoad pins every entry of keys, which are to land in pages of l.
// It is all or nothing: a key that is not ready (evicted since the caller
// looked it up) or holds other than one block of l fails the whole load
// with no pin kept, as a partial load would leave pages of the caller's
// batch unfilled.
func (m *Mover) StartLoad(keys []Key, l Layout, perLayer int, pages []int64) (*LayerLoad, error) {
	held, herr := m.s.hold("load")
	if herr != nil {
		return nil, herr
	}
	defer held.Done()
	if err := m.check(keys, l, pages); err != nil {
		return nil, err
	}
	if _, err := layersOf(l, perLayer); err != nil {
		return nil, err
	}
	hits, err := m.s.Lookup(keys)
	if err != nil {
		return nil, err
	}
	if len(hits) < len(keys) {
		m.s.Release(hits)
		return nil, fmt.Errorf("prefix: %q: load of %d pages: page %d (%v): %w", m.s.name, len(keys), len(hits), keys[len(hits)], ErrNotFound)
	}
	for _, h := range hits {
		if h.Len != l.BlockBytes() {
			m.s.Release(hits)
			return nil, fmt.Errorf("prefix: %q: %v holds %d bytes, pages are %d: %w", m.s.name, h.Key, h.Len, l.BlockBytes(), ErrBadConfig)
		}
	}
	crcs := make([]uint32, len(hits))
	for j := range hits {
		crcs[j] = m.s.g.crcSeed(&hits[j].Key)
	}
	var macs []hash.Hash
	if m.s.mac != nil {
		macs = make([]hash.Hash, len(hits))
		for j := range hits {
			macs[j] = m.s.mac.begin(&hits[j].Key)
		}
	}
	ld := &LayerLoad{m: m, l: l, perLayer: perLayer, hits: hits, pages: slices.Clone(pages), crcs: crcs, macs: macs}
	if m.FirstToken != nil {
		ld.first, ld.end = m.FirstToken()
	}
	return ld, nil
}

// Pages is how many pages the load moves.
func (ld *LayerLoad) Pages() int { return len(ld.hits) }

// Layer copies layer i of every page: layers go in order, from 0.
func (ld *LayerLoad) Layer(i int) error {
	held, herr := ld.m.s.hold("load")
	if herr != nil {
		return herr
	}
	defer held.Done()
	if ld.err != nil {
		return ld.err
	}
	layers, _ := layersOf(ld.l, ld.perLayer)
	if i != ld.next || i >= layers || ld.released {
		return fmt.Errorf("prefix: %q: layer %d of a %d-layer load whose next is %d: %w", ld.m.s.name, i, layers, ld.next, ErrBadConfig)
	}
	h := ld.ahead
	ld.ahead = nil
	if h == nil {
		if h, ld.err = ld.queueLayer(i); ld.err != nil {
			ld.fail()
			return ld.err
		}
	}
	if i+1 < layers {
		ld.queueAhead(i + 1)
	}
	if ld.err = ld.landLayer(i, h); ld.err != nil {
		ld.fail()
		return ld.err
	}
	ld.next++
	if ld.next == layers {
		ld.endFirst()
		ld.err = ld.verify()
	}
	return ld.err
}

// endFirst ends the load's first-token transfer, once.
func (ld *LayerLoad) endFirst() {
	if ld.end != nil {
		ld.end()
		ld.first, ld.end = nil, nil
	}
}

// fail ends a failed load: it goes no further, so its pins go now, not at
// Close, once no gather queued ahead still reads the pinned entries.
func (ld *LayerLoad) fail() {
	ld.waitAhead()
	ld.endFirst()
	ld.release()
}

// queueLayer queues the gather of layer i of every page, continuing the
// checksums of the layers before it (the engine reads them once the
// gathers queued before are done).
func (ld *LayerLoad) queueLayer(i int) (kernels.Handle, error) {
	span := int64(ld.perLayer) * ld.l.ChunkBytes
	lo := int64(i) * span
	b := kernels.Blocks{ChunkBytes: ld.l.ChunkBytes, Chunks: ld.l.Chunks[i*ld.perLayer : (i+1)*ld.perLayer],
		PageStride: ld.l.PageStride, Pages: ld.pages, Tier: make([]kernels.Addr, len(ld.hits)), Pacer: ld.first}
	if ld.m.verifying() {
		b.CRCs = ld.crcs // the layers before this one's, updated in place
	}
	for j, h := range ld.hits {
		a, err := ld.m.fresh(h.Offset+tier.Offset(lo), span)
		if err != nil {
			return nil, err
		}
		b.Tier[j] = a
	}
	h, err := ld.m.eng.GatherBlocks(b)
	if err != nil {
		return nil, fmt.Errorf("prefix: %q: gather layer %d of %d pages: %w", ld.m.s.name, i, len(ld.hits), err)
	}
	return h, nil
}

// queueAhead queues layer i's gather for the next call to wait for. The
// gather reads the tier after this call returns, so it holds the client
// (a Close waits for it, not for the next call) until it is done; if the
// client is closing, or the queueing fails, the next call queues the
// layer itself and meets the error there.
func (ld *LayerLoad) queueAhead(i int) {
	held, err := ld.m.s.hold("load ahead")
	if err != nil {
		return
	}
	h, err := ld.queueLayer(i)
	if err != nil {
		held.Done()
		return
	}
	ld.ahead = h
	go func() {
		_ = h.Wait() // its outcome is the next call's, which waits again
		held.Done()
	}()
}

// waitAhead waits for a gather queued ahead, whose outcome no longer
// matters: the load failed or closed.
func (ld *LayerLoad) waitAhead() {
	if ld.ahead != nil {
		_ = ld.ahead.Wait()
		ld.ahead = nil
	}
}

// landLayer waits for layer i's gather, then signs what landed for a keyed
// index.
func (ld *LayerLoad) landLayer(i int, gather kernels.Handle) error {
	s := ld.m.s
	span := int64(ld.perLayer) * ld.l.ChunkBytes
	if err := gather.Wait(); err != nil {
		return fmt.Errorf("prefix: %q: gather layer %d of %d pages: %w", s.name, i, len(ld.hits), err)
	}
	if ld.macs != nil {
		lo, hi := i*ld.perLayer, (i+1)*ld.perLayer
		_, err := eachSigned(len(ld.hits), int64(len(ld.hits))*span, func(j int) error {
			pieces, err := ld.m.landed(ld.l, ld.pages[j], lo, hi, ld.hits[j].Offset+tier.Offset(int64(lo)*ld.l.ChunkBytes), span)
			for _, p := range pieces {
				ld.macs[j].Write(p)
			}
			return err
		})
		if err != nil {
			return fmt.Errorf("prefix: %q: sign layer %d of %d pages: %w", s.name, i, len(ld.hits), err)
		}
	}
	s.count(ctrBytesOut, uint64(len(ld.hits))*uint64(span))
	return nil
}

// verify compares the accumulated checksums; damaged entries are dropped.
func (ld *LayerLoad) verify() error {
	if !ld.m.verifying() {
		return nil
	}
	var bad []Hit
	for j, h := range ld.hits {
		if ld.crcs[j] != h.CRC || (ld.macs != nil && ld.m.s.checkMAC(&h, macOf(ld.macs[j])) != nil) {
			bad = append(bad, h)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	ld.release()
	for _, h := range bad {
		ld.m.s.dropCorrupt(h.Key)
	}
	kind := ErrChecksum
	if ld.macs != nil {
		kind = fmt.Errorf("%w or %w", ErrChecksum, ErrUnsigned)
	}
	return fmt.Errorf("prefix: %q: %d of %d pages damaged, first %v: %w", ld.m.s.name, len(bad), len(ld.hits), bad[0].Key, kind)
}

func (ld *LayerLoad) release() {
	if !ld.released {
		ld.m.s.Release(ld.hits)
		ld.released = true
	}
}

// Close releases the pins, once a gather queued ahead is done. It reports
// the load's failure, or that it stopped before its last layer (what
// landed is then incomplete).
func (ld *LayerLoad) Close() error {
	ld.waitAhead()
	ld.endFirst()
	ld.release()
	if ld.err != nil {
		return ld.err
	}
	if layers, _ := layersOf(ld.l, ld.perLayer); ld.next < layers {
		return fmt.Errorf("prefix: %q: load closed after %d of %d layers: %w", ld.m.s.name, ld.next, layers, ErrIncomplete)
	}
	return nil
}

// verifying reports whether loads check what they land: Verify, or a
// keyed index, whose signatures are checked always.
func (m *Mover) verifying() bool { return m.Verify || m.s.mac != nil }

// landed is chunks lo..hi of page p of l as they lie in the pool, where
// the engine's buffers are host memory (the CPU engine); otherwise (GPU
// memory) the n tier bytes at off that the engine moved. A keyed index
// signs and checks the pool's side where it can: what a reader uses, or
// what a writer meant to store, not tier bytes a writer without the key
// may change in between. Over the tier's side (a GPU pool, until the GPU
// computes signatures) a writer racing the copy can make the two differ.
func (m *Mover) landed(l Layout, p int64, lo, hi int, off tier.Offset, n int64) ([][]byte, error) {
	if cpu, ok := m.eng.(*kernels.CPU); ok {
		stride := l.PageStride
		if stride == 0 {
			stride = l.ChunkBytes
		}
		pieces := make([][]byte, 0, hi-lo)
		for _, c := range l.Chunks[lo:hi] {
			buf, err := cpu.Bytes(c.Buf)
			start := c.Offset + p*stride
			if err != nil || start < 0 || start+l.ChunkBytes > int64(len(buf)) {
				break // not the CPU's memory after all: sign the tier's side
			}
			pieces = append(pieces, buf[start:start+l.ChunkBytes])
		}
		if len(pieces) == hi-lo {
			return pieces, nil
		}
	}
	b, err := m.s.payload(off, n)
	return [][]byte{b}, err
}

// eachSigned runs fn(i) for every i in [0, n), whose signing comes to
// bytes in all, on several cores when there is enough of it (signGrain a
// goroutine), and returns the first i that failed and its error, or n.
func eachSigned(n int, bytes int64, fn func(i int) error) (int, error) {
	errs := make([]error, n)
	eachInParallelBy(n, bytes, signGrain, func(i int) { errs[i] = fn(i) })
	for i, err := range errs {
		if err != nil {
			return i, err
		}
	}
	return n, nil
}

// signStored signs, in a keyed index, each page a Put reserved, before it
// is published.
func (m *Mover) signStored(res []Reservation, l Layout, pages []int64) error {
	if m.s.mac == nil {
		return nil
	}
	i, err := eachSigned(len(res), int64(len(res))*l.BlockBytes(), func(i int) error {
		if res[i].Status != Reserved {
			return nil
		}
		pieces, err := m.landed(l, pages[i], 0, len(l.Chunks), res[i].Offset, res[i].Len)
		res[i].mac = m.s.sign(&res[i].Key, pieces)
		return err
	})
	if err != nil {
		return fmt.Errorf("prefix: %q: sign %v: %w", m.s.name, res[i].Key, err)
	}
	return nil
}

// checkLoaded checks, in a keyed index, the signature of each page a Get
// landed, in order; it returns how many passed before the first that did
// not, and why.
func (m *Mover) checkLoaded(hits []Hit, l Layout, pages []int64) (int, error) {
	if m.s.mac == nil {
		return len(hits), nil
	}
	i, err := eachSigned(len(hits), int64(len(hits))*l.BlockBytes(), func(i int) error {
		pieces, err := m.landed(l, pages[i], 0, len(l.Chunks), hits[i].Offset, hits[i].Len)
		if err != nil {
			return err
		}
		return m.s.checkSigned(&hits[i], pieces)
	})
	if err != nil {
		return i, fmt.Errorf("prefix: %q: %w", m.s.name, err)
	}
	return len(hits), nil
}
