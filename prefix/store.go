package prefix

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"hash/fnv"
	"sync/atomic"
	"time"

	"github.com/cxltier/cxltier/tier"
)

// Config sizes a new index. Blocks and BlockBytes are required.
type Config struct {
	Name       string // namespace (a model or tenant); the directory name is "prefix/<Name>"
	Blocks     int64  // payload blocks: how many entries can be ready at once
	BlockBytes int64  // the largest payload one entry holds
	// Entries is the table size, a power of two; 0 picks the smallest one
	// with at least twice Blocks, so probes stay short.
	Entries int64
	// PinsPerClient bounds how many entries one client holds pinned at
	// once; 0 means four per block, at least 256 and at most 16384. Pin
	// tables take 8 bytes per pin per client slot of the tier.
	PinsPerClient int64
	// LockID is the tier lock guarding the first shard's mutations (the
	// next shards take the locks after it); 0 derives one from Name among
	// the locks above tier.FirstUserLock.
	LockID int
	// Shards splits the entries, blocks and LRU order into that many parts,
	// each with its own lock, so that inserts from several processes do not
	// wait on one another: a power of two up to 32 (and the tier's user
	// locks). 0 picks one shard per 512 blocks, at most 8; eviction then
	// frees the least recently used entry of the key's shard.
	Shards int
	// Key, when set, is the tenant's secret: only clients that open the
	// index with it (OpenKey) can read, write or delete its entries. The
	// index keeps a digest, not the key.
	Key string
}

// Default sharding: one shard per blocksPerShard blocks, at most
// defaultShards. Eviction is least recently used within a shard, which on
// a few hundred blocks or more is as good as one list.
const (
	defaultShards  = 8
	blocksPerShard = 512
)

// keyDigest is what an index stores of its key (zero for no key).
func keyDigest(name, key string) [keyDigestLen]byte {
	if key == "" {
		return [keyDigestLen]byte{}
	}
	return sha256.Sum256([]byte("cxltier prefix key\x00" + name + "\x00" + key))
}

// DirName is the root-directory name of the index called name.
func DirName(name string) string { return "prefix/" + name }

// Store is one client's handle on an index. Its methods are safe for
// concurrent use by the goroutines of one process; each process (tier
// client) opens an index once. A Store works on the Region's mapping
// directly: Close it before the Region. Calls after the Region closed
// return tier.ErrClosed (or nothing), but one racing with the Region's
// Close may fault.
type Store struct {
	c      *tier.Client
	r      *tier.Region
	name   string
	g      geometry
	meta   tier.Offset // start of the metadata run
	one    []byte      // device 0 when the tier has one device: offsets are direct
	ents   []byte      // the entry table, when one is set: entry needs no call
	shared bool        // non-coherent tier: publish and refresh metadata lines
	hdr    []byte
	maint  bool     // opened by Maintain: counters and upkeep only, no entries
	ns     string   // the index's name across nodes (Namespace)
	tenant []byte   // TenantSecret: nil for an index without a key
	mac    *pageMAC // signs and checks pages: nil for an index without a key (mac.go)

	blockOff []tier.Offset // tier offset of every payload block (use blockAt)

	shards     []shard
	shardShift uint          // a key hash's top bits pick its shard
	shardTurn  atomic.Uint32 // where the next batch starts its round of the shards (byShard)

	// perClient: the index keeps its hot counters per client (version 3).
	perClient bool

	myPins     []byte       // this client's pin-table header
	myCounters []byte       // this client's counter line (version 3)
	myRecs     []byte       // this client's pin records, when one is set
	slot       int          // this client's lease slot: its pin table
	pinHint    atomic.Int32 // where a claim starts looking for a free record
	pinsClosed atomic.Bool  // Close gave the pin table up
	poisoned   atomic.Bool  // a mutation panicked: this handle's state is not to be trusted
	skipVerify atomic.Bool  // VerifyReads(false)
	unregister func() bool  // takes the index off its client's closers

	sim *cacheSim // tests only: this handle's host keeps caches of its own
	// flushedData, in tests, sees each range of payload bytes this handle
	// flushes for other hosts (a fill's blocks, a block's slack) as it
	// flushes them.
	flushedData func(off tier.Offset, n int64)
}

