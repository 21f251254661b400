package crccopy

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestJoining checks that pieces checksummed apart join into the
// checksum of the whole, by every way the package offers, at lengths that
// are and are not multiples of a word, from a seed and from 0.
func TestJoining(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct{ a, b int }{{0, 0}, {1, 0}, {0, 1}, {1, 1}, {7, 13}, {16, 16}, {4096, 333}, {65537, 4096}} {
		a, b := make([]byte, tc.a), make([]byte, tc.b)
		for i := range a {
			a[i] = byte(rng.Uint32())
		}
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		seed := rng.Uint32()
		crcA := crc32.Update(seed, Table, a)
		want := crc32.Update(crcA, Table, b)
		if got := Combine(crcA, crc32.Update(0, Table, b), int64(len(b))); got != want {
			t.Errorf("Combine %d+%d: %#x, want %#x", tc.a, tc.b, got, want)
		}
		rawB := ^crc32.Update(^uint32(0), Table, b) // from 0, no inversions
		if got := Append(crcA, rawB, NewShift(int64(len(b)))); got != want {
			t.Errorf("Append %d+%d: %#x, want %#x", tc.a, tc.b, got, want)
		}
	}
}

func TestShiftIsMul(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int64{0, 1, 16, 512, 32 << 10, 2 << 20} {
		s := NewShift(n)
		if s.Bytes() != n {
			t.Fatalf("Bytes %d, want %d", s.Bytes(), n)
		}
		for range 100 {
			r := rng.Uint32()
			if got, want := s.Apply(r), Mul(r, XPow8n(uint64(n))); got != want {
				t.Fatalf("shift of %d bytes on %#x: %#x, want %#x", n, r, got, want)
			}
		}
	}
}
