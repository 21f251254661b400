package prefix

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

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
	if !strings.Contains(progress.String(), "50 entries (100%)") {
		t.Fatalf("progress: %q", progress.String())
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