// flushData writes back this host's cached copies of payload bytes that
// it wrote in place, before anything makes them another host's to read.
func (s *Store) flushData(off tier.Offset, n int64) error {
	if s.flushedData != nil {
		s.flushedData(off, n)
	}
	return s.r.Publish(off, n)
}

// Create allocates and formats an index in the tier, registers it in the
// root directory, and opens it for c.
func Create(c *tier.Client, cfg Config) (*Store, error) { return create(c, cfg, indexVersion) }

// create is Create writing the layout of a given version (tests make the
// older ones, which this build still reads): before version 3 an index is
// one shard and keeps its counters in its header.
func create(c *tier.Client, cfg Config, version uint32) (*Store, error) {
	r := c.Region()
	if version < 3 {
		cfg.Shards = 1
	}
	g, err := configGeometry(r, cfg)
	if err != nil {
		return nil, err
	}
	g.Version = version
	// Checked first so that a taken name is reported as such rather than as
	// a lack of space for a second copy; DirPut below still settles a race.
	if _, err := r.DirLookup(DirName(cfg.Name)); err == nil {
		return nil, fmt.Errorf("prefix: create %q: %w", cfg.Name, tier.ErrExists)
	}
	g.KeyDigest = keyDigest(cfg.Name, cfg.Key)
	metaBytes := g.place()
	chunk := r.ChunkSize()
	g.MetaChunks = (metaBytes + chunk - 1) / chunk
	g.PayloadChunks = (payloadSpan(r, g.Blocks, g.BlockStride) + chunk - 1) / chunk
	meta, err := c.AllocChunks(g.MetaChunks)
	if err != nil {
		return nil, fmt.Errorf("prefix: create %q: metadata (%d bytes): %w", cfg.Name, metaBytes, err)
	}
	payload, err := c.AllocChunks(g.PayloadChunks)
	if err != nil {
		c.FreeChunks(meta, g.MetaChunks)
		return nil, fmt.Errorf("prefix: create %q: payload (%d blocks × %d B): %w", cfg.Name, g.Blocks, g.BlockBytes, err)
	}
	g.PayloadOff = int64(payload)
	g.Created = time.Now()
	if err := initMeta(r, meta, &g); err != nil {
		c.FreeChunks(meta, g.MetaChunks)
		c.FreeChunks(payload, g.PayloadChunks)
		return nil, err
	}
	undo := func(err error) (*Store, error) {
		c.FreeChunks(meta, g.MetaChunks)
		c.FreeChunks(payload, g.PayloadChunks)
		return nil, err
	}
	if err := c.ShareChunks(meta, g.MetaChunks); err != nil {
		return undo(fmt.Errorf("prefix: create %q: %w", cfg.Name, err))
	}
	if err := c.ShareChunks(payload, g.PayloadChunks); err != nil {
		return undo(fmt.Errorf("prefix: create %q: %w", cfg.Name, err))
	}
	e := tier.DirEntry{Name: DirName(cfg.Name), Kind: DirKind, Offset: meta, Size: g.MetaChunks * chunk,
		Run2: payload, Run2Size: g.PayloadChunks * chunk}
	if err := c.DirPut(e); err != nil {
		return undo(fmt.Errorf("prefix: create %q: %w", cfg.Name, err))
	}
	return OpenKey(c, cfg.Name, cfg.Key)
}

