package prefix

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"
)

// A snapshot's progress ends with its count once, however short it was
// (one entry printed the same line twice: a first line and the last).
func TestSnapshotProgressSaysTheEndOnce(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 8, 4096)
	if _, err := s.Set([]Key{keyN(1)}, [][]byte{payloadFor(keyN(1), 100)}); err != nil {
		t.Fatal(err)
	}
	var file, progress bytes.Buffer
	if _, err := s.Snapshot(&file, &progress); err != nil {
		t.Fatal(err)
	}
	if got := progress.String(); got != "prefix: snapshot 1 entries (100%), 0.0 MiB\n" {
		t.Fatalf("progress: %q", got)
	}
}

func TestSnapshotRestoreRoundTrip(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 64, 4096)
	var keys []Key
	var payloads [][]byte
	for i := range 50 {
		keys = append(keys, keyN(i))
		payloads = append(payloads, payloadFor(keyN(i), 100+i*80))
	}
	if _, err := s.Set(keys, payloads); err != nil {
		t.Fatal(err)
	}
	var file, progress bytes.Buffer
	info, err := s.Snapshot(&file, &progress)
	if err != nil || info.Entries != 50 {
		t.Fatalf("Snapshot = %+v, %v", info, err)
	}
	if strings.Count(progress.String(), "50 entries (100%)") != 1 {
		t.Fatalf("progress: %q; want its last line once", progress.String())
	}

	_, c2 := testTier(t, 2) // a fresh tier, a different layout
	s2 := testStore(t, c2, 64, 4096)
	info, err = s2.Restore(bytes.NewReader(file.Bytes()), nil)
	if err != nil || info.Entries != 50 || info.Restored != 50 {
		t.Fatalf("Restore = %+v, %v", info, err)
	}
	dst := make([][]byte, len(keys))
	for i := range dst {
		dst[i] = make([]byte, 4096)
	}
	if n, err := s2.Get(keys, dst); err != nil || n != 50 {
		t.Fatalf("Get after restore = %d, %v", n, err)
	}
	for i := range keys {
		if !bytes.Equal(dst[i], payloads[i]) {
			t.Fatalf("key %d differs after restore", i)
		}
	}
	mustCheck(t, s2)
	// Restoring again keeps what is there.
	if info, err := s2.Restore(bytes.NewReader(file.Bytes()), nil); err != nil || info.Restored != 0 {
		t.Fatalf("second Restore = %+v, %v", info, err)
	}
}

func TestRestoreRefusesDamage(t *testing.T) {
	_, c := testTier(t, 1)
	s := testStore(t, c, 16, 512)
	keys := []Key{keyN(1), keyN(2), keyN(3)}
	s.Set(keys, payloadsFor(keys, 512))
	var file bytes.Buffer
	if _, err := s.Snapshot(&file, nil); err != nil {
		t.Fatal(err)
	}
	good := file.Bytes()
	_, c2 := testTier(t, 1)
	for name, data := range map[string][]byte{
		"truncated":   good[:len(good)/2],
		"not zstd":    []byte("hello world, not a snapshot"),
		"empty":       nil,
		"wrong magic": mustZstd(t, []byte("CXLTXXXX0000000000000000000000000000")),
	} {
		s2, err := Create(c2, Config{Name: "r-" + strings.ReplaceAll(name, " ", "-"), Blocks: 16, BlockBytes: 512, PinsPerClient: 16})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s2.Restore(bytes.NewReader(data), nil); err == nil {
			t.Errorf("%s: restore accepted a damaged file", name)
		} else if name != "not zstd" && name != "empty" && !errors.Is(err, ErrBadSnapshot) {
			t.Errorf("%s: %v, want ErrBadSnapshot", name, err)
		}
		s2.Close()
	}
	small, _ := Create(c2, Config{Name: "small", Blocks: 16, BlockBytes: 256, PinsPerClient: 16})
	if _, err := small.Restore(bytes.NewReader(good), nil); !errors.Is(err, ErrTooLarge) {
		t.Errorf("restore into smaller blocks: %v", err)
	}
}

// TestRestoreAllOrNothing: a snapshot damaged anywhere (its last record,
// its trailer), followed by data or a second frame, or holding more entries
// than the index has blocks, changes nothing in the index. Restore used to
// insert every record before the damage (61 of them, in one report) and
// accept what followed the trailer.
// snapshotOf40 snapshots an index holding keys 0 to 39 (300-byte
// payloads); it returns the keys and the snapshot file.
func snapshotOf40(t *testing.T) ([]Key, []byte) {
	t.Helper()
	_, c := testTier(t, 1)
	src := testStore(t, c, 64, 512)
	var keys []Key
	for i := range 40 {
		keys = append(keys, keyN(i))
	}
	if _, err := src.Set(keys, payloadsFor(keys, 300)); err != nil {
		t.Fatal(err)
	}
	var file bytes.Buffer
	if _, err := src.Snapshot(&file, nil); err != nil {
		t.Fatal(err)
	}
	return keys, file.Bytes()
}

