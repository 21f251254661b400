package prefix

import (
	"bytes"
	"encoding/binary"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/cxltier/cxltier/tier"
)

// FuzzDamage damages a live tier and runs every reader on it: the tier's
// own (inspection, health check, directory, leases, locks, usage, a fresh
// open of the damaged file, the daemon's reaper pass) and the prefix
// index's (lookup, get, insert with eviction, delete, stats, check,
// reclaim, a new handle). Each input is a list of 6-byte mutations: an area
// (tier control area, index header, index metadata, payloads), an offset
// in it and a byte to XOR there. The readers may refuse anything; they must
// not panic, not hang (a deadline, with every goroutine's stack if they
// do), and never serve a payload other than the one inserted under its key.
func FuzzDamage(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0, 0, 0, 0, 0, 0xff})                      // tier magic
	f.Add([]byte{1, 0, 0, 0, 136, 0x40})                    // LRU head
	f.Add([]byte{1, 0, 0, 0, 140, 0x40})                    // LRU tail
	f.Add([]byte{2, 0, 0, 0, 8, 0x01, 2, 0, 0, 1, 0, 0x80}) // entry words
	f.Add([]byte{3, 0, 0, 0, 50, 0x20})                     // a payload byte
	f.Fuzz(func(t *testing.T, muts []byte) {
		if len(muts) > 6*64 {
			return
		}
		dir := t.TempDir()
		b, _ := tier.ParseBacking("file:" + filepath.Join(dir, "tier"))
		geo := tier.DefaultGeometry()
		geo.DeviceSize, geo.ChunkSize, geo.Stripe, geo.LeaseTimeout = 8<<20, 256<<10, 256<<10, 500*time.Millisecond
		r, err := tier.Format(tier.Options{Devices: []tier.Backing{b}, Geometry: geo})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		c, err := r.Attach(tier.ClientOptions{Name: "fuzz", LockWait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		s, err := Create(c, Config{Name: "d", Blocks: 16, BlockBytes: 512, PinsPerClient: 8, Shards: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		keys := keysN(12)
		if _, err := s.Set(keys, payloadsFor(keys, 300)); err != nil {
			t.Fatal(err)
		}
		damage(r, s, muts)

		done := make(chan struct{})
		go func() {
			defer close(done)
			readEverything(t, r, c, s, keys)
		}()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			buf := make([]byte, 1<<20)
			t.Fatalf("readers hung on damage %x:\n%s", muts, buf[:runtime.Stack(buf, true)])
		}
	})
}

// damage applies the mutations: area byte (mod 4), a 32-bit offset (mod
// the area's size), a byte to XOR.
func damage(r *tier.Region, s *Store, muts []byte) {
	dataStart := int64(r.DataStart())
	metaLen := s.g.PinsOff + s.g.Clients*s.g.PinStride
	areas := []struct{ off, n int64 }{
		{0, dataStart},                                 // tier header, leases, locks, directory, bitmap, owners
		{int64(s.meta), headerBytes},                   // index header
		{int64(s.meta), metaLen},                       // index header, entries, owners, pins
		{s.g.PayloadOff, s.g.Blocks * s.g.BlockStride}, // payloads
	}
	for len(muts) >= 6 {
		a := areas[int(muts[0])%len(areas)]
		off := a.off + int64(binary.LittleEndian.Uint32(muts[1:5]))%a.n
		var b [1]byte
		if r.ReadAt(b[:], tier.Offset(off)) == nil {
			b[0] ^= muts[5]
			r.WriteAt(b[:], tier.Offset(off))
		}
		muts = muts[6:]
	}
}

// readEverything runs every reader; errors are fine, a wrong payload is not.
func readEverything(t *testing.T, r *tier.Region, c *tier.Client, s *Store, keys []Key) {
	r.Verify()
	r.Audit()
	r.Snapshot()
	r.DirList()
	r.Leases()
	r.Locks()
	r.Usage()
	if ro, err := tier.Open(tier.Options{Devices: []tier.Backing{mustBacking(r)}, ReadOnly: true}); err == nil {
		ro.Snapshot()
		ro.Close()
	}
	if m, err := tier.NewManager(r, tier.ManagerOptions{SkipPIDCheck: true}); err == nil {
		m.ReapOnce()
		m.Client().Close()
	}

	s.Stats()
	s.Check(true)
	s.Exists(keys)
	dst := make([][]byte, len(keys))
	for i := range dst {
		dst[i] = make([]byte, 512)
	}
	if n, err := s.Get(keys, dst); err == nil {
		for i := range n {
			if want := payloadFor(keys[i], 300); !bytes.Equal(dst[i][:len(want)], want) {
				t.Fatalf("key %d served a payload that is not its own", i)
			}
		}
	}
	if hits, err := s.Lookup(keys[:4]); err == nil {
		s.Release(hits)
	}
	more := make([]Key, 20) // past the 16 blocks: inserts evict
	for i := range more {
		more[i] = keyN(100 + i)
	}
	for i := range more {
		s.Set(more[i:i+1], payloadsFor(more[i:i+1], 200))
	}
	s.Delete(keys[:2])
	s.Reclaim()
	s.Check(true)
	if c2, err := r.Attach(tier.ClientOptions{Name: "other", LockWait: time.Second}); err == nil {
		if s2, err := Maintain(c2, "d"); err == nil {
			s2.Stats()
			s2.Check(false)
			s2.Close()
		}
		c2.Close()
	}
}

func mustBacking(r *tier.Region) tier.Backing {
	b, _ := tier.ParseBacking(r.Info().Devices[0])
	return b
}
