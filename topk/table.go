package topk

// table is one request's buffer state in one layer, kept exactly as SGLang
// keeps it, plus what each slot really holds.
type table struct {
	tokens []int32 // Slots+1: the token each slot holds for SGLang (device_buffer_tokens); the last is the newest-token slot
	lru    []int16 // Slots: slot numbers, least recently used first (lru_slots)
	loaded []int32 // Slots+1: the token whose bytes are in the slot, -1 for none
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

// scratch is reused across requests and steps: an open-addressing set of
// the step's selected tokens (stamped, so it needs no clearing) and the
// slot lists of the LRU pass.
type scratch struct {
	keys   []int32
	first  []int32 // first top-k index of the key
	stamp  []uint32
	now    uint32
	slotOf []int32 // by top-k index (first occurrences): assigned slot, -1 none yet
	order  []int32 // first occurrences, in top-k order
	hits   []int16
	evict  []int16
}

func (sc *scratch) reset(k int) {
	size := 1
	for size < 2*k {
		size *= 2
	}
	if len(sc.keys) != size {
		sc.keys, sc.first, sc.stamp = make([]int32, size), make([]int32, size), make([]uint32, size)
		sc.now = 0
	}
	sc.now++
	if sc.now == 0 { // wrapped: old stamps could match again
		clear(sc.stamp)
		sc.now = 1
	}
	if cap(sc.slotOf) < k {
		sc.slotOf = make([]int32, k)
	}
	sc.slotOf = sc.slotOf[:k]
	sc.order, sc.hits, sc.evict = sc.order[:0], sc.hits[:0], sc.evict[:0]
}

// slotFor returns where token's probe ends: its entry or an empty one.
func (sc *scratch) slotFor(token int32) (int, bool) {
	mask := len(sc.keys) - 1
	h := int(uint32(token)*2654435761) & mask
	for sc.stamp[h] == sc.now {
		if sc.keys[h] == token {
			return h, true
		}
		h = (h + 1) & mask
	}
	return h, false
}

// add records token at top-k index i and reports whether it is new.
func (sc *scratch) add(token int32, i int) bool {
	h, ok := sc.slotFor(token)
	if ok {
		return false
	}
	sc.keys[h], sc.first[h], sc.stamp[h] = token, int32(i), sc.now
	sc.slotOf[i] = -1
	sc.order = append(sc.order, int32(i))
	return true
}

// find returns the first top-k index of token, if selected.
func (sc *scratch) find(token int32) (int32, bool) {
	h, ok := sc.slotFor(token)
	if !ok {
		return 0, false
	}
	return sc.first[h], true
}

// resolve maps sel (one request's top-k positions, -1 padded) to slots in
// out, updates the table as SGLang's swap-in does, and appends to copies
// every entry a slot must receive. seqLen and sel are already validated.
func (t *table) resolve(seqLen int64, sel []int32, out []int32, sc *scratch, copies []copyOp) ([]copyOp, stepCounts) {
	sc.reset(len(sel))
	var n stepCounts
	slots := int64(len(t.lru))
	if seqLen <= slots {
		// Short: token p lives in slot p. (SGLang reads only the first
		// min(seq_len, k) selections, as its indexer never places a valid
		// one after them; here every valid selection is served.)
		for i, p := range sel {
			if p < 0 {
				out[i] = -1
				continue
			}
			out[i] = p
			if sc.add(p, i) {
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
			sc.add(p, i)
		}
	}
	// Hits and evictable slots, both in LRU order.
	for _, s := range t.lru {
		if i, ok := sc.find(t.tokens[s]); ok && t.tokens[s] >= 0 && sc.slotOf[i] < 0 {
			sc.slotOf[i] = int32(s)
			sc.hits = append(sc.hits, s)
		} else {
			sc.evict = append(sc.evict, s)
		}
	}
	n.hits = len(sc.hits)
	// The m-th miss takes the m-th least recently used evictable slot.
	for _, i := range sc.order {
		if sc.slotOf[i] >= 0 {
			continue
		}
		s := sc.evict[n.misses]
		n.misses++
		sc.slotOf[i] = int32(s)
		t.tokens[s] = sel[i]
	}
	// A slot holds either nothing or the bytes of the token SGLang's table
	// names, so every miss copies, and the copies beyond them are fills.
	before := len(copies)
	for _, i := range sc.order {
		s, tok := sc.slotOf[i], sel[i]
		if t.loaded[s] != tok {
			t.loaded[s] = tok
			copies = append(copies, copyOp{s, tok})
		}
	}
	n.fills = len(copies) - before - n.misses
	for i, p := range sel {
		if p >= 0 && p != newest {
			first, _ := sc.find(p)
			out[i] = sc.slotOf[first]
		}
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