func TestRestoreAllOrNothing(t *testing.T) {
	_, good := snapshotOf40(t)
	raw := unzstd(t, good)
	flip := func(at int) []byte {
		b := append([]byte(nil), raw...)
		b[at] ^= 0x40
		return mustZstd(t, b)
	}
	_, c2 := testTier(t, 1)
	for name, tc := range map[string]struct {
		data   []byte
		blocks int64
		want   error
	}{
		"last record damaged":  {flip(len(raw) - 13 - 10), 64, ErrBadSnapshot},
		"trailer count wrong":  {flip(len(raw) - 12), 64, ErrBadSnapshot},
		"truncated at the end": {mustZstd(t, raw[:len(raw)-5]), 64, ErrBadSnapshot},
		"data after trailer":   {mustZstd(t, append(append([]byte(nil), raw...), 7)), 64, ErrBadSnapshot},
		"a second frame":       {append(append([]byte(nil), good...), mustZstd(t, []byte("more"))...), 64, ErrBadSnapshot},
		"more than the blocks": {good, 16, ErrNoSpace},
	} {
		dst, err := Create(c2, Config{Name: "r-" + strings.ReplaceAll(name, " ", "-"), Blocks: tc.blocks, BlockBytes: 512, PinsPerClient: 16})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dst.Restore(bytes.NewReader(tc.data), nil); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
		if n := dst.Stats().Ready; n != 0 {
			t.Errorf("%s: %d entries left in the index after a refused restore", name, n)
		}
		dst.Close()
	}
}