func configGeometry(r *tier.Region, cfg Config) (geometry, error) {
	if cfg.Name == "" {
		return geometry{}, fmt.Errorf("prefix: %w: empty index name", ErrBadConfig)
	}
	g := geometry{Blocks: cfg.Blocks, BlockBytes: cfg.BlockBytes, Entries: cfg.Entries,
		Pins: cfg.PinsPerClient, Clients: int64(r.MaxClients()), LockID: cfg.LockID, Shards: int64(cfg.Shards)}
	if g.Entries == 0 {
		g.Entries = 2
		for g.Entries < 2*g.Blocks && g.Entries < maxEntries {
			g.Entries *= 2
		}
	}
	if g.Pins == 0 {
		g.Pins = min(max(4*g.Blocks, 256), 16384)
	}
	g.BlockStride = alignUp(max(g.BlockBytes, 1), lineSize)
	locks := r.Info().Geometry.LockSlots
	if g.Shards == 0 {
		g.Shards = 1
		for g.Shards < defaultShards && g.Blocks >= 2*g.Shards*blocksPerShard && g.Shards*2 <= int64(locks-tier.FirstUserLock) {
			g.Shards *= 2
		}
	}
	if g.LockID == 0 {
		if locks <= tier.FirstUserLock {
			return g, fmt.Errorf("prefix: %w: the tier has no user locks (%d slots)", ErrBadConfig, locks)
		}
		h := fnv.New32a()
		h.Write([]byte(cfg.Name))
		g.LockID = tier.FirstUserLock + int(h.Sum32()%uint32(locks-tier.FirstUserLock))
	}
	if g.LockID < tier.FirstUserLock || g.LockID >= locks {
		return g, fmt.Errorf("prefix: %w: lock %d not in [%d,%d)", ErrBadConfig, g.LockID, tier.FirstUserLock, locks)
	}
	if g.Shards > int64(locks-tier.FirstUserLock) {
		return g, fmt.Errorf("prefix: %w: %d shards need as many locks, the tier has %d user locks", ErrBadConfig, g.Shards, locks-tier.FirstUserLock)
	}
	if stripe := r.Info().Geometry.Stripe; r.NumDevices() > 1 && g.BlockStride > stripe {
		return g, fmt.Errorf("prefix: %w: %d-byte blocks exceed the %d-byte stripe of a %d-device tier",
			ErrBadConfig, g.BlockBytes, stripe, r.NumDevices())
	}
	if err := g.check(); err != nil {
		return g, fmt.Errorf("prefix: index %q: %w", cfg.Name, err)
	}
	return g, nil
}

// payloadSpan is the tier space n blocks need: packed end to end on one
// device; on a striped tier packed per stripe so none crosses a boundary,
// with one stripe of slack for a run that starts mid-stripe.
func payloadSpan(r *tier.Region, n, stride int64) int64 {
	if r.NumDevices() == 1 {
		return n * stride
	}
	stripe := r.Info().Geometry.Stripe
	per := stripe / stride
	return (n+per-1)/per*stripe + stripe
}

// blockOffsets places the blocks of a payload run starting at base.
func blockOffsets(r *tier.Region, base tier.Offset, n, stride int64) []tier.Offset {
	out := make([]tier.Offset, n)
	stripe := r.Info().Geometry.Stripe
	data := int64(r.DataStart())
	pos := int64(base)
	for b := range out {
		if r.NumDevices() > 1 {
			within := (pos - data) % stripe
			if within+stride > stripe {
				pos += stripe - within
			}
		}
		out[b] = tier.Offset(pos)
		pos += stride
	}
	return out
}

// initMeta zeroes the metadata run and writes the header.
func initMeta(r *tier.Region, meta tier.Offset, g *geometry) error {
	size := g.MetaChunks * r.ChunkSize()
	zero := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(zero)) {
		n := min(int64(len(zero)), size-off)
		if err := r.WriteAt(zero[:n], meta+tier.Offset(off)); err != nil {
			return fmt.Errorf("prefix: clear metadata: %w", err)
		}
	}
	hdr := make([]byte, headerBytes)
	g.encode(hdr)
	if err := r.WriteAt(hdr, meta); err != nil {
		return fmt.Errorf("prefix: write header: %w", err)
	}
	return r.Publish(meta, size)
}

// Open opens the index called name for client c.
func Open(c *tier.Client, name string) (*Store, error) { return open(c, name, "", false, false) }

