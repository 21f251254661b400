package engram

import (
	"fmt"
	"math"
)

// Hasher maps compressed token ids to global table rows for every Engram
// layer of a geometry. It is immutable and safe for concurrent use.
type Hasher struct {
	g      Geometry
	layers map[int]*layerHash
}

// layerHash is one layer's derived constants.
type layerHash struct {
	hashRule
	rows int64 // rows in the layer's table
}

// hashRule is the hash of one layer, the one Go implementation the host
// planner and the CPU twin of engram.cu share: a token whose window is w
// (w[k] the id k positions back) hashes to one row per order n in
// [2, MaxNgram] and head h, mix_n mod p + offset, where mix_n is the XOR
// of w[k]*mult[k] for k < n. Rows are order-major.
type hashRule struct {
	mult    []int64 // one per position back, MaxNgram of them
	heads   int
	moduli  []int64 // [(order-2)*heads + head]
	offsets []int64 // global row of each head's first row, same order
}

// appendRows appends the rows of the token whose window is w. The modulus
// is taken unsigned, so that a window with ids outside the vocabulary
// (which callers reject) could not yield a row outside the table; for the
// ids callers pass, mix stays below 2^63 ((V-1)*m < 2^63 by the choice of
// half_bound, and XOR keeps the top bit 0), where both agree.
func (r *hashRule) appendRows(dst, w []int64) []int64 {
	mix := w[0] * r.mult[0]
	for k := 1; k < len(r.mult); k++ {
		mix ^= w[k] * r.mult[k]
		for j := (k - 1) * r.heads; j < k*r.heads; j++ {
			dst = append(dst, int64(uint64(mix)%uint64(r.moduli[j]))+r.offsets[j])
		}
	}
	return dst
}

// NewHasher derives multipliers, moduli and offsets for every layer.
func NewHasher(g Geometry) (*Hasher, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	h := &Hasher{g: g, layers: make(map[int]*layerHash, len(g.LayerIDs))}
	seen := map[int64]bool{} // one set across all layers and orders
	for _, layer := range g.LayerIDs {
		m, err := multipliers(g.Seed, layer, g.Vocab, g.MaxNgram)
		if err != nil {
			return nil, err
		}
		lh := &layerHash{hashRule: hashRule{mult: m, heads: g.Heads}}
		for n := 2; n <= g.MaxNgram; n++ {
			start := g.BaseSizes[n-2] - 1
			for range g.Heads {
				p, ok := nextPrime(start, seen)
				if !ok {
					return nil, fmt.Errorf("%w: no prime above %d", ErrGeometry, start)
				}
				seen[p] = true
				lh.moduli, lh.offsets = append(lh.moduli, p), append(lh.offsets, lh.rows)
				lh.rows += p
				start = p
			}
		}
		h.layers[layer] = lh
	}
	return h, nil
}

// multipliers reproduces the reference's per-layer draw:
// default_rng(seed + 10007*layer).integers(0, half_bound, size=n) * 2 + 1
// with half_bound = max(1, (INT64_MAX // V) // 2).
func multipliers(seed int64, layer int, vocab int64, n int) ([]int64, error) {
	if seed < 0 || layer < 0 || vocab < 1 || int64(layer) > (math.MaxInt64-seed)/10007 {
		return nil, fmt.Errorf("%w: seed %d, layer %d, vocab %d", ErrGeometry, seed, layer, vocab)
	}
	half := max(1, (math.MaxInt64/vocab)/2)
	r := newNumpyRNG(uint64(seed + 10007*int64(layer)))
	m := r.integers(half, n)
	for i := range m {
		m[i] = m[i]*2 + 1
	}
	return m, nil
}

// Geometry returns the hasher's geometry.
func (h *Hasher) Geometry() Geometry { return h.g }

func (h *Hasher) layer(l int) (*layerHash, error) {
	lh, ok := h.layers[l]
	if !ok {
		return nil, fmt.Errorf("%w: layer %d is not an Engram layer (have %v)", ErrInput, l, h.g.LayerIDs)
	}
	return lh, nil
}

// Multipliers returns layer l's multipliers.
func (h *Hasher) Multipliers(l int) ([]int64, error) {
	lh, err := h.layer(l)
	if err != nil {
		return nil, err
	}
	return append([]int64(nil), lh.mult...), nil
}

// Moduli returns layer l's moduli, [order-2][head].
func (h *Hasher) Moduli(l int) ([][]int64, error) {
	lh, err := h.layer(l)
	if err != nil {
		return nil, err
	}
	out := make([][]int64, len(lh.mult)-1)
	for i := range out {
		out[i] = append([]int64(nil), lh.moduli[i*lh.heads:(i+1)*lh.heads]...)
	}
	return out, nil
}

// Rows is the number of rows in layer l's table.
func (h *Hasher) Rows(l int) (int64, error) {
	lh, err := h.layer(l)
	if err != nil {
		return 0, err
	}
	return lh.rows, nil
}

// Hash appends to dst the global rows of every position of ids for layer l:
// HashesPerToken rows per position, order-major (all heads of order 2, then
// order 3, ...). history holds the ids that came before ids in the same
// sequence (oldest first; only the last MaxNgram-1 matter); positions
// before the sequence start read the pad id, as the reference does.
func (h *Hasher) Hash(dst []int64, l int, history, ids []int64) ([]int64, error) {
	lh, err := h.layer(l)
	if err != nil {
		return dst, err
	}
	err = h.eachWindow(history, ids, func(window []int64) { dst = lh.appendRows(dst, window) })
	return dst, err
}

// Windows appends to dst, for every position of ids, the MaxNgram ids the
// hash of that position reads: the id itself, then the ids before it
// (pad before the sequence start). history and ids are as for Hash and
// checked the same way; an engine hashes the windows (engineStep).
func (h *Hasher) Windows(dst []int64, history, ids []int64) ([]int64, error) {
	err := h.eachWindow(history, ids, func(window []int64) { dst = append(dst, window...) })
	return dst, err
}

// eachWindow checks history and ids and calls f with the window of every
// position of ids (window[k]: the id k positions back); f must not keep it.
func (h *Hasher) eachWindow(history, ids []int64, f func(window []int64)) error {
	if err := h.checkIDs(history, "history"); err != nil {
		return err
	}
	if err := h.checkIDs(ids, "ids"); err != nil {
		return err
	}
	maxN := h.g.MaxNgram
	window := make([]int64, maxN)
	for k := range window {
		window[k] = h.g.PadID
	}
	for _, id := range history[max(0, len(history)-(maxN-1)):] {
		shift(window, id)
	}
	for _, id := range ids {
		shift(window, id)
		f(window)
	}
	return nil
}

func shift(window []int64, id int64) {
	copy(window[1:], window[:len(window)-1])
	window[0] = id
}

func (h *Hasher) checkIDs(ids []int64, what string) error {
	for i, id := range ids {
		if id < 0 || id >= h.g.Vocab {
			return fmt.Errorf("%w: %s[%d] = %d outside [0, %d)", ErrInput, what, i, id, h.g.Vocab)
		}
	}
	return nil
}

// HashBatch hashes a [batch][T] block of prefill ids (each row a sequence
// from its start) into dst, laid out [batch][T][HashesPerToken].
func (h *Hasher) HashBatch(dst []int64, l int, batch [][]int64) ([]int64, error) {
	for b, ids := range batch {
		var err error
		if dst, err = h.Hash(dst, l, nil, ids); err != nil {
			return dst, fmt.Errorf("sequence %d: %w", b, err)
		}
	}
	return dst, nil
}
