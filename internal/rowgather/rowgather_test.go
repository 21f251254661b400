package rowgather

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// naive is the definition Copy must agree with.
func naive(planes []Plane, ids []int64) {
	for _, p := range planes {
		for i, id := range ids {
			copy(p.Dst[i*p.RowBytes:(i+1)*p.RowBytes], p.Src[int(id)*p.RowBytes:])
		}
	}
}

func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
	return b[:n]
}

// TestCopyMatchesNaive runs every copy this CPU has: ZMM steps, YMM steps
// and memmove (the paths of CPUs without AVX-512 or AVX2).
func TestCopyMatchesNaive(t *testing.T) {
	vec, wide := hasVec, hasWide
	defer func() { hasVec, hasWide = vec, wide }()
	for _, c := range []struct {
		name      string
		vec, wide bool
	}{{"zmm", true, true}, {"ymm", true, false}, {"memmove", false, false}} {
		if (c.vec && !vec) || (c.wide && !wide) {
			continue
		}
		hasVec, hasWide = c.vec, c.wide
		t.Run(c.name, testCopyMatchesNaive)
	}
}

func testCopyMatchesNaive(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const rows = 3000
	pool := NewPool(4)
	// Vector rows (multiples of 16, 64 and not), 8-byte rows, and rows
	// memmove moves (264 is 16·16+8), alone and as Engram's two planes.
	for _, sizes := range [][]int{{16}, {48}, {64}, {256}, {656}, {4112}, {8}, {24}, {264}, {1}, {256, 8}, {656, 64, 8}} {
		var srcs [][]byte
		for _, rb := range sizes {
			srcs = append(srcs, randomBytes(rng, rows*rb))
		}
		for _, n := range []int{0, 1, 7, 300, 2048, 9000} {
			for _, threads := range []int{0, 1, 3} {
				name := fmt.Sprintf("rows%v/n%d/threads%d", sizes, n, threads)
				var got, want []Plane
				for k, rb := range sizes {
					src := srcs[k]
					got = append(got, Plane{Src: src, RowBytes: rb, Dst: make([]byte, n*rb)})
					want = append(want, Plane{Src: src, RowBytes: rb, Dst: make([]byte, n*rb)})
				}
				ids := make([]int64, n)
				for i := range ids {
					ids[i] = rng.Int64N(rows)
				}
				if n > 2 {
					ids[0], ids[n-1] = 0, rows-1 // both ends of the table
				}
				if err := pool.Copy(got, ids, threads); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				naive(want, ids)
				for p := range got {
					if !bytes.Equal(got[p].Dst, want[p].Dst) {
						t.Fatalf("%s: plane %d differs from a plain copy", name, p)
					}
				}
			}
		}
	}
}

func TestCopyRefusesBeforeWriting(t *testing.T) {
	src := make([]byte, 100*64)
	for i := range src {
		src[i] = 0xAB
	}
	cases := []struct {
		name   string
		planes []Plane
		ids    []int64
		want   error
	}{
		{"id past the end", []Plane{{src, 64, make([]byte, 3*64)}}, []int64{0, 100, 1}, ErrBadID},
		{"negative id", []Plane{{src, 64, make([]byte, 3*64)}}, []int64{0, -1, 1}, ErrBadID},
		{"huge id", []Plane{{src, 64, make([]byte, 2*64)}}, []int64{1 << 62, 1}, ErrBadID},
		{"id inside one plane, past the other", []Plane{{src, 64, make([]byte, 64)}, {src[:50*64], 64, make([]byte, 64)}}, []int64{60}, ErrBadID},
		{"output a byte short", []Plane{{src, 64, make([]byte, 3*64-1)}}, []int64{0, 1, 2}, ErrBadPlane},
		{"zero-byte rows", []Plane{{src, 0, make([]byte, 64)}}, []int64{0}, ErrBadPlane},
		{"negative rows", []Plane{{src, -64, make([]byte, 64)}}, []int64{0}, ErrBadPlane},
	}
	for _, c := range cases {
		for _, threads := range []int{1, 2} {
			err := NewPool(2).Copy(c.planes, c.ids, threads)
			if !errors.Is(err, c.want) {
				t.Errorf("%s (threads %d): got %v, want %v", c.name, threads, err, c.want)
			}
			for _, p := range c.planes {
				if bytes.IndexByte(p.Dst, 0xAB) >= 0 {
					t.Errorf("%s: output written before the error", c.name)
				}
			}
		}
	}
}

