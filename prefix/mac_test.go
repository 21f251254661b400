package prefix

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/cxltier/cxltier/internal/tiertest"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
)

// The signature tests' forger is another process of the tier's group that
// lacks the index's key: it maps the tier, finds a page's entry as any
// reader of the layout could, writes bytes of its own into the block and
// the CRC-32C of them into the entry. Everything a checksum checks then
// holds; only a signature can tell.
const (
	envIndex = "CXLTIER_PREFIX_FORGE_INDEX"
	macIndex = "signed"
	macKey   = "tenant-secret"
	macLayer = 256 // bytes of one K or V chunk of a page: 2 layers × K, V
)

func forgedKeys() []Key { return []Key{keyN(1), keyN(2)} }

// forgedPayload is what the forger writes in place of key k's page.
func forgedPayload(k Key, n int) []byte { return bytes.Repeat([]byte{k[0] ^ 0x5a}, n) }

// runForger forges every page of forgedKeys in the index named in the
// environment, through a maintenance handle (which needs no key).
func runForger() error {
	c, err := tiertest.Attach(os.Getenv(envDevices), "forger")
	if err != nil {
		return err
	}
	defer c.Close()
	s, err := Maintain(c, os.Getenv(envIndex))
	if err != nil {
		return err
	}
	defer s.Close()
	for _, k := range forgedKeys() {
		i, w, ok := s.find(&k)
		if !ok || wordState(w) != stReady {
			return fmt.Errorf("forger: %v not ready", k)
		}
		e := s.entry(i)
		n := int64(atomic.LoadUint32(u32At(e, entLen)))
		dst, err := s.r.Slice(s.blockAt(atomic.LoadUint32(u32At(e, entBlock))), n)
		if err != nil {
			return err
		}
		fake := forgedPayload(k, int(n))
		copy(dst, fake)
		atomic.StoreUint32(u32At(e, entCRC), s.Checksum(k, fake))
	}
	fmt.Println("forged")
	return nil
}

// forge runs the forger over index on r's tier and waits for it.
func forge(t *testing.T, r *tier.Region, index string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=forger", envIndex+"="+index, envDevices+"="+strings.Join(r.Info().Devices, ","))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if out, err := cmd.Output(); err != nil || string(out) != "forged\n" {
		t.Fatalf("forger said %q: %v", out, err)
	}
}

