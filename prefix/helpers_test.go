package prefix

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/tier"
)

// testTier formats a small file-backed tier of devices devices (16 MiB each).
func testTier(t testing.TB, devices int) (*tier.Region, *tier.Client) {
	return tiertest.Format(t, devices, 16<<20, 256<<10)
}

func testStore(t testing.TB, c *tier.Client, blocks, blockBytes int64) *Store {
	t.Helper()
	return testStoreShards(t, c, blocks, blockBytes, 0)
}

// testStoreShards is testStore with shards shards (0: the default).
func testStoreShards(t testing.TB, c *tier.Client, blocks, blockBytes int64, shards int) *Store {
	t.Helper()
	s, err := Create(c, Config{Name: "m", Blocks: blocks, BlockBytes: blockBytes, PinsPerClient: 256, Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// payloadFor is the deterministic payload of a key, so any reader can tell
// a torn or misplaced payload from the right one without the index's CRC.
func payloadFor(k Key, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = k[i%len(k)] ^ byte(i) ^ byte(i>>8)
	}
	return p
}

func keyN(n int) Key { return StringKey(fmt.Sprintf("key-%d", n)) }

// keysN is keyN(0), …, keyN(n-1).
func keysN(n int) []Key {
	keys := make([]Key, n)
	for i := range keys {
		keys[i] = keyN(i)
	}
	return keys
}

func mustCheck(t testing.TB, s *Store) {
	t.Helper()
	bad, err := s.Check(true)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bad {
		t.Error("invariant:", b)
	}
}

func mustZstd(t testing.TB, raw []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w, err := zstd.NewWriter(&b)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(raw)
	w.Close()
	return b.Bytes()
}

// unzstd decompresses a whole zstd stream.
func unzstd(t testing.TB, data []byte) []byte {
	t.Helper()
	d, err := zstd.NewReader(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	raw, err := d.DecodeAll(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// stalledClient attaches a client to r that never beats (a process stalled
// from the start) and opens index "m" through it.
func stalledClient(t *testing.T, r *tier.Region) (*tier.Client, *Store) {
	t.Helper()
	z, err := r.Attach(tier.ClientOptions{Name: "zombie", Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { z.Close() })
	sz, err := Open(z, "m")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sz.Close() })
	return z, sz
}

// reapUntilFenced has a reaper reclaim client z's lease, as one would
// once z had stalled past the lease timeout.
func reapUntilFenced(t *testing.T, r *tier.Region, z *tier.Client) {
	t.Helper()
	m, err := tier.NewManager(r, tier.ManagerOptions{SkipPIDCheck: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Client().Close()
	if _, err := m.Reap(z.Slot(), "stalled"); err != nil {
		t.Fatal(err)
	}
}