// OpenKey opens an index created with Config.Key = key (ErrDenied for a
// wrong key, or for a key given to an index that has none).
func OpenKey(c *tier.Client, name, key string) (*Store, error) {
	return open(c, name, key, false, false)
}

// OpenToMove is OpenKey for taking an index's entries elsewhere (a
// snapshot): it also opens an index whose layout a tier shared without
// coherence cannot serve safely, which Open and OpenKey refuse there. Read
// its entries with Snapshot; do not insert through it.
func OpenToMove(c *tier.Client, name, key string) (*Store, error) {
	return open(c, name, key, false, true)
}

// Maintain opens any index, keyed or not, for upkeep by the operator's
// daemon and tools: Stats, Check, Reclaim and Close work; calls that read,
// write or delete entries fail with ErrDenied (Exists sees nothing).
func Maintain(c *tier.Client, name string) (*Store, error) { return open(c, name, "", true, true) }

func open(c *tier.Client, name, key string, maint, anyLayout bool) (*Store, error) {
	h, err := c.Hold()
	if err != nil {
		return nil, fmt.Errorf("prefix: open %q: %w", name, err)
	}
	defer h.Done()
	r := c.Region()
	de, err := r.DirLookup(DirName(name))
	if err != nil {
		return nil, fmt.Errorf("prefix: open %q: %w", name, err)
	}
	if de.Kind != DirKind {
		return nil, fmt.Errorf("prefix: open %q: %w: directory kind %#x", name, ErrBadIndex, de.Kind)
	}
	hdr, err := r.Slice(de.Offset, headerBytes)
	if err != nil {
		return nil, fmt.Errorf("prefix: open %q: %w", name, err)
	}
	r.Refresh(de.Offset, headerBytes)
	g, err := decodeGeometry(hdr, de.Size)
	if err != nil {
		return nil, fmt.Errorf("prefix: open %q: %w", name, err)
	}
	if g.Clients != int64(r.MaxClients()) {
		return nil, fmt.Errorf("prefix: open %q: %w: %d client slots, tier has %d", name, ErrBadIndex, g.Clients, r.MaxClients())
	}
	if end := g.PayloadOff + g.PayloadChunks*r.ChunkSize(); g.PayloadOff < int64(r.DataStart()) || end > r.Size() {
		return nil, fmt.Errorf("prefix: open %q: %w: payload run %#x+%d outside the tier", name, ErrBadIndex, g.PayloadOff, g.PayloadChunks)
	}
	if g.LockID >= r.Info().Geometry.LockSlots {
		return nil, fmt.Errorf("prefix: open %q: %w: lock %d", name, ErrBadIndex, g.LockID)
	}
	// Before version 4 neighbouring shards' block-owner words share cache
	// lines: hosts without shared caches, each writing back its own shard's
	// line, can make two entries own one block. Maintenance (snapshot,
	// destroy) may still open it, to move its entries to a new index.
	if !anyLayout && g.Version < 4 && r.Info().Coherence == tier.Shared {
		return nil, fmt.Errorf("prefix: open %q: %w: version %d index on a tier shared without coherence (version 4 needed there): "+
			"cxltier prefix snapshot, prefix destroy, prefix create, prefix restore", name, ErrBadIndex, g.Version)
	}
	if !maint {
		if want := keyDigest(name, key); subtle.ConstantTimeCompare(want[:], g.KeyDigest[:]) != 1 {
			return nil, fmt.Errorf("prefix: open %q: %w", name, ErrDenied)
		}
		if key != "" && g.Version < 6 && !anyLayout {
			return nil, fmt.Errorf("prefix: open %q: %w: a keyed index of layout %d keeps no page signatures (6 needed): "+
				"cxltier prefix snapshot, prefix destroy, prefix create, prefix restore", name, ErrBadIndex, g.Version)
		}
	}
	s := &Store{c: c, r: r, name: name, g: g, meta: de.Offset, hdr: hdr, ns: namespace(name, key), tenant: tenantSecret(name, key),
		shared: r.Info().Coherence == tier.Shared, maint: maint, perClient: g.Version >= 3}
	if g.Version >= 6 {
		s.mac = newPageMAC(name, key) // before 6 (OpenToMove only) nothing is signed
	}
	if r.NumDevices() == 1 {
		s.one = r.Device(0)
		start, end := int64(s.meta)+g.EntriesOff, int64(s.meta)+g.EntriesOff+g.Entries*entryBytes
		if start < 0 || end > int64(len(s.one)) {
			return nil, fmt.Errorf("prefix: open %q: %w: entry table %#x-%#x outside the tier", name, ErrBadIndex, start, end)
		}
		s.ents = s.one[start:end:end]
	}
	s.blockOff = blockOffsets(r, tier.Offset(g.PayloadOff), g.Blocks, g.BlockStride)
	if err := s.initShards(); err != nil {
		return nil, fmt.Errorf("prefix: open %q: %w", name, err)
	}
	if last := s.blockOff[len(s.blockOff)-1]; int64(last)+g.BlockStride > g.PayloadOff+g.PayloadChunks*r.ChunkSize() {
		return nil, fmt.Errorf("prefix: open %q: %w: payload run too short for %d blocks", name, ErrBadIndex, g.Blocks)
	}
	if err := s.claimPins(); err != nil {
		return nil, fmt.Errorf("prefix: open %q: %w", name, err)
	}
	if de.Run2Size == 0 {
		// An index created before directory entries named a second run:
		// its payload run is recorded now, so that audits check its chunks
		// and reapers never free them. A failure leaves it as it was.
		_ = c.DirSetRun2(DirName(name), DirKind, tier.Offset(g.PayloadOff), g.PayloadChunks*r.ChunkSize())
	}
	s.unregister = c.OnClose(s.closePins)
	return s, nil
}

