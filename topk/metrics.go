package topk

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/cxltier/cxltier/internal/words"
	"github.com/cxltier/cxltier/tier"
)

// The daemon exports the counters of every process's pools. Each process
// writes its sums into its lease slot's record of one shared table in the
// tier, "topk/stats" in the root directory; the table is shared chunks, so
// it outlives the process that made it. A record counts only while the
// lease named in it is live, so the counters of a process that exited leave
// the sums (as a restarted process's counters would).

// StatsDirName and StatsKind name the shared counter table.
const (
	StatsDirName = "topk/stats"
	StatsKind    = 0x544f504b // "TOPK"
)

// A record: the owner's token, then the counters, one line per slot.
const (
	recordBytes = 128
	recToken    = 0
	recSteps    = 8
	recHits     = 16
	recMisses   = 24
	recFills    = 32
	recNewest   = 40
	recBytes    = 48
	recNanos    = 56
	recSeqs     = 64
	recExtents  = 72
)

// statsRecord is this client's record in the shared table, or nil if a
// live pool of this client already writes it (one pool per process is
// exported).
func statsRecord(c *tier.Client) ([]byte, tier.Offset, error) {
	r := c.Region()
	slot := r.TokenSlot(c.Token())
	if slot < 0 {
		return nil, 0, fmt.Errorf("topk: stats: client token %#x names no slot", c.Token())
	}
	e, err := r.DirLookup(StatsDirName)
	if errors.Is(err, tier.ErrNotFound) {
		e, err = createStatsTable(c)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("topk: stats table: %w", err)
	}
	if e.Kind != StatsKind || e.Size < int64(r.MaxClients())*recordBytes {
		return nil, 0, fmt.Errorf("topk: stats table: %w: kind %#x, %d bytes", ErrBadConfig, e.Kind, e.Size)
	}
	off := e.Offset + tier.Offset(slot*recordBytes)
	b, err := r.Slice(off, recordBytes)
	if err != nil {
		return nil, 0, err
	}
	if atomic.LoadUint64(words.U64At(b, recToken)) == c.Token() {
		return nil, 0, nil
	}
	return b, off, nil
}

// unpublishStats takes the pool's record out of the sums; p.mu is held.
func (p *Pool) unpublishStats() {
	if p.r.Closed() { // the record went with the mapping
		p.rec = nil
	}
	if p.rec != nil {
		atomic.StoreUint64(words.U64At(p.rec, recToken), 0)
		p.r.Publish(p.recOff, recordBytes)
		p.rec = nil
	}
}

func createStatsTable(c *tier.Client) (tier.DirEntry, error) {
	r := c.Region()
	chunk := r.ChunkSize()
	n := (int64(r.MaxClients())*recordBytes + chunk - 1) / chunk
	off, err := c.AllocChunks(n)
	if err != nil {
		return tier.DirEntry{}, err
	}
	// Chunks may hold a former owner's bytes; no one reads the table
	// before DirPut below.
	if err := r.WriteAt(make([]byte, n*chunk), off); err != nil {
		c.FreeChunks(off, n)
		return tier.DirEntry{}, err
	}
	r.Publish(off, n*chunk)
	e := tier.DirEntry{Name: StatsDirName, Kind: StatsKind, Offset: off, Size: n * chunk}
	if err := c.ShareChunks(off, n); err != nil {
		c.FreeChunks(off, n)
		return e, err
	}
	if err := c.DirPut(e); err != nil {
		c.FreeChunks(off, n)
		if errors.Is(err, tier.ErrExists) { // another process made it first
			return r.DirLookup(StatsDirName)
		}
		return e, err
	}
	return e, nil
}

// publishStats writes the pool's sums into its record; p.mu is held.
func (p *Pool) publishStats() {
	if p.rec == nil || p.r.Closed() {
		return
	}
	st := p.stats
	put := func(off int64, v int64) { atomic.StoreUint64(words.U64At(p.rec, off), uint64(v)) }
	put(recSteps, st.Steps)
	put(recHits, st.Hits)
	put(recMisses, st.Misses)
	put(recFills, st.Fills)
	put(recNewest, st.Newest)
	put(recBytes, st.BytesFetched)
	put(recNanos, int64(st.ResolveTime))
	put(recSeqs, int64(st.Sequences))
	put(recExtents, st.Extents)
	atomic.StoreUint64(words.U64At(p.rec, recToken), p.c.Token())
	p.r.Publish(p.recOff, recordBytes)
}

// ReadStats sums the records of live clients in r's shared table; a tier
// with no table (no pool ever ran) gives zero counters.
func ReadStats(r *tier.Region) (Stats, error) {
	var st Stats
	e, err := r.DirLookup(StatsDirName)
	if errors.Is(err, tier.ErrNotFound) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if e.Kind != StatsKind || e.Size < int64(r.MaxClients())*recordBytes {
		return st, fmt.Errorf("topk: stats table: %w: kind %#x, %d bytes", ErrBadConfig, e.Kind, e.Size)
	}
	r.Refresh(e.Offset, int64(r.MaxClients())*recordBytes)
	for slot := range r.MaxClients() {
		b, err := r.Slice(e.Offset+tier.Offset(slot*recordBytes), recordBytes)
		if err != nil {
			return st, err
		}
		get := func(off int64) int64 { return int64(atomic.LoadUint64(words.U64At(b, off))) }
		tok := uint64(get(recToken))
		if tok == 0 || r.TokenSlot(tok) != slot || !r.LeaseLive(tok) {
			continue
		}
		st.Steps += get(recSteps)
		st.Hits += get(recHits)
		st.Misses += get(recMisses)
		st.Fills += get(recFills)
		st.Newest += get(recNewest)
		st.BytesFetched += get(recBytes)
		st.ResolveTime += time.Duration(get(recNanos))
		st.Sequences += int(get(recSeqs))
		st.Extents += get(recExtents)
	}
	return st, nil
}
