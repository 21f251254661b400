package topk

// table is one request's buffer state in one layer, kept exactly as SGLang
// keeps it, plus what each slot really holds and an index from token to
// slot.
type table struct {
	tokens []int32 // Slots+1: the token each slot holds for SGLang (device_buffer_tokens); the last is the newest-token slot
	lru    []int16 // Slots: slot numbers, least recently used first (lru_slots)
	loaded []int32 // Slots+1: the token whose bytes are in the slot, -1 for none
	where  slotMap // token → slot for tokens[:Slots]; built at the first long step
}

func newTable(slots int) table {
	t := table{tokens: make([]int32, slots+1), lru: make([]int16, slots), loaded: make([]int32, slots+1)}
	for s := range slots {
		t.tokens[s], t.lru[s] = int32(s), int16(s)
	}
	t.tokens[slots] = -1
	for s := range t.loaded {
		t.loaded[s] = -1
	}
	return t
}

// copyOp is one entry to bring into a slot.
type copyOp struct {
	slot  int32
	token int32
}

// stepCounts are one request's counts for one step.
type stepCounts struct {
	hits, misses, fills, newest int
}

// scratch is reused across requests and steps: per-slot marks (stamped, so
// they need no clearing) and the lists of one step.
type scratch struct {
	mark    []uint32
	now     uint32
	pending []int32 // top-k indices of misses, in top-k order
	hits    []int16
	evict   []int16
}

func (sc *scratch) reset(slots int) {
	if len(sc.mark) < slots+1 {
		sc.mark, sc.now = make([]uint32, slots+1), 0
	}
	sc.now++
	if sc.now == 0 { // wrapped: old stamps could match again
		clear(sc.mark)
		sc.now = 1
	}
	sc.pending, sc.hits, sc.evict = sc.pending[:0], sc.hits[:0], sc.evict[:0]
}

// first marks slot s for this step and reports whether it was unmarked.
func (sc *scratch) first(s int) bool {
	if sc.mark[s] == sc.now {
		return false
	}
	sc.mark[s] = sc.now
	return true
}

// resolve maps sel (one request's top-k positions, -1 padded) to slots in
// out, updates the table as SGLang's swap-in does, and appends to copies
// every entry a slot must receive. seqLen and sel are already validated.
func (t *table) resolve(seqLen int64, sel []int32, out []int32, sc *scratch, copies []copyOp) ([]copyOp, stepCounts) {
	slots := len(t.lru)
	sc.reset(slots)
	if seqLen <= int64(slots) {
		return t.resolveShort(sel, out, sc, copies)
	}
	if t.where.keys == nil {
		t.where.build(t.tokens[:slots])
	}
	var n stepCounts
	newest := int32(seqLen - 1)
	newestSelected := false
	for i, p := range sel {
		switch {
		case p < 0:
			out[i] = -1
		case p == newest:
			out[i] = int32(slots)
			newestSelected = true
		default:
			if s, ok := t.where.get(p); ok {
				out[i] = int32(s)
				sc.first(int(s))
			} else {
				sc.pending = append(sc.pending, int32(i))
			}
		}
	}
	// Hit and evictable slots, both in LRU order.
	for _, s := range t.lru {
		if sc.mark[s] == sc.now {
			sc.hits = append(sc.hits, s)
		} else {
			sc.evict = append(sc.evict, s)
		}
	}
	n.hits = len(sc.hits)
	for _, s := range sc.hits {
		if tok := t.tokens[s]; t.loaded[s] != tok {
			t.loaded[s] = tok
			copies = append(copies, copyOp{int32(s), tok})
			n.fills++
		}
	}
	// The m-th miss takes the m-th least recently used evictable slot; a
	// repeated position finds the slot its first occurrence took.
	for _, i := range sc.pending {
		p := sel[i]
		if s, ok := t.where.get(p); ok {
			out[i] = int32(s)
			continue
		}
		s := sc.evict[n.misses]
		n.misses++
		if old := t.tokens[s]; old >= 0 {
			t.where.del(old)
		}
		t.tokens[s], t.loaded[s] = p, p
		t.where.put(p, s)
		out[i] = int32(s)
		copies = append(copies, copyOp{int32(s), p})
	}
	// New LRU order: unused evictable slots, then the misses, then the hits.
	k := copy(t.lru, sc.evict[n.misses:])
	k += copy(t.lru[k:], sc.evict[:n.misses])
	copy(t.lru[k:], sc.hits)
	if newestSelected && t.loaded[slots] != newest {
		t.loaded[slots] = newest
		copies = append(copies, copyOp{int32(slots), newest})
		n.newest++
	}
	return copies, n
}

// resolveShort serves a sequence no longer than the buffer: token p lives
// in slot p. (SGLang reads only the first min(seq_len, k) selections, as
// its indexer never places a valid one after them; every valid selection
// is served here.)
func (t *table) resolveShort(sel []int32, out []int32, sc *scratch, copies []copyOp) ([]copyOp, stepCounts) {
	var n stepCounts
	for i, p := range sel {
		if p < 0 {
			out[i] = -1
			continue
		}
		out[i] = p
		if sc.first(int(p)) {
			n.hits++
			if t.loaded[p] != p {
				t.loaded[p] = p
				copies = append(copies, copyOp{p, p})
				n.fills++
			}
		}
	}
	return copies, n
}

// slotMap is an open-addressing map from token to slot with linear probing
// and backward-shift deletion (no tombstones), at most half full.
type slotMap struct {
	keys  []int32 // -1: empty
	vals  []int16
	shift uint
}

func (m *slotMap) build(tokens []int32) {
	size, bits := 2, uint(1)
	for size < 2*len(tokens) {
		size, bits = size*2, bits+1
	}
	m.keys, m.vals, m.shift = make([]int32, size), make([]int16, size), 32-bits
	for i := range m.keys {
		m.keys[i] = -1
	}
	for s, tok := range tokens {
		if tok >= 0 {
			m.put(tok, int16(s))
		}
	}
}

// home is Fibonacci hashing: the product's top bits.
func (m *slotMap) home(tok int32) int { return int(uint32(tok) * 2654435769 >> m.shift) }

func (m *slotMap) get(tok int32) (int16, bool) {
	mask := len(m.keys) - 1
	for h := m.home(tok); ; h = (h + 1) & mask {
		switch m.keys[h] {
		case tok:
			return m.vals[h], true
		case -1:
			return 0, false
		}
	}
}

func (m *slotMap) put(tok int32, slot int16) {
	mask := len(m.keys) - 1
	h := m.home(tok)
	for m.keys[h] != -1 && m.keys[h] != tok {
		h = (h + 1) & mask
	}
	m.keys[h], m.vals[h] = tok, slot
}

func (m *slotMap) del(tok int32) {
	mask := len(m.keys) - 1
	i := m.home(tok)
	for m.keys[i] != tok {
		if m.keys[i] == -1 {
			return
		}
		i = (i + 1) & mask
	}
	// Shift later members of the run back over the hole when their home
	// does not lie cyclically in (hole, their place].
	for j := (i + 1) & mask; m.keys[j] != -1; j = (j + 1) & mask {
		h := m.home(m.keys[j])
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			m.keys[i], m.vals[i] = m.keys[j], m.vals[j]
			i = j
		}
	}
	m.keys[i] = -1
}