// signedPages stores forgedKeys' pages from a 2-layer K/V pool of the CPU
// engine into a new index (keyed with key, unless it is empty).
func signedPages(t *testing.T, key string) (*tier.Region, *Store, *Mover, Layout, [][]byte) {
	t.Helper()
	r, c := testTier(t, 1)
	s, err := Create(c, Config{Name: macIndex, Blocks: 8, BlockBytes: 4 * macLayer, PinsPerClient: 64, Key: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	eng := kernels.NewCPU(2)
	t.Cleanup(func() { eng.Close() })
	l, raw := layeredPool(t, eng, 2, 4, macLayer)
	m, err := NewMover(s, eng, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if st, err := m.Put(forgedKeys(), l, []int64{0, 1}); err != nil || st[0] != Reserved || st[1] != Reserved {
		t.Fatalf("Put = %v, %v", st, err)
	}
	return r, s, m, l, raw
}

// A reader is one way a page leaves a keyed index; it returns what it
// served of the first forged key, or why it refused.
type reader func(t *testing.T, s *Store, m *Mover, l Layout, raw [][]byte) ([]byte, error)

var macReaders = map[string]reader{
	"get": func(t *testing.T, s *Store, _ *Mover, _ Layout, _ [][]byte) ([]byte, error) {
		dst := [][]byte{make([]byte, 4*macLayer)}
		_, err := s.Get(forgedKeys()[:1], dst)
		return dst[0], err
	},
	"get with VerifyReads off": func(t *testing.T, s *Store, _ *Mover, _ Layout, _ [][]byte) ([]byte, error) {
		s.VerifyReads(false)
		defer s.VerifyReads(true)
		dst := [][]byte{make([]byte, 4*macLayer)}
		_, err := s.Get(forgedKeys()[:1], dst)
		return dst[0], err
	},
	"get pieces": func(t *testing.T, s *Store, _ *Mover, _ Layout, _ [][]byte) ([]byte, error) {
		a, b := make([]byte, macLayer), make([]byte, 3*macLayer)
		_, err := s.GetPieces(forgedKeys()[:1], [][][]byte{{a, b}})
		return append(a, b...), err
	},
	"mover get": func(t *testing.T, _ *Store, m *Mover, l Layout, raw [][]byte) ([]byte, error) {
		_, err := m.Get(forgedKeys()[:1], l, []int64{3})
		return poolPage(raw, 3), err
	},
	"mover get with Verify off": func(t *testing.T, _ *Store, m *Mover, l Layout, raw [][]byte) ([]byte, error) {
		m.Verify = false
		defer func() { m.Verify = true }()
		_, err := m.Get(forgedKeys()[:1], l, []int64{3})
		return poolPage(raw, 3), err
	},
	"layer load": func(t *testing.T, _ *Store, m *Mover, l Layout, raw [][]byte) ([]byte, error) {
		ld, err := m.StartLoad(forgedKeys()[:1], l, 2, []int64{3})
		if err != nil {
			return nil, err
		}
		defer ld.Close()
		for layer := range 2 {
			if err = ld.Layer(layer); err != nil {
				break
			}
		}
		return poolPage(raw, 3), err
	},
	"verify hit": func(t *testing.T, s *Store, _ *Mover, _ Layout, _ [][]byte) ([]byte, error) {
		return inPlace(t, s, func(h Hit) error { return s.VerifyHit(h) })
	},
	"wire payload": func(t *testing.T, s *Store, _ *Mover, _ Layout, _ [][]byte) ([]byte, error) {
		return inPlace(t, s, func(h Hit) error { _, _, _, err := s.WirePayload(h); return err })
	},
	// A snapshot leaves a page out rather than fail the whole file; it
	// reports here as a refusal of the page.
	"snapshot": func(t *testing.T, s *Store, _ *Mover, _ Layout, _ [][]byte) ([]byte, error) {
		var out bytes.Buffer
		info, err := s.Snapshot(&out, io.Discard)
		if err == nil && info.Entries != int64(len(forgedKeys())) {
			err = fmt.Errorf("snapshot of %d entries: %w", info.Entries, ErrUnsigned)
		}
		return out.Bytes(), err
	},
}

// poolPage is page p of a 2-layer pool as the chunks hold it, in a tier
// block's order.
func poolPage(raw [][]byte, p int64) []byte {
	var out []byte
	for _, b := range raw {
		out = append(out, b[p*macLayer:(p+1)*macLayer]...)
	}
	return out
}

// inPlace checks the first forged key's page in place with check and
// returns the page as the tier holds it.
func inPlace(t *testing.T, s *Store, check func(Hit) error) ([]byte, error) {
	hits, err := s.Lookup(forgedKeys()[:1])
	if err != nil || len(hits) != 1 {
		t.Fatalf("lookup: %d hits, %v", len(hits), err)
	}
	defer s.Release(hits)
	b, _ := s.Payload(hits[0])
	return append([]byte(nil), b...), check(hits[0])
}

// TestAPageForgedWithoutTheKeyIsRefused: a process without the tenant key
// replaces a keyed index's page with bytes of its own and a valid CRC;
// every way a page leaves the index refuses it (ErrUnsigned) and drops it,
// so the next lookup misses and the writer that has the key can store it
// again. Before the forgery each reader serves the page, and the same
// forgery in an index without a key is served: that index trusts every
// writer of the tier, as docs/operations.md says.
func TestAPageForgedWithoutTheKeyIsRefused(t *testing.T) {
	for name, read := range macReaders {
		t.Run(name, func(t *testing.T) {
			r, s, m, l, raw := signedPages(t, macKey)
			want := poolPage(raw, 0)
			if got, err := read(t, s, m, l, raw); err != nil || (name != "snapshot" && !bytes.Equal(got, want)) {
				t.Fatalf("before the forgery: %v (page equal: %v)", err, bytes.Equal(got, want))
			}
			forge(t, r, macIndex)
			_, err := read(t, s, m, l, raw)
			if !errors.Is(err, ErrUnsigned) {
				t.Fatalf("forged page: %v; want ErrUnsigned", err)
			}
			if name == "verify hit" || name == "wire payload" || name == "snapshot" {
				return // read in place, or out of a whole index: nothing dropped
			}
			if hits, err := s.Lookup(forgedKeys()[:1]); err != nil || len(hits) != 0 {
				s.Release(hits)
				t.Fatalf("a refused page was kept: %d hits, %v", len(hits), err)
			}
			if st, err := m.Put(forgedKeys()[:1], l, []int64{0}); err != nil || st[0] != Reserved {
				t.Fatalf("store again: %v, %v", st, err)
			}
			if got, err := read(t, s, m, l, raw); err != nil || !bytes.Equal(got, want) {
				t.Fatalf("stored again: %v (page equal: %v)", err, bytes.Equal(got, want))
			}
		})
	}
	t.Run("no key", func(t *testing.T) {
		r, s, m, l, raw := signedPages(t, "")
		forge(t, r, macIndex)
		got, err := macReaders["mover get"](t, s, m, l, raw)
		if err != nil || !bytes.Equal(got, forgedPayload(forgedKeys()[0], len(got))) {
			t.Fatalf("an index without a key: %v (forged page served: %v)", err, bytes.Equal(got, forgedPayload(forgedKeys()[0], len(got))))
		}
	})
}

// TestASignatureCoversKeyAndIndex: a signed page, signature and all, moved
// under another key of the index, or into another index of the same
// tenant key, is refused there.
func TestASignatureCoversKeyAndIndex(t *testing.T) {
	_, c := testTier(t, 1)
	open := func(name string) *Store {
		s, err := Create(c, Config{Name: name, Blocks: 8, BlockBytes: 512, PinsPerClient: 64, Key: macKey})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b := open("a"), open("b")
	ka, kb := keyN(1), keyN(2)
	for _, s := range []*Store{a, b} {
		if _, err := s.Set([]Key{ka, kb}, [][]byte{payloadFor(ka, 500), payloadFor(kb, 500)}); err != nil {
			t.Fatal(err)
		}
	}
	// copy puts from's page of key fk, its signature and a CRC valid for
	// the new place, where to holds key tk.
	copyPage := func(from *Store, fk Key, to *Store, tk Key) {
		hf, _ := from.Lookup([]Key{fk})
		ht, _ := to.Lookup([]Key{tk})
		defer from.Release(hf)
		defer to.Release(ht)
		src, _ := from.Payload(hf[0])
		dst, _ := to.Payload(ht[0])
		copy(dst, src)
		e := to.entry(ht[0].entry)
		atomic.StoreUint32(u32At(e, entCRC), to.Checksum(tk, src))
		storeMAC(e, from.loadMAC(hf[0].entry))
	}
	copyPage(a, ka, a, kb)
	copyPage(a, ka, b, ka)
	for _, c := range []struct {
		s *Store
		k Key
	}{{a, kb}, {b, ka}} {
		if _, err := c.s.Get([]Key{c.k}, [][]byte{make([]byte, 500)}); !errors.Is(err, ErrUnsigned) {
			t.Errorf("%s %v: %v; want ErrUnsigned", c.s.name, c.k, err)
		}
	}
	if _, err := a.Get([]Key{ka}, [][]byte{make([]byte, 500)}); err != nil {
		t.Errorf("the original: %v", err)
	}
}

// TestFillsAndRestoresAreSigned: the pages a keyed index gets other than
// by a store (a cluster fill, a snapshot restored) are signed, and read.
func TestFillsAndRestoresAreSigned(t *testing.T) {
	_, c := testTier(t, 1)
	s, err := Create(c, Config{Name: "f", Blocks: 8, BlockBytes: 512, PinsPerClient: 64, Key: macKey})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k := keyN(7)
	f, err := s.BeginFill([]Key{k}, []int64{400})
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := f.Blocks()
	if err != nil {
		t.Fatal(err)
	}
	copy(blocks[0], payloadFor(k, 400))
	want := WireChecksum(k, payloadFor(k, 400))
	if ok, err := f.Commit([]bool{true}, WantChecksums(func(int) Key { return k }, []uint32{want})); err != nil || !ok[0] {
		t.Fatalf("commit: %v, %v", ok, err)
	}
	dst := [][]byte{make([]byte, 400)}
	if n, err := s.Get([]Key{k}, dst); n != 1 || err != nil || !bytes.Equal(dst[0], payloadFor(k, 400)) {
		t.Fatalf("filled page: %d, %v", n, err)
	}
	var snap bytes.Buffer
	if _, err := s.Snapshot(&snap, io.Discard); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Delete([]Key{k}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Restore(bytes.NewReader(snap.Bytes()), io.Discard); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Get([]Key{k}, dst); n != 1 || err != nil || !bytes.Equal(dst[0], payloadFor(k, 400)) {
		t.Fatalf("restored page: %d, %v", n, err)
	}
}

// TestKeyedIndexesBeforeSignaturesAreRefused: a keyed index of layout 5
// keeps no signatures, so OpenKey refuses it, saying how to move it (a
// header rewritten to say 5 cannot turn the checks off); OpenToMove still
// opens it for the move.
func TestKeyedIndexesBeforeSignaturesAreRefused(t *testing.T) {
	_, c := testTier(t, 1)
	_, err := create(c, Config{Name: "old", Blocks: 4, BlockBytes: 256, PinsPerClient: 8, Key: macKey}, 5)
	if !errors.Is(err, ErrBadIndex) || !strings.Contains(err.Error(), "prefix snapshot") {
		t.Fatalf("OpenKey of a keyed layout 5: %v", err)
	}
	s, err := OpenToMove(c, "old", macKey)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}
