package engram

// rowMap maps table rows to cache slots: open addressing with linear
// probing and backward-shift deletion, sized at twice the slots so probes
// stay short. It replaces a Go map on the prefetch path, where it is
// looked up once per row of every call (thousands per layer and step).
type rowMap struct {
	keys []int64 // row+1; 0 is empty
	vals []int32
	mask uint64
}

func newRowMap(slots int) *rowMap {
	n := 16
	for n < 2*slots {
		n *= 2
	}
	return &rowMap{keys: make([]int64, n), vals: make([]int32, n), mask: uint64(n - 1)}
}

func (m *rowMap) home(row int64) uint64 {
	x := uint64(row) * 0x9E3779B97F4A7C15
	return (x ^ x>>29) & m.mask
}

func (m *rowMap) get(row int64) (int32, bool) {
	for i := m.home(row); ; i = (i + 1) & m.mask {
		switch m.keys[i] {
		case row + 1:
			return m.vals[i], true
		case 0:
			return 0, false
		}
	}
}

// put adds row (not present). The map never fills: it holds at most one
// key per slot and has twice as many cells.
func (m *rowMap) put(row int64, slot int32) {
	i := m.home(row)
	for m.keys[i] != 0 {
		i = (i + 1) & m.mask
	}
	m.keys[i], m.vals[i] = row+1, slot
}

func (m *rowMap) delete(row int64) {
	i := m.home(row)
	for m.keys[i] != row+1 {
		if m.keys[i] == 0 {
			return
		}
		i = (i + 1) & m.mask
	}
	// Shift later entries of the run back so no probe chain breaks.
	for j := (i + 1) & m.mask; m.keys[j] != 0; j = (j + 1) & m.mask {
		h := m.home(m.keys[j] - 1)
		if (j-h)&m.mask >= (j-i)&m.mask {
			m.keys[i], m.vals[i] = m.keys[j], m.vals[j]
			i = j
		}
	}
	m.keys[i] = 0
}

func (m *rowMap) clear() { clear(m.keys) }
