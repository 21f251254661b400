package prefix

import (
	"bytes"
	"testing"
)

// FuzzDecodeGeometry feeds arbitrary index headers (they cross a process
// boundary: any process may have written the tier) to the decoder, which
// must refuse or return a geometry whose layout fits.
func FuzzDecodeGeometry(f *testing.F) {
	g := geometry{Entries: 64, Blocks: 16, Pins: 8, Clients: 4, LockID: 3, BlockBytes: 100, BlockStride: 128, Shards: 2}
	size := g.place()
	good := make([]byte, headerBytes)
	g.encode(good)
	f.Add(good, size)
	f.Add(make([]byte, headerBytes), int64(1<<20))
	f.Fuzz(func(t *testing.T, b []byte, metaBytes int64) {
		got, err := decodeGeometry(b, metaBytes)
		if err != nil {
			return
		}
		if err := got.check(); err != nil {
			t.Fatalf("decoded a geometry that fails its own check: %v", err)
		}
		if need := got.place(); need > metaBytes {
			t.Fatalf("layout of %d bytes accepted in %d", need, metaBytes)
		}
	})
}

// FuzzRestore feeds arbitrary bytes to Restore: it must return an error or
// restore entries that all check out, never panic.
func FuzzRestore(f *testing.F) {
	_, c := testTier(f, 1)
	s := testStore(f, c, 8, 256)
	keys := []Key{keyN(1), keyN(2)}
	s.Set(keys, payloadsFor(keys, 200))
	var snap bytes.Buffer
	s.Snapshot(&snap, nil)
	f.Add(snap.Bytes())
	f.Add([]byte{})
	n := 0
	f.Fuzz(func(t *testing.T, data []byte) {
		n++
		dst, err := Create(c, Config{Name: "fz", Blocks: 8, BlockBytes: 256, PinsPerClient: 8})
		if err != nil {
			t.Fatal(err)
		}
		defer Destroy(c, "fz")
		defer dst.Close()
		dst.Restore(bytes.NewReader(data), nil)
		bad, err := dst.Check(true)
		if err != nil || len(bad) > 0 {
			t.Fatalf("after restoring fuzz input: %v %v", bad, err)
		}
	})
}
