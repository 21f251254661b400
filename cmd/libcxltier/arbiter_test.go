package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/cxltier/cxltier/engram"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/tier/link"
)

// TestKVPoolJoinsTheLink: once its tier joined the node's link, a KV
// pool's store waits while another client's claim is due and goes on when
// the claim ends; the table counts its bytes, its wait and the claims of
// an Engram prefetcher opened on the same tier, whose row calls run on an
// engine of their own (never queued behind a paced copy).
func TestKVPoolJoinsTheLink(t *testing.T) {
	h, other, claimant := joinedWithAClaimant(t, "engine", 4096)
	if got, err := joinArbiter(h, strictLink, 4096); err != nil || got != "t" {
		t.Fatalf("joining again: %q, %v", got, err)
	}
	if _, err := joinArbiter(h, link.Config{Name: "u"}, 4096); !errors.Is(err, errBadArg) {
		t.Fatalf("joining another link: %v, want errBadArg", err)
	}

	ix, err := prefixOpen(h, "m", "", 16, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2*64<<10)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	sp := kvPoolSpec{ptrs: []unsafe.Pointer{unsafe.Pointer(&buf[0])}, lens: []int64{int64(len(buf))}, perLayer: 1,
		chunkBytes: 64 << 10, pageStride: 64 << 10, where: onHost}
	p, err := openKVPool(ix, "cpu", 0, sp, true)
	if err != nil {
		t.Fatal(err)
	}

	claimant.Claim(time.Now().Add(time.Hour))
	stored := make(chan error, 1)
	go func() {
		_, err := p.mover.Put([]prefix.Key{prefix.StringKey("a")}, p.layout, []int64{0})
		stored <- err
	}()
	select {
	case err := <-stored:
		t.Fatalf("the store ran past a due claim: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	claimant.Done(false)
	select {
	case err := <-stored:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the store did not go on when the claim ended")
	}
	if n, err := p.mover.Get([]prefix.Key{prefix.StringKey("a")}, p.layout, []int64{1}); err != nil || n != 1 {
		t.Fatalf("get: %d, %v", n, err)
	}
	if string(buf[:64<<10]) != string(buf[64<<10:]) {
		t.Fatal("the page landed changed")
	}
	runtime.KeepAlive(buf)

	a, _ := tierOf(h)
	pf := engramOn(t, h, a, "cpu", 0, 50*time.Millisecond)
	if pf.eng == p.se.eng {
		t.Fatal("the prefetcher's rows share the paced engine")
	}
	pd, err := pf.Prefetch(1, nil, [][]int64{{3, 4, 5}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pd.Wait(); err != nil {
		t.Fatal(err)
	}

	st, err := link.ReadStats(a.r, "t")
	if err != nil {
		t.Fatal(err)
	}
	// Two pages moved (a store, a load: both bulk on the CPU engine by
	// default), one piece waited; the claimant's claim and the
	// prefetch's. The wait began when the store's goroutine reached its
	// piece, after the 100 ms the claim lasted had started (99.2 ms once,
	// on a loaded machine): half of it is the bound.
	if st.Processes != 2 || st.BulkBytes != 2*64<<10 || st.FirstBytes != 0 || st.FirstTransfers != 0 ||
		st.BulkWaits != 1 || st.BulkWaited < 50*time.Millisecond || st.Claims != 2 {
		t.Fatalf("link stats %+v", st)
	}
	if _, err := link.ReadStats(a.r, "missing"); !errors.Is(err, tier.ErrNotFound) {
		t.Fatalf("stats of a missing table: %v", err)
	}
	if _, err := joinArbiter(other, link.Config{Name: "t"}, -1); !errors.Is(err, errBadArg) {
		t.Fatalf("a negative piece: %v", err)
	}
}

// strictLink is the link table "t" as the tests join it: its movers obey
// claims an hour ahead and wait on them as long as they last, so that a
// slow machine cannot end a wait early.
var strictLink = link.Config{Name: "t", Horizon: time.Hour, FirstHorizon: time.Hour, Window: time.Hour, Share: 1}

// joinedWithAClaimant attaches two clients to a fresh tier: the first,
// named name, joins strictLink with pieces of piece bytes; the second
// opens a seat on it to claim from. Both detach when the test ends.
func joinedWithAClaimant(t *testing.T, name string, piece int64) (h, other uint64, claimant *link.Link) {
	t.Helper()
	devices := formatTest(t)
	h, err := attach(devices, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { detach(h) })
	if other, err = attach(devices, "claimant"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { detach(other) })
	if got, err := joinArbiter(h, strictLink, piece); err != nil || got != "t" {
		t.Fatalf("join: %q, %v", got, err)
	}
	oa, _ := tierOf(other)
	if claimant, err = link.Open(oa.c, link.Config{Name: "t"}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { claimant.Close() })
	return h, other, claimant
}

// TestAKVPoolsLoadGoesAheadOfStores: on a tier that joined the link, a KV
// pool's loads are first-token transfers (a GPU engine's by default, a CPU
// engine's when asked for): while another client's is in
// flight the pool's store waits and its loads (whole-page and layer-wise)
// do not; a pool whose stores are first-token ones (a PD prefill's) does
// not wait either; and the pool's own load holds up another client's bulk
// piece until it ends.
func TestAKVPoolsLoadGoesAheadOfStores(t *testing.T) {
	h, other, claimant := joinedWithAClaimant(t, "engine", 64<<10)
	ix, err := prefixOpen(h, "m", "", 16, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4*64<<10)
	for i := range buf {
		buf[i] = byte(i * 5)
	}
	defer runtime.KeepAlive(buf)
	sp := kvPoolSpec{ptrs: []unsafe.Pointer{unsafe.Pointer(&buf[0])}, lens: []int64{int64(len(buf))}, perLayer: 1,
		chunkBytes: 64 << 10, pageStride: 64 << 10, where: onHost}
	p, err := openKVPool(ix, "cpu", 0, sp, true)
	if err != nil {
		t.Fatal(err)
	}
	key := func(s string) []prefix.Key { return []prefix.Key{prefix.StringKey(s)} }
	if _, err := p.mover.Put(key("a"), p.layout, []int64{0}); err != nil {
		t.Fatal(err)
	}
	if p.mover.FirstToken != nil {
		t.Fatal("a CPU engine's pool has first-token loads by default")
	}
	if err := p.firstToken(1, false); err != nil {
		t.Fatal(err)
	}
	f := claimant.BeginFirst(time.Now().Add(time.Hour))
	returns := func(what string, fn func() error) bool {
		done := make(chan error, 1)
		go func() { done <- fn() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			return true
		case <-time.After(100 * time.Millisecond):
		}
		f.End()
		if err := <-done; err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return false
	}
	if !returns("a whole-page load", func() error { return p.mover.GetAll(key("a"), p.layout, []int64{1}) }) {
		t.Fatal("a KV pool's load waited for another first-token transfer")
	}
	if !returns("a layer-wise load", func() error {
		ld, err := p.mover.StartLoad(key("a"), p.layout, 1, []int64{2})
		if err == nil {
			err = errors.Join(ld.Layer(0), ld.Close())
		}
		return err
	}) {
		t.Fatal("a layer-wise load waited for another first-token transfer")
	}
	if string(buf[:64<<10]) != string(buf[64<<10:2*64<<10]) || string(buf[:64<<10]) != string(buf[2*64<<10:3*64<<10]) {
		t.Fatal("the pages landed differ from the one stored")
	}
	if returns("a store", func() error { _, err := p.mover.Put(key("b"), p.layout, []int64{0}); return err }) {
		t.Fatal("a KV pool's store went ahead of a first-token transfer in flight")
	}
	f = claimant.BeginFirst(time.Now().Add(time.Hour))
	if err := p.firstToken(-1, true); err != nil {
		t.Fatal(err)
	}
	if !returns("a prefill's store", func() error { _, err := p.mover.Put(key("c"), p.layout, []int64{3}); return err }) {
		t.Fatal("a pool's first-token store waited for another first-token transfer")
	}
	f.End()

	// The pool's layer-wise load holds up the other client's bulk piece
	// until its last layer lands.
	oa, _ := tierOf(other)
	bulk, err := link.Open(oa.c, strictLink)
	if err != nil {
		t.Fatal(err)
	}
	defer bulk.Close()
	ld, err := p.mover.StartLoad(key("b"), p.layout, 1, []int64{1})
	if err != nil {
		t.Fatal(err)
	}
	turned := make(chan struct{}) // waited for: the tier must outlive the piece
	go func() { bulk.Turn(1 << 20); close(turned) }()
	select {
	case <-turned:
		t.Fatal("another client's bulk piece went ahead of a KV pool's load in flight")
	case <-time.After(100 * time.Millisecond):
	}
	if err := errors.Join(ld.Layer(0), ld.Close()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-turned:
	case <-time.After(10 * time.Second):
		t.Fatal("a bulk piece still waits after the load landed")
	}
	a, _ := tierOf(h)
	st, err := link.ReadStats(a.r, "t")
	if err != nil {
		t.Fatal(err)
	}
	// The pool's four first-token transfers and the claimant's two.
	if st.FirstTransfers != 6 || st.FirstMisses != 0 || st.FirstBytes != 4*64<<10 || st.BulkBytes != 2*64<<10+1<<20 || st.BulkWaits != 2 {
		t.Fatalf("link stats %+v", st)
	}
}

// engramOn loads a tiny Engram table into tier h and opens a prefetcher
// on engine kind with flags and deadline over it.
func engramOn(t *testing.T, h uint64, a *attached, kind string, flags int, deadline time.Duration) *prefetcher {
	t.Helper()
	g := engram.Geometry{Name: "tiny", LayerIDs: []int{1}, MaxNgram: 3, Heads: 2, BaseSizes: []int64{500, 600},
		Seed: 7, Vocab: 300, PadID: 2, RowBytes: 64, DType: "float32"}
	hs, err := engram.NewHasher(g)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := engram.CreateTable(a.c, g, hs, 1, func(row int64, b []byte) error { engram.SyntheticRow(1, row, b); return nil }, nil); err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(g)
	pf, err := openEngram(h, string(spec), kind, 0, 256, flags, deadline)
	if err != nil {
		t.Fatal(err)
	}
	return pf
}

// TestEveryEngineJoinsTheLink: joining the link paces the block calls of
// every engine of the tier, the CPU engine and the device engines (the
// interpreter standing in for a GPU here, CUDA where there is one), those
// opened before the join and those opened after: a block call waits while
// another client's claim is due and goes on when it ends.
func TestEveryEngineJoinsTheLink(t *testing.T) {
	for _, kind := range engineKinds(t) {
		for _, before := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/opened-before-the-join=%v", kind, before), func(t *testing.T) {
				testEngineJoinsTheLink(t, kind, before)
			})
		}
	}
}

func testEngineJoinsTheLink(t *testing.T, kind string, openFirst bool) {
	devices := formatTest(t)
	h, err := attach(devices, "engine")
	if err != nil {
		t.Fatal(err)
	}
	defer detach(h)
	other, err := attach(devices, "claimant")
	if err != nil {
		t.Fatal(err)
	}
	defer detach(other)
	a, _ := tierOf(h)
	var se *sharedEngine
	open := func() {
		if se, err = a.engines.acquire(kind, 0, a.r.NumDevices(), a.r.Device); err != nil {
			t.Fatal(err)
		}
	}
	if openFirst {
		open()
	}
	if _, err := joinArbiter(h, strictLink, 4096); err != nil {
		t.Fatal(err)
	}
	if !openFirst {
		open()
	}
	defer a.engines.release(se)
	oa, _ := tierOf(other)
	claimant, err := link.Open(oa.c, link.Config{Name: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer claimant.Close()

	const chunk, pages = 4096, 4
	buf, err := se.eng.Alloc(pages * chunk)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Free()
	b := kernels.Blocks{ChunkBytes: chunk, Chunks: []kernels.Span{{Buf: buf}}, CRCs: make([]uint32, pages)}
	for i := range pages {
		b.Tier, b.Pages = append(b.Tier, kernels.At(se.ids[0], int64(i)*chunk)), append(b.Pages, int64(i))
	}
	claimant.Claim(time.Now().Add(time.Hour))
	moved := make(chan error, 1)
	go func() {
		h, err := se.eng.GatherBlocks(b)
		if err == nil {
			err = h.Wait()
		}
		moved <- err
	}()
	select {
	case err := <-moved:
		t.Fatalf("a block call ran past a due claim: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	claimant.Done(false)
	select {
	case err := <-moved:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the block call did not go on when the claim ended")
	}
	st, err := link.ReadStats(a.r, "t")
	if err != nil {
		t.Fatal(err)
	}
	if st.BulkBytes != pages*chunk || st.BulkWaits < 1 {
		t.Fatalf("link stats %+v: want %d bulk bytes and a wait", st, pages*chunk)
	}
}

// TestAFillsCommitGivesWayToDeadlines: on a tier that joined the link, a
// cluster fill's commit reads every page it checks as bulk traffic: it
// waits while another client's claim is due, goes on when the claim ends,
// publishes what matches its checksum, and the table counts the pages'
// bytes and the wait.
func TestAFillsCommitGivesWayToDeadlines(t *testing.T) {
	h, other, claimant := joinedWithAClaimant(t, "uplink", 0)
	oa, _ := tierOf(other)
	ixh, err := prefixOpen(h, "m", "", 16, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	s, err := get[*index](&handles, ixh)
	if err != nil {
		t.Fatal(err)
	}
	keys := []prefix.Key{prefix.StringKey("a"), prefix.StringKey("b"), prefix.StringKey("c")}
	sizes := []int64{64 << 10, 1000, 40 << 10}
	id, st, err := fillBegin(s, keys, sizes)
	if err != nil {
		t.Fatal(err)
	}
	fl, err := get[*filling](&handles, id)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := fl.f.Blocks()
	if err != nil {
		t.Fatal(err)
	}
	want := make([]uint32, len(keys))
	for i, b := range blocks {
		if st[i] != prefix.Reserved {
			t.Fatalf("key %d: %v", i, st[i])
		}
		for j := range b {
			b[j] = byte(i*31 + j)
		}
		want[i] = prefix.WireChecksum(keys[i], b)
	}
	blocks[1][7] ^= 1 // damaged in transit: checked, and refused

	claimant.Claim(time.Now().Add(time.Hour))
	type result struct {
		ok  []bool
		err error
	}
	committed := make(chan result, 1)
	go func() {
		ok, err := fl.f.Commit([]bool{true, true, true}, prefix.WantChecksums(func(i int) prefix.Key { return keys[i] }, want))
		committed <- result{ok, err}
	}()
	select {
	case r := <-committed:
		t.Fatalf("the commit read its pages past a due claim: %v, %v", r.ok, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	claimant.Done(false)
	select {
	case r := <-committed:
		if r.err != nil || !r.ok[0] || r.ok[1] || !r.ok[2] {
			t.Fatalf("commit: %v, %v; want [true false true]", r.ok, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the commit did not go on when the claim ended")
	}
	handles.forgetChild(id, fl.child)
	ls, err := link.ReadStats(oa.r, "t")
	if err != nil {
		t.Fatal(err)
	}
	if ls.BulkBytes != uint64(sizes[0]+sizes[1]+sizes[2]) || ls.BulkWaits < 1 || ls.BulkWaited < 50*time.Millisecond {
		t.Fatalf("link stats %+v: want the three pages' %d bytes and a wait", ls, sizes[0]+sizes[1]+sizes[2])
	}
}
