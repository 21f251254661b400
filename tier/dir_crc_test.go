package tier

import (
	"errors"
	"testing"
	"time"
)

// TestDirEntryChecksumCoversEveryField: a directory entry's checksum covers
// its fields and its name, so one flipped bit anywhere in them (which may
// still decode as a plausible entry: another name, another offset) reads as
// damage, never as another entry.
func TestDirEntryChecksumCoversEveryField(t *testing.T) {
	e := DirEntry{Name: "prefix/llama-3-8b", Kind: 0x50465831, Offset: 4096, Size: 1 << 20,
		Created: time.Unix(0, 1_700_000_000_000_000_000), Run2: 1 << 22, Run2Size: 1 << 20}
	var b [dirEntryLen]byte
	encodeDirEntry(b[:], e)
	if got, err := decodeDirEntry(b[:], 1<<30); err != nil || got.Name != e.Name || got.Offset != e.Offset {
		t.Fatalf("the entry as written: %+v, %v", got, err)
	}
	for _, at := range []int{4, 8, 16, 24, 32, 40, 48, 64, 64 + len(e.Name) - 1, 64 + len(e.Name)} {
		d := b
		d[at] ^= 0x01 // 'b' <-> 'c' in the name: still a valid name
		if got, err := decodeDirEntry(d[:], 1<<30); !errors.Is(err, ErrCorrupt) && !got.empty() {
			t.Errorf("byte %d flipped: decoded %q at %#x, no error", at, got.Name, got.Offset)
		}
	}
}
