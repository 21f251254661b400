package prefix

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/cxltier/cxltier/kernels"
)

// TestMoverPagedRoundTrip puts pages of a paged pool (three chunks per
// page, each in its own buffer, as K/V of layers are) into the index and
// gathers them into other pages, with the CPU engine: the same calls the
// CUDA engine serves on a GPU.
func TestMoverPagedRoundTrip(t *testing.T) {
	for _, devices := range []int{1, 2} {
		t.Run(fmt.Sprintf("%ddev", devices), func(t *testing.T) {
			_, c := testTier(t, devices)
			s := testStore(t, c, 16, 3*1024)
			eng := kernels.NewCPU(2)
			defer eng.Close()
			const pages, chunk = 8, 1024
			var l Layout
			l.ChunkBytes = chunk
			var raw [][]byte
			for i := range 3 {
				buf, err := eng.Alloc(pages * chunk)
				if err != nil {
					t.Fatal(err)
				}
				defer buf.Free()
				b, _ := eng.Bytes(buf)
				for j := range b {
					b[j] = byte(i*31 + j*7 + j>>10)
				}
				raw = append(raw, b)
				l.Chunks = append(l.Chunks, kernels.Span{Buf: buf})
			}
			m, err := NewMover(s, eng, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			keys := []Key{keyN(1), keyN(2), keyN(3)}
			st, err := m.Put(keys, l, []int64{0, 2, 5})
			if err != nil || st[0] != Reserved || st[2] != Reserved {
				t.Fatalf("Put = %v, %v", st, err)
			}
			want := func(i int, page int64) []byte { return append([]byte(nil), raw[i][page*chunk:(page+1)*chunk]...) }
			before := [][]byte{want(0, 2), want(1, 2), want(2, 2)}
			n, err := m.Get(keys, l, []int64{1, 3, 4})
			if err != nil || n != 3 {
				t.Fatalf("Get = %d, %v", n, err)
			}
			for i := range 3 {
				if !bytes.Equal(raw[i][3*chunk:4*chunk], before[i]) {
					t.Fatalf("chunk %d of page 3 is not page 2's", i)
				}
			}
			mustCheck(t, s)
			if _, err := m.Get(keys, Layout{ChunkBytes: 4096, Chunks: l.Chunks}, []int64{0, 1, 2}); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("oversized layout: %v", err)
			}
			if _, err := m.Put(keys, l, []int64{0}); !errors.Is(err, ErrBadConfig) {
				t.Fatalf("pages mismatch: %v", err)
			}
		})
	}
}