// A snapshot of a one-shard index restored into an index of as many blocks
// split in 8 shards: in total it fits, but some shard gets more keys than
// its blocks. The restore is refused before it changes anything (it used
// to report every entry restored while the shard evicted its own).
func TestRestoreChecksEachShard(t *testing.T) {
	_, c := testTier(t, 1)
	src := testStoreShards(t, c, 64, 256, 1)
	keys := keysN(64)
	if st, err := src.Set(keys, payloadsFor(keys, 100)); err != nil || st[63] != Reserved {
		t.Fatal(err)
	}
	var file bytes.Buffer
	if _, err := src.Snapshot(&file, nil); err != nil {
		t.Fatal(err)
	}
	dst, err := Create(c, Config{Name: "eight", Blocks: 64, BlockBytes: 256, PinsPerClient: 64, Shards: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	info, err := dst.Restore(bytes.NewReader(file.Bytes()), nil)
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "shard") {
		t.Fatalf("restore into 8 shards of 8 blocks: %+v, %v", info, err)
	}
	if n := dst.Stats().Ready; n != 0 {
		t.Fatalf("%d entries left after the refused restore", n)
	}
	// Into enough blocks per shard it restores every entry, each findable.
	big, err := Create(c, Config{Name: "big", Blocks: 256, BlockBytes: 256, PinsPerClient: 64, Shards: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	if info, err := big.Restore(bytes.NewReader(file.Bytes()), nil); err != nil || info.Restored != 64 || big.countPresent(keys) != 64 {
		t.Fatalf("restore into 8 shards of 32 blocks: %+v, %v, %d present", info, err, big.countPresent(keys))
	}
}

// swapReader serves first until the first rewind, then second: a snapshot
// file replaced between restore's verify pass and its insert pass.
type swapReader struct {
	*bytes.Reader
	second []byte
	seeks  int
}

func (s *swapReader) Seek(off int64, whence int) (int64, error) {
	if s.seeks++; s.seeks == 1 {
		s.Reader = bytes.NewReader(s.second)
	}
	return s.Reader.Seek(off, whence)
}

// TestRestoreRollsBack drives restore's rollback itself, which the verify
// pass otherwise shields: the file passes verification, then reads damaged
// at its last record while the entries before it are inserted. Those are
// removed again, and what the index held before stays.
func TestRestoreRollsBack(t *testing.T) {
	keys, file := snapshotOf40(t)
	raw := unzstd(t, file)
	damaged := append([]byte(nil), raw...)
	damaged[len(raw)-13-10] ^= 0x40 // the last record's payload
	_, c2 := testTier(t, 1)
	dst := testStore(t, c2, 64, 512)
	before := []Key{keyN(1000), keyN(1001), keyN(5)} // one of them in the snapshot too
	if _, err := dst.Set(before, payloadsFor(before, 200)); err != nil {
		t.Fatal(err)
	}
	_, err := dst.Restore(&swapReader{Reader: bytes.NewReader(file), second: mustZstd(t, damaged)}, nil)
	if !errors.Is(err, ErrBadSnapshot) || !strings.Contains(err.Error(), "entries it had inserted were removed") {
		t.Fatalf("restore of a file damaged between its passes: %v", err)
	}
	if n := dst.Stats().Ready; n != int64(len(before)) {
		t.Fatalf("%d entries after the rollback, want the %d there before", n, len(before))
	}
	if n := dst.Exists(before); n != len(before) {
		t.Fatalf("the rollback removed %d entries that were there before", len(before)-n)
	}
	for _, k := range keys {
		if k != keyN(5) {
			if n := dst.Exists([]Key{k}); n != 0 {
				t.Fatalf("key %v of the refused restore is still there", k)
			}
		}
	}
}

// TestSnapshotAcrossLayouts: a snapshot of a layout-4 index restores into a
// layout-5 one and back (the file carries payload CRCs; each index checks
// its entries as its layout says), and every payload reads back.
func TestSnapshotAcrossLayouts(t *testing.T) {
	_, c := testTier(t, 1)
	keys := keysN(20)
	payloads := make([][]byte, len(keys))
	for i, k := range keys {
		payloads[i] = payloadFor(k, 100+i)
	}
	for _, order := range [][2]uint32{{4, indexVersion}, {indexVersion, 4}} {
		var made []*Store
		for j, v := range order {
			s, err := create(c, Config{Name: fmt.Sprintf("v%d-%d", v, j), Blocks: 32, BlockBytes: 256, PinsPerClient: 16}, v)
			if err != nil {
				t.Fatal(err)
			}
			made = append(made, s)
		}
		src, dst := made[0], made[1]
		if _, err := src.Set(keys, payloads); err != nil {
			t.Fatal(err)
		}
		var file bytes.Buffer
		if _, err := src.Snapshot(&file, nil); err != nil {
			t.Fatal(err)
		}
		if info, err := dst.Restore(bytes.NewReader(file.Bytes()), nil); err != nil || info.Restored != int64(len(keys)) {
			t.Fatalf("layout %d into %d: %+v, %v", order[0], order[1], info, err)
		}
		for i, k := range keys {
			dst1 := [][]byte{make([]byte, 256)}
			if n, err := dst.Get([]Key{k}, dst1); n != 1 || err != nil || !bytes.Equal(dst1[0], payloads[i]) {
				t.Fatalf("layout %d into %d: key %d: %d, %v", order[0], order[1], i, n, err)
			}
		}
		mustCheck(t, dst)
		for _, s := range made {
			s.Close()
		}
	}
}

// evictOnRestoreEnd stands for another client whose inserts evict one of
// the entries a restore made, while it runs: it deletes the key when the
// restore reports the end of its insert pass.
type evictOnRestoreEnd struct {
	s   *Store
	key Key
}

func (e evictOnRestoreEnd) Write(p []byte) (int, error) {
	if bytes.HasPrefix(p, []byte("prefix: restore ")) {
		if n, err := e.s.Delete([]Key{e.key}); err != nil || n != 1 {
			return 0, fmt.Errorf("evicting %v: %d, %v", e.key, n, err)
		}
	}
	return len(p), nil
}

// TestRestoreNoticesEntriesEvictedWhileItRan: every entry the restore made
// must still be there when it finishes, or it fails (no space) and removes
// the rest, leaving what the index held before.
func TestRestoreNoticesEntriesEvictedWhileItRan(t *testing.T) {
	keys, file := snapshotOf40(t)
	_, c := testTier(t, 1)
	dst := testStore(t, c, 64, 512)
	before := []Key{keyN(1000)}
	if _, err := dst.Set(before, payloadsFor(before, 200)); err != nil {
		t.Fatal(err)
	}
	_, err := dst.Restore(bytes.NewReader(file), evictOnRestoreEnd{s: dst, key: keys[7]})
	if !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "evicted before it finished") {
		t.Fatalf("restore that lost an entry while it ran: %v", err)
	}
	if n := dst.Stats().Ready; n != int64(len(before)) {
		t.Fatalf("%d entries after the refused restore, want the %d there before", n, len(before))
	}
}

// TestRestoreRefusesRepeatedKeys: a snapshot that holds a key twice is
// damaged (Snapshot writes each key once) and changes nothing.
func TestRestoreRefusesRepeatedKeys(t *testing.T) {
	_, file := snapshotOf40(t)
	raw := unzstd(t, file)
	// The first record, written again after the last: tag, key, length,
	// CRC, payload; then the trailer's count and the file's CRC made anew.
	first := snapHeaderLen
	n := int(binary.LittleEndian.Uint32(raw[first+1+32:]))
	rec := raw[first : first+1+40+n]
	body := append(append([]byte(nil), raw[:len(raw)-13]...), rec...)
	var tr [13]byte
	binary.LittleEndian.PutUint64(tr[1:], 41)
	body = append(body, tr[:9]...)
	binary.LittleEndian.PutUint32(tr[9:], crc32.Checksum(body, castagnoli))
	dup := mustZstd(t, append(body, tr[9:]...))

	_, c := testTier(t, 1)
	dst := testStore(t, c, 64, 512)
	if _, err := dst.Restore(bytes.NewReader(dup), nil); !errors.Is(err, ErrBadSnapshot) || !strings.Contains(err.Error(), "appears twice") {
		t.Fatalf("restore of a snapshot with a key twice: %v", err)
	}
	if n := dst.Stats().Ready; n != 0 {
		t.Fatalf("%d entries after the refused restore", n)
	}
	// The same file without the repeat restores: the test made it right.
	if _, err := dst.Restore(bytes.NewReader(file), nil); err != nil {
		t.Fatal(err)
	}
}