// hold is the gate (tier.Hold) that every method touching the tier passes
// first: the mapping stays while it is held, and it carries the lease
// check of writes outside a lock.
func (s *Store) hold(op string) (tier.Hold, error) {
	h, err := s.c.Hold()
	if err != nil {
		return h, fmt.Errorf("prefix: %q: %s: %w", s.name, op, err)
	}
	return h, nil
}

// holdToRelease is hold for giving back pins and reservations, which the
// client's Close does too.
func (s *Store) holdToRelease(op string) (tier.Hold, error) {
	h, err := s.c.HoldToRelease()
	if err != nil {
		return h, fmt.Errorf("prefix: %q: %s: %w", s.name, op, err)
	}
	return h, nil
}

// entries fails for a maintenance handle.
func (s *Store) entries(op string) error {
	if s.maint {
		return fmt.Errorf("prefix: %q: %s on a maintenance handle: %w", s.name, op, ErrDenied)
	}
	return s.current()
}

// current reports ErrStale when the header is no longer the one this
// handle opened: the index was destroyed (Destroy clears the magic under
// the index lock) and its memory perhaps reused by another index, whose
// structures this handle's geometry does not describe.
func (s *Store) current() error {
	if s.r.Closed() {
		return fmt.Errorf("prefix: %q: %w", s.name, tier.ErrClosed)
	}
	if s.poisoned.Load() {
		return fmt.Errorf("prefix: %q: %w", s.name, ErrPoisoned)
	}
	s.refreshMeta(0, lineSize)
	s.refreshMeta(hdrCreated&^(lineSize-1), lineSize)
	if atomic.LoadUint64(u64At(s.hdr, hdrMagic)) != indexMagic ||
		int64(atomic.LoadUint64(u64At(s.hdr, hdrCreated))) != s.g.Created.UnixNano() {
		return fmt.Errorf("prefix: %q: %w", s.name, ErrStale)
	}
	return nil
}

// Valid reports ErrStale when this handle no longer names the index the
// directory calls by its name: destroyed, or destroyed and created again
// (a long-lived holder such as the daemon drops the handle and reopens).
func (s *Store) Valid() error {
	held, herr := s.hold("valid")
	if herr != nil {
		return herr
	}
	defer held.Done()
	if err := s.current(); err != nil {
		return err
	}
	de, err := s.r.DirLookup(DirName(s.name))
	if errors.Is(err, tier.ErrNotFound) || (err == nil && de.Offset != s.meta) {
		return fmt.Errorf("prefix: %q: %w", s.name, ErrStale)
	}
	return err
}