// TestConcurrentCallsShareThePool: callers that find the helpers busy copy
// alone; every result is still exact (run under -race).
func TestConcurrentCallsShareThePool(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const rows, rb = 5000, 256
	src := randomBytes(rng, rows*rb)
	pool := NewPool(3)
	var wg sync.WaitGroup
	for g := range 6 {
		ids := make([]int64, 4096+g*100)
		for i := range ids {
			ids[i] = rng.Int64N(rows)
		}
		wg.Go(func() {
			for range 20 {
				got := []Plane{{src, rb, make([]byte, len(ids)*rb)}}
				want := []Plane{{src, rb, make([]byte, len(ids)*rb)}}
				if err := pool.Copy(got, ids, 0); err != nil {
					t.Error(err)
					return
				}
				naive(want, ids)
				if !bytes.Equal(got[0].Dst, want[0].Dst) {
					t.Error("a concurrent call's rows differ from a plain copy")
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestCopySpans(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	src := randomBytes(rng, 1<<16)
	for _, rb := range []int{8, 16, 64, 100, 656} {
		n := 200
		srcOffs, dstOffs := make([]int64, n), make([]int64, n)
		for i := range n {
			srcOffs[i] = rng.Int64N(int64(len(src) - rb + 1))
			dstOffs[i] = int64((n - 1 - i) * rb) // reversed slots
		}
		got, want := make([]byte, n*rb), make([]byte, n*rb)
		if err := CopySpans(got, src, dstOffs, srcOffs, rb); err != nil {
			t.Fatalf("rows of %d: %v", rb, err)
		}
		for i := range n {
			copy(want[dstOffs[i]:dstOffs[i]+int64(rb)], src[srcOffs[i]:])
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("rows of %d differ from a plain copy", rb)
		}
	}
	bad := []struct {
		name           string
		dstOff, srcOff int64
		rb             int
	}{
		{"source past the end", 0, 1<<16 - 63, 64},
		{"destination past the end", 65, 0, 64},
		{"negative source", 0, -16, 64},
		{"row longer than the destination", 0, 0, 256},
	}
	for _, c := range bad {
		dst := make([]byte, 128)
		if err := CopySpans(dst, src, []int64{0, c.dstOff}, []int64{0, c.srcOff}, c.rb); !errors.Is(err, ErrBadID) {
			t.Errorf("%s: got %v, want ErrBadID", c.name, err)
		}
		if !bytes.Equal(dst, make([]byte, 128)) {
			t.Errorf("%s: written before the error", c.name)
		}
	}
	if err := CopySpans(make([]byte, 64), src, []int64{0}, []int64{0, 1}, 64); !errors.Is(err, ErrBadPlane) {
		t.Errorf("offsets of unequal lengths: got %v", err)
	}
}

// FuzzCopy: ids and row sizes as a caller across the C ABI may pass them;
// Copy either agrees with a plain copy or refuses, never panics or reads
// outside the table.
func FuzzCopy(f *testing.F) {
	f.Add([]byte{1, 2, 3, 255}, uint16(256), uint16(8), uint8(2))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 128}, uint16(16), uint16(0), uint8(1))
	f.Fuzz(func(t *testing.T, raw []byte, rb0, rb1 uint16, threads uint8) {
		const rows = 64
		var planes, want []Plane
		for _, rb := range []int{int(rb0 % 700), int(rb1 % 700)} {
			if rb == 0 && len(planes) > 0 {
				continue
			}
			src := make([]byte, rows*rb)
			for i := range src {
				src[i] = byte(i * 7)
			}
			n := len(raw) / 2
			planes = append(planes, Plane{src, rb, make([]byte, n*rb)})
			want = append(want, Plane{src, rb, make([]byte, n*rb)})
		}
		ids := make([]int64, len(raw)/2)
		for i := range ids {
			ids[i] = int64(int16(uint16(raw[2*i]) | uint16(raw[2*i+1])<<8))
		}
		err := NewPool(3).Copy(planes, ids, int(threads%4))
		if err != nil {
			if !errors.Is(err, ErrBadID) && !errors.Is(err, ErrBadPlane) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		naive(want, ids)
		for p := range planes {
			if !bytes.Equal(planes[p].Dst, want[p].Dst) {
				t.Fatalf("plane %d differs from a plain copy", p)
			}
		}
	})
}
