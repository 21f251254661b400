package tier

import "fmt"

// Offset addresses a byte of the logical region. It is the only kind of
// address ever stored in the region: every process maps the devices at its
// own addresses. Offset 0 is the header, never an allocation, so a zero
// Offset means "none".
type Offset uint64

// Nil is the zero Offset, meaning "no allocation".
const Nil Offset = 0

func (o Offset) String() string { return fmt.Sprintf("%#x", uint64(o)) }

// Add returns o+n, checked against overflow.
func (o Offset) Add(n int64) (Offset, error) {
	if n < 0 || uint64(o)+uint64(n) < uint64(o) {
		return 0, fmt.Errorf("tier: offset %v + %d: %w", o, n, ErrOutOfBounds)
	}
	return o + Offset(n), nil
}