// Extent is where the index lives in the tier: its metadata run (header,
// entries, owners, pins) and its payload blocks (for inspection and for
// tests that damage them).
func (s *Store) Extent() (meta tier.Offset, metaBytes int64, payload tier.Offset, payloadBytes int64) {
	return s.meta, s.g.PinsOff + s.g.Clients*s.g.PinStride, tier.Offset(s.g.PayloadOff), s.g.Blocks * s.g.BlockStride
}

// Name is the index's namespace.
func (s *Store) Name() string { return s.name }

// BlockBytes is the largest payload an entry holds.
func (s *Store) BlockBytes() int64 { return s.g.BlockBytes }

// metaSlice is n bytes at off in the metadata run. Every structure there is
// aligned to its size, which divides the stripe, so none crosses a device.
func (s *Store) metaSlice(off, n int64) []byte {
	abs := int64(s.meta) + off
	if s.one != nil {
		return s.one[abs : abs+n : abs+n]
	}
	b, err := s.r.Slice(tier.Offset(abs), n)
	if err != nil {
		panic(fmt.Sprintf("prefix: metadata %#x+%d: %v (layout checked at open)", abs, n, err))
	}
	return b
}

// blockAt is the tier offset of payload block b (b < Blocks). On one device
// blocks are packed end to end, so it is reckoned, saving a lookup its
// load of a table that grows with the index.
func (s *Store) blockAt(b uint32) tier.Offset {
	if s.one != nil {
		return tier.Offset(s.g.PayloadOff + int64(b)*s.g.BlockStride)
	}
	return s.blockOff[b]
}

// entry is entry i (i < Entries: callers take indexes from the shards,
// which bound them).
func (s *Store) entry(i uint32) []byte {
	if s.ents != nil {
		off := int(i) * entryBytes
		return s.ents[off : off+entryBytes : off+entryBytes]
	}
	return s.metaSlice(s.g.EntriesOff+int64(i)*entryBytes, entryBytes)
}

// lockedEntry is entry i for the holder of its shard's lock, who may read
// and write any of it: on a non-coherent tier both its lines are reloaded
// first (readEntry, for lookups, reloads the first line only).
func (s *Store) lockedEntry(i uint32) []byte {
	s.refreshMeta(s.g.EntriesOff+int64(i)*entryBytes, entryBytes)
	return s.entry(i)
}

// owner is the owner word of block b of shard sh (sh.holdsBlock(b)),
// reloaded first on a non-coherent tier (every access is under sh's lock).
func (s *Store) owner(sh *shard, b uint32) *uint32 {
	off := sh.ownerOff + 4*int64(b-sh.block0)
	line := off &^ (lineSize - 1)
	s.refreshMeta(line, lineSize)
	return u32At(s.metaSlice(line, lineSize), int(off%lineSize))
}

func (s *Store) hdrU32(off int) *uint32 { return u32At(s.hdr, off) }
func (s *Store) hdrU64(off int) *uint64 { return u64At(s.hdr, off) }

// publishMeta writes back metadata lines on a non-coherent tier.
func (s *Store) publishMeta(off, n int64) {
	if s.shared {
		s.r.Publish(s.meta+tier.Offset(off), n)
		if s.sim != nil {
			s.sim.publish(int64(s.meta)+off, n)
		}
	}
}

// refreshMeta drops this host's copies of metadata lines on a
// non-coherent tier, so that the next loads read the tier.
func (s *Store) refreshMeta(off, n int64) {
	if s.shared {
		s.r.Refresh(s.meta+tier.Offset(off), n)
		if s.sim != nil {
			s.sim.refresh(int64(s.meta)+off, n)
		}
	}
}

func (s *Store) publishEntry(i uint32) {
	s.publishMeta(s.g.EntriesOff+int64(i)*entryBytes, entryBytes)
}
