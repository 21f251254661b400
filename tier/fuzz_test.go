package tier

import (
	"encoding/binary"
	"testing"
)

// FuzzParseControl feeds arbitrary bytes to the code that validates a
// control area (header, area headers, root directory) before Open trusts
// it. It must never panic, and whatever it accepts must be self-consistent.
func FuzzParseControl(f *testing.F) {
	g := testGeometry()
	g.DeviceSize = 1 << 20
	g.ChunkSize, g.Stripe = 4096, 4096
	g.ClientsPerNode, g.LockSlots, g.DirEntries = 4, 4, 8
	r, err := Format(Options{Devices: []Backing{{Kind: BackingAnon}}, Geometry: g})
	if err != nil {
		f.Fatal(err)
	}
	c, err := r.Attach(ClientOptions{})
	if err != nil {
		f.Fatal(err)
	}
	if err := c.DirPut(DirEntry{Name: "table", Kind: 3, Offset: r.DataStart(), Size: 100}); err != nil {
		f.Fatal(err)
	}
	seed := append([]byte(nil), r.ctl...)
	c.Close()
	r.Close()
	f.Add(seed)
	f.Add(seed[:headerLen])
	bad := append([]byte(nil), seed...)
	binary.LittleEndian.PutUint32(bad[8:], 99)
	f.Add(bad)
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := parseControl(b)
		if err != nil {
			return
		}
		if int64(len(b)) < l.ControlSize || l.ChunkCount <= 0 || l.size() <= l.ControlSize {
			t.Fatalf("accepted inconsistent layout %+v for %d bytes", l, len(b))
		}
		for i := 0; i < l.DirEntries; i++ {
			e := b[l.DirOff+areaHeaderLen+int64(i)*dirEntryLen:][:dirEntryLen]
			d, err := decodeDirEntry(e, l.size())
			if err != nil {
				continue // each reader refuses a damaged entry by itself
			}
			if !d.empty() && !d.torn() && uint64(d.Offset)+uint64(d.Size) > uint64(l.size()) {
				t.Fatalf("entry %d outside region", i)
			}
		}
	})
}

// FuzzObjectHeader feeds arbitrary header pages to the decoder of named
// objects (written by any process of any host, so untrusted): it must
// never panic, and what it accepts must fit the object's span.
func FuzzObjectHeader(f *testing.F) {
	var h [objectHeader]byte
	o := Object{Name: "seed", Size: 5000, Contiguous: true, State: ObjectSealed, Sum: 7, Label: "a label", Seals: 1}
	le := binary.LittleEndian
	le.PutUint64(h[0:], objectMagic)
	le.PutUint32(h[8:], objectVersion)
	le.PutUint64(h[16:], uint64(o.Size))
	le.PutUint32(h[60:], crcOf(h[:60]))
	encodeSeal(h[objectSealAt:objectSealAt+objectSealLen], o)
	f.Add(h[:], int64(1<<20))
	f.Add(h[:], int64(8192))
	f.Add(h[:100], int64(1<<20))
	f.Fuzz(func(t *testing.T, b []byte, span int64) {
		if len(b) < objectSealAt+objectSealLen {
			return // readObject always reads a whole page
		}
		var got Object
		if err := decodeObjectHeader(b, &got, span); err != nil {
			return
		}
		if got.Size <= 0 || got.Size > span-objectHeader || len(got.Label) > objectLabel {
			t.Fatalf("accepted %+v in a span of %d", got, span)
		}
		if got.State != ObjectSealed && got.State != ObjectUnsealed {
			t.Fatalf("accepted state %v", got.State)
		}
	})
}
