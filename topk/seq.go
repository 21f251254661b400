package topk

import (
	"fmt"

	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// seq is one registered sequence: its extents in the tier and, per layer,
// the buffer state of its request.
type seq struct {
	req    int
	layers []layerSeq
}

type layerSeq struct {
	extents []extent
	length  int64 // entries appended
	table   table
}

// extent is one chunk of consecutive entries.
type extent struct {
	off  tier.Offset
	addr kernels.Addr
}

func (p *Pool) checkReq(req int) error {
	if req < 0 || req >= p.cfg.MaxRequests {
		return fmt.Errorf("%w: request %d outside [0, %d)", ErrBadInput, req, p.cfg.MaxRequests)
	}
	return nil
}

// lookup returns request req's sequence; p.mu is held. A pool whose
// Region closed under it is closed too: its extents went with the mapping.
func (p *Pool) lookup(req int) (*seq, error) {
	if p.closed || p.r.Closed() {
		return nil, ErrClosed
	}
	if err := p.checkReq(req); err != nil {
		return nil, err
	}
	if p.seqs[req] == nil {
		return nil, fmt.Errorf("%w: request %d", ErrUnknown, req)
	}
	return p.seqs[req], nil
}

// Register reserves room for a sequence under request index req and
// resets that request's buffer state as SGLang does when it admits a
// request: slot s holds token s, LRU order is slot order.
func (p *Pool) Register(req int, spec Sequence) error {
	held, herr := p.hold("register")
	if herr != nil {
		return herr
	}
	defer held.Done()
	switch {
	case spec.Layers != p.cfg.Layers:
		return fmt.Errorf("%w: request %d has %d layers, the pool %d", ErrBadEntry, req, spec.Layers, p.cfg.Layers)
	case spec.EntryBytes != p.cfg.EntryBytes:
		return fmt.Errorf("%w: request %d has %d-byte entries, the pool %d", ErrBadEntry, req, spec.EntryBytes, p.cfg.EntryBytes)
	case spec.Capacity < 0 || spec.Capacity > 1<<31-1:
		return fmt.Errorf("%w: request %d capacity %d tokens", ErrBadInput, req, spec.Capacity)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.r.Closed() {
		return ErrClosed
	}
	if err := p.checkReq(req); err != nil {
		return err
	}
	if p.seqs[req] != nil {
		return fmt.Errorf("%w: request %d", ErrRegistered, req)
	}
	s := &seq{req: req, layers: make([]layerSeq, p.cfg.Layers)}
	for l := range s.layers {
		if err := p.grow(&s.layers[l], spec.Capacity); err != nil {
			p.freeSeq(s)
			return fmt.Errorf("topk: register request %d: %w", req, err)
		}
	}
	if err := p.pl.register(req, s); err != nil {
		p.freeSeq(s)
		return fmt.Errorf("topk: register request %d: %w", req, err)
	}
	p.seqs[req] = s
	p.stats.Sequences++
	p.publishStats()
	return nil
}

// grow adds extents until the layer holds n entries.
func (p *Pool) grow(ls *layerSeq, n int64) error {
	for int64(len(ls.extents))*p.extentEntries < n {
		off, err := p.c.AllocChunks(1)
		if err != nil {
			return err
		}
		dev, devOff, _, err := p.r.Locate(off)
		if err != nil {
			p.c.FreeChunks(off, 1)
			return err
		}
		ls.extents = append(ls.extents, extent{off: off, addr: kernels.At(p.ids[dev], devOff)})
		p.stats.Extents++
	}
	return nil
}

// Free drops request req's sequence and gives its extents back.
func (p *Pool) Free(req int) error {
	held, herr := p.holdToRelease("free")
	if herr != nil {
		return herr
	}
	defer held.Done()
	p.mu.Lock()
	defer p.mu.Unlock()
	s, err := p.lookup(req)
	if err != nil {
		return err
	}
	p.seqs[req] = nil
	p.stats.Sequences--
	defer p.publishStats()
	// Copies already queued may still read the extents.
	if err := p.eng.Sync(); err != nil {
		return err
	}
	return p.freeSeq(s)
}

func (p *Pool) freeSeq(s *seq) error {
	var first error
	for l := range s.layers {
		for _, e := range s.layers[l].extents {
			if err := p.c.FreeChunks(e.off, 1); err != nil && first == nil {
				first = err
			}
			p.stats.Extents--
		}
		s.layers[l].extents = nil
	}
	return first
}

// Len is how many entries of layer are appended for request req.
func (p *Pool) Len(req, layer int) (int64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, err := p.lookup(req)
	if err != nil {
		return 0, err
	}
	if layer < 0 || layer >= len(s.layers) {
		return 0, fmt.Errorf("%w: layer %d of %d", ErrBadInput, layer, len(s.layers))
	}
	return s.layers[layer].length, nil
}

// entryAt is the tier offset and engine address of entry pos.
func (p *Pool) entryAt(ls *layerSeq, pos int64) (tier.Offset, kernels.Addr) {
	e := ls.extents[pos/p.extentEntries]
	d := (pos % p.extentEntries) * p.cfg.EntryBytes
	return e.off + tier.Offset(d), e.addr + kernels.Addr(d)
}

// appendTarget checks an append of n entries to layer and makes room.
func (p *Pool) appendTarget(req, layer int, n int64) (*layerSeq, error) {
	s, err := p.lookup(req)
	if err != nil {
		return nil, err
	}
	if layer < 0 || layer >= len(s.layers) {
		return nil, fmt.Errorf("%w: request %d: layer %d of %d", ErrBadInput, req, layer, len(s.layers))
	}
	ls := &s.layers[layer]
	if ls.length+n > p.pl.maxContext() {
		return nil, fmt.Errorf("%w: request %d: %d entries (max context %d)", ErrBadInput, req, ls.length+n, p.cfg.MaxContext)
	}
	before := len(ls.extents)
	if err := p.grow(ls, ls.length+n); err != nil {
		return nil, fmt.Errorf("topk: append to request %d layer %d: %w", req, layer, err)
	}
	if err := p.pl.grown(req, layer, ls, before); err != nil {
		return nil, err
	}
	return ls, nil
}

// Append adds entries (a whole number of EntryBytes) to layer of request
// req from host memory.
func (p *Pool) Append(req, layer int, entries []byte) error {
	held, herr := p.holdFenced("append")
	if herr != nil {
		return herr
	}
	defer held.Done()
	if int64(len(entries))%p.cfg.EntryBytes != 0 {
		return fmt.Errorf("%w: request %d: %d bytes is not a whole number of %d-byte entries", ErrBadEntry, req, len(entries), p.cfg.EntryBytes)
	}
	n := int64(len(entries)) / p.cfg.EntryBytes
	p.mu.Lock()
	defer p.mu.Unlock()
	ls, err := p.appendTarget(req, layer, n)
	if err != nil {
		return err
	}
	// Entries are consecutive within an extent: one copy per extent run.
	for i := int64(0); i < n; {
		pos := ls.length + i
		run := min(n-i, p.extentEntries-pos%p.extentEntries)
		off, _ := p.entryAt(ls, pos)
		src := entries[i*p.cfg.EntryBytes : (i+run)*p.cfg.EntryBytes]
		if err := p.r.WriteAt(src, off); err != nil {
			return err
		}
		if err := p.r.Publish(off, int64(len(src))); err != nil {
			return err
		}
		i += run
	}
	ls.length += n
	return nil
}

// AppendFrom adds n entries to layer of request req from engine memory:
// rows [first, first+n) of src (RowBytes = EntryBytes), in one scatter.
func (p *Pool) AppendFrom(req, layer int, src kernels.Buffer, first, n int64) error {
	held, herr := p.holdFenced("append")
	if herr != nil {
		return herr
	}
	defer held.Done()
	if n < 0 || first < 0 {
		return fmt.Errorf("%w: request %d: rows %d+%d", ErrBadInput, req, first, n)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ls, err := p.appendTarget(req, layer, n)
	if err != nil {
		return err
	}
	rows := kernels.Rows{RowBytes: p.cfg.EntryBytes, Buf: src, BufOffset: first * p.cfg.EntryBytes}
	for i := range n {
		_, a := p.entryAt(ls, ls.length+i)
		rows.Tier = append(rows.Tier, a)
	}
	if n > 0 {
		h, err := p.eng.Scatter(rows)
		if err == nil {
			err = h.Wait()
		}
		if err != nil {
			return fmt.Errorf("topk: append to request %d layer %d: %w", req, layer, err)
		}
	}
	ls.length += n
	return nil
}
