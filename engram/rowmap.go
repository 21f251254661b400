package engram

// rowMap maps table rows to cache slots: open addressing with linear
// probing and backward-shift deletion, sized at twice the slots so probes
// stay short. It replaces a Go map on the prefetch path, where it is
// looked up once per row of every call (thousands per layer and step).
type rowMap struct {
	cells []cell
	mask  uint64
}

// cell keeps key and value together: one cache line per probe.
type cell struct {
	key int64 // row+1; 0 is empty
	val int32
}

func newRowMap(slots int) *rowMap {
	n := 16
	for n < 2*slots {
		n *= 2
	}
	return &rowMap{cells: make([]cell, n), mask: uint64(n - 1)}
}

func (m *rowMap) home(row int64) uint64 {
	x := uint64(row) * 0x9E3779B97F4A7C15
	return (x ^ x>>29) & m.mask
}

func (m *rowMap) get(row int64) (int32, bool) {
	for i := m.home(row); ; i = (i + 1) & m.mask {
		switch m.cells[i].key {
		case row + 1:
			return m.cells[i].val, true
		case 0:
			return 0, false
		}
	}
}

// put adds row (not present). The map never fills: it holds at most one
// key per slot and has twice as many cells.
func (m *rowMap) put(row int64, slot int32) {
	i := m.home(row)
	for m.cells[i].key != 0 {
		i = (i + 1) & m.mask
	}
	m.cells[i] = cell{row + 1, slot}
}

func (m *rowMap) delete(row int64) {
	i := m.home(row)
	for m.cells[i].key != row+1 {
		if m.cells[i].key == 0 {
			return
		}
		i = (i + 1) & m.mask
	}
	// Shift later entries of the run back so no probe chain breaks.
	for j := (i + 1) & m.mask; m.cells[j].key != 0; j = (j + 1) & m.mask {
		h := m.home(m.cells[j].key - 1)
		if (j-h)&m.mask >= (j-i)&m.mask {
			m.cells[i] = m.cells[j]
			i = j
		}
	}
	m.cells[i].key = 0
}
