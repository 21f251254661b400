package tier

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Named objects: a run of shared chunks with a name in the root directory,
// created once by any process, found by name by every process that maps
// the tier (any rank, instance or host), kept across process death and
// daemon restarts, and removed only on request. An object's payload starts
// at its first chunk (chunk-aligned, so a tensor over it is as aligned as
// the tier's pages); its header page is the allocation's last page:
//
//	0  magic u64 · 8 version u32 · 12 flags u32 · 16 size u64 ·
//	24 created i64 · 32 kind u32 · 36 pad · 60 crc u32 (of 0..60)
//	64 seal record: state u32 · sum u32 · sealed i64 · seals u32 ·
//	   label length u32 · label [labelMax] · crc u32 (of the record)
//	1016 loader: the lease token of the client loading it, 0 = none
//	1024 holders: objectHolders lease tokens (gen<<32 | slot+1), 0 = free
//
// The header is written only under SystemLock; readers take no lock and
// check both checksums, so damage or a torn write reads as ErrCorrupt
// naming the object, never as a wrong size.

// ObjectKind marks named objects in the root directory.
const ObjectKind = 0x4f424a31 // "OBJ1"

const (
	objectMagic   = 0x314a424f52454958 // "XIEROBJ1"
	objectVersion = 1
	objectHeader  = 4096
	objectLabel   = 512 // bytes of label kept
	objectSealAt  = 64
	objectSealLen = 24 + objectLabel + 4
	objectHolders = (objectHeader - 1024) / 8
	// objectLoaderAt is the lease token of the client loading the payload
	// (0: none), beside the holders and, like them, outside the checksums.
	objectLoaderAt = 1016
	// objectSumBlock is the unit of the payload checksum: blocks are summed
	// on every core and the sum is the CRC-32C of their CRC-32Cs.
	objectSumBlock = 64 << 20
)

const objectFlagContiguous = 1 << 0

// ObjectState says whether an object's payload is complete.
type ObjectState uint32

const (
	// ObjectUnsealed: created or being rewritten; its contents are not a
	// finished load.
	ObjectUnsealed ObjectState = 1
	// ObjectSealed: a load finished; Sum and Label record what it holds.
	ObjectSealed ObjectState = 2
)

func (s ObjectState) String() string {
	switch s {
	case ObjectUnsealed:
		return "unsealed"
	case ObjectSealed:
		return "sealed"
	}
	return fmt.Sprintf("state(%d)", uint32(s))
}

// ObjectOptions shape a new object.
type ObjectOptions struct {
	// Contiguous asks for the payload to lie on one device in one run, so
	// that one pointer and one length reach all of it (a host table the
	// GPU reads over UVA). Always true of a one-device tier.
	Contiguous bool
	// Kind is the caller's tag for what the object holds (0: none).
	Kind uint32
}

// Object is a decoded named object.
type Object struct {
	Name       string      `json:"name"`
	Kind       uint32      `json:"kind"`
	Offset     Offset      `json:"offset"` // first payload byte
	Size       int64       `json:"size"`   // payload bytes
	Chunks     int64       `json:"chunks"`
	Contiguous bool        `json:"contiguous"`
	Created    time.Time   `json:"created"`
	State      ObjectState `json:"-"`
	StateName  string      `json:"state"`
	Sum        uint32      `json:"sum"` // payload checksum when sealed
	Label      string      `json:"label"`
	Sealed     time.Time   `json:"sealed"`
	Seals      uint32      `json:"seals"`   // times sealed since creation
	Holders    int         `json:"holders"` // live clients holding it
	// Damage, when not empty, says why the header or seal failed its
	// checks: only the name and the directory's span (Offset, Chunks) are
	// known, and only a forced RemoveObject acts on it.
	Damage string `json:"damage,omitempty"`
	header Offset
}

// CreateObject allocates a named object of size payload bytes, zero-filled
// and unsealed. It fails with ErrExists if the name is taken.
func (c *Client) CreateObject(name string, size int64, opts ObjectOptions) (Object, error) {
	if err := checkDirName(name); err != nil {
		return Object{}, err
	}
	r := c.r
	if size <= 0 {
		return Object{}, fmt.Errorf("tier: object %q: size %d must be positive: %w", name, size, ErrInvalidConfig)
	}
	chunk := r.l.ChunkSize
	if size > r.l.ChunkCount*chunk {
		return Object{}, fmt.Errorf("tier: object %q of %d bytes: the tier's data area is %d bytes: %w", name, size, r.l.ChunkCount*chunk, ErrExhausted)
	}
	n := (size + objectHeader + chunk - 1) / chunk
	if opts.Contiguous && r.l.Devices > 1 && n > 1 {
		return Object{}, fmt.Errorf("tier: object %q of %d bytes must be contiguous, and this tier stripes over %d devices every %d bytes "+
			"(use a one-device tier for host tables): %w", name, size, r.l.Devices, r.l.Stripe, ErrNotContiguous)
	}
	if _, err := r.DirLookup(name); err == nil {
		return Object{}, fmt.Errorf("tier: object %q: %w", name, ErrExists)
	}
	off, err := c.AllocChunks(n)
	if err != nil {
		return Object{}, fmt.Errorf("tier: object %q: %w", name, err)
	}
	// The chunks may hold an earlier object's bytes: an unsealed object
	// reads as zeros, as a fresh file would.
	if err := r.zero(off, n*chunk); err != nil {
		c.FreeChunks(off, n)
		return Object{}, err
	}
	o := Object{Name: name, Kind: opts.Kind, Offset: off, Size: size, Chunks: n, Contiguous: opts.Contiguous || r.l.Devices == 1,
		Created: time.Now(), State: ObjectUnsealed, header: off + Offset(n*chunk-objectHeader)}
	if err := r.writeObjectHeader(o); err != nil {
		c.FreeChunks(off, n)
		return Object{}, err
	}
	// Shared and named under one hold of the lock, shared first: a
	// process that dies between the two stores leaves shared chunks that
	// no entry names (lost until the tier is formatted anew), never a name
	// over chunks its reaper frees. A name taken meanwhile frees the run.
	e := DirEntry{Name: name, Kind: ObjectKind, Offset: off, Size: n * chunk, Created: o.Created}
	err = c.withLock(SystemLock, func() error {
		if err := c.shareLocked(off, n); err != nil {
			return err
		}
		if err := c.claimLoadLocked(o); err != nil { // its creator loads it
			return err
		}
		return r.dirPutLocked(e)
	})
	if err != nil {
		c.FreeChunks(off, n) // this client's or, once shared, unnamed: either way its own to free
		return Object{}, fmt.Errorf("tier: object %q: %w", name, err)
	}
	return r.readObject(name, e)
}

// zero clears [off, off+n) on every core.
func (r *Region) zero(off Offset, n int64) error {
	return r.eachParallel(off, n, func(b []byte) uint32 { clear(b); return 0 }, nil)
}

// OpenObject finds a named object and decodes its header.
func (r *Region) OpenObject(name string) (Object, error) {
	e, err := r.DirLookup(name)
	if err != nil {
		return Object{}, fmt.Errorf("tier: object %q: %w", name, err)
	}
	return r.readObject(name, e)
}

// Objects lists every named object. An object whose header or seal is
// damaged is listed too, with Damage saying how, so that one damaged
// object neither hides the others nor hides itself from removal.
func (r *Region) Objects() ([]Object, error) {
	entries, err := r.DirList()
	if err != nil {
		return nil, err
	}
	var out []Object
	for _, e := range entries {
		if e.Kind != ObjectKind {
			continue
		}
		o, err := r.readObject(e.Name, e)
		if damagedObject(err) {
			o = Object{Name: e.Name, Offset: e.Offset, Chunks: e.Size / r.l.ChunkSize, Damage: err.Error(), StateName: "damaged"}
		} else if err != nil {
			return out, err
		}
		out = append(out, o)
	}
	return out, nil
}

// removeDamagedLocked removes an object whose header cannot be trusted: the
// directory entry (checked by its own checksum) goes, and the chunks it
// spans are freed when they are whole shared chunks; otherwise they stay
// for Audit and repair to find. The caller holds the system lock.
func (c *Client) removeDamagedLocked(name string) error {
	e, err := c.r.DirLookup(name)
	if err != nil {
		return fmt.Errorf("tier: remove damaged object %q: %w", name, err)
	}
	if err := c.dirDeleteLocked(name); err != nil {
		return fmt.Errorf("tier: remove damaged object %q: %w", name, err)
	}
	chunk := c.r.l.ChunkSize
	if e.Size < chunk || e.Size%chunk != 0 {
		return nil
	}
	if err := c.freeChunksLocked(e.Offset, e.Size/chunk); err != nil {
		return fmt.Errorf("tier: removed damaged object %q; its chunks stay for repair: %w", name, err)
	}
	return nil
}

// damagedObject: err says an object's header or seal failed its checks.
func damagedObject(err error) bool {
	return errors.Is(err, ErrCorrupt) || errors.Is(err, ErrChecksum)
}

// ObjectBytes is the object's payload as one slice of this process's mapping
// (ErrNotContiguous for an object that spans devices).
func (r *Region) ObjectBytes(o Object) ([]byte, error) {
	b, err := r.Slice(o.Offset, o.Size)
	if err != nil {
		return nil, fmt.Errorf("tier: object %q: %w", o.Name, err)
	}
	return b, nil
}

func (r *Region) readObject(name string, e DirEntry) (Object, error) {
	if e.Kind != ObjectKind {
		return Object{}, fmt.Errorf("tier: %q is a directory entry of kind %#x, not a named object: %w", name, e.Kind, ErrInvalidConfig)
	}
	chunk := r.l.ChunkSize
	if e.Size < chunk || e.Size%chunk != 0 {
		return Object{}, fmt.Errorf("tier: object %q: directory span of %d bytes is not whole chunks: %w", name, e.Size, ErrCorrupt)
	}
	o := Object{Name: name, Offset: e.Offset, Chunks: e.Size / chunk, header: e.Offset + Offset(e.Size-objectHeader)}
	var h [objectHeader]byte
	var err error
	// A seal written while we read shows as a record checksum mismatch:
	// reread a few times before calling it damage.
	for try := 0; try < 50; try++ {
		if err = r.Refresh(o.header, objectHeader); err != nil {
			return Object{}, err
		}
		if err = r.ReadAt(h[:], o.header); err != nil {
			return Object{}, err
		}
		if err = decodeObjectHeader(h[:], &o, e.Size); err == nil {
			break
		}
		backoff(try)
	}
	if err != nil {
		return Object{}, fmt.Errorf("tier: object %q: %w", name, err)
	}
	o.Holders = r.liveHolders(h[1024:])
	return o, nil
}

func decodeObjectHeader(h []byte, o *Object, span int64) error {
	le := binary.LittleEndian
	if le.Uint64(h[0:]) != objectMagic {
		return fmt.Errorf("header: bad magic: %w", ErrCorrupt)
	}
	if crc32.Checksum(h[:60], castagnoli) != le.Uint32(h[60:]) {
		return fmt.Errorf("header: %w", ErrChecksum)
	}
	if v := le.Uint32(h[8:]); v != objectVersion {
		return fmt.Errorf("header version %d (this build reads %d): %w", v, objectVersion, ErrVersion)
	}
	o.Contiguous = le.Uint32(h[12:])&objectFlagContiguous != 0
	o.Size = int64(le.Uint64(h[16:]))
	o.Created = time.Unix(0, int64(le.Uint64(h[24:])))
	o.Kind = le.Uint32(h[32:])
	if o.Size <= 0 || o.Size > span-objectHeader {
		return fmt.Errorf("header: payload of %d bytes in a %d-byte span: %w", o.Size, span, ErrCorrupt)
	}
	s := h[objectSealAt : objectSealAt+objectSealLen]
	if crc32.Checksum(s[:len(s)-4], castagnoli) != le.Uint32(s[len(s)-4:]) {
		return fmt.Errorf("seal record: %w", ErrChecksum)
	}
	o.State = ObjectState(le.Uint32(s[0:]))
	if o.State != ObjectUnsealed && o.State != ObjectSealed {
		return fmt.Errorf("seal record: state %d: %w", o.State, ErrCorrupt)
	}
	o.StateName = o.State.String()
	o.Sum = le.Uint32(s[4:])
	o.Sealed = time.Unix(0, int64(le.Uint64(s[8:])))
	o.Seals = le.Uint32(s[16:])
	n := le.Uint32(s[20:])
	if n > objectLabel {
		return fmt.Errorf("seal record: label of %d bytes: %w", n, ErrCorrupt)
	}
	o.Label = string(s[24 : 24+n])
	return nil
}

func (r *Region) writeObjectHeader(o Object) error {
	var h [1024]byte
	le := binary.LittleEndian
	le.PutUint64(h[0:], objectMagic)
	le.PutUint32(h[8:], objectVersion)
	if o.Contiguous {
		le.PutUint32(h[12:], objectFlagContiguous)
	}
	le.PutUint64(h[16:], uint64(o.Size))
	le.PutUint64(h[24:], uint64(o.Created.UnixNano()))
	le.PutUint32(h[32:], o.Kind)
	le.PutUint32(h[60:], crc32.Checksum(h[:60], castagnoli))
	encodeSeal(h[objectSealAt:objectSealAt+objectSealLen], o)
	if err := r.WriteAt(h[:], o.header); err != nil {
		return err
	}
	return r.Publish(o.header, int64(len(h)))
}

func encodeSeal(s []byte, o Object) {
	le := binary.LittleEndian
	clear(s)
	le.PutUint32(s[0:], uint32(o.State))
	le.PutUint32(s[4:], o.Sum)
	if !o.Sealed.IsZero() {
		le.PutUint64(s[8:], uint64(o.Sealed.UnixNano()))
	}
	le.PutUint32(s[16:], o.Seals)
	label := o.Label
	if len(label) > objectLabel {
		label = label[:objectLabel]
	}
	le.PutUint32(s[20:], uint32(len(label)))
	copy(s[24:], label)
	le.PutUint32(s[len(s)-4:], crc32.Checksum(s[:len(s)-4], castagnoli))
}

// writeSeal rewrites the seal record; the caller holds SystemLock.
func (r *Region) writeSeal(o Object) error {
	var s [objectSealLen]byte
	encodeSeal(s[:], o)
	if err := r.WriteAt(s[:], o.header+objectSealAt); err != nil {
		return err
	}
	return r.Publish(o.header+objectSealAt, objectSealLen)
}

// ObjectSum is the payload checksum a seal records: the CRC-32C of the
// CRC-32Cs of its 64 MiB blocks, summed on every core.
func (r *Region) ObjectSum(o Object) (uint32, error) {
	blocks := (o.Size + objectSumBlock - 1) / objectSumBlock
	sums := make([]byte, 4*blocks)
	err := r.eachParallel(o.Offset, o.Size, func(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }, sums)
	if err != nil {
		return 0, fmt.Errorf("tier: object %q: %w", o.Name, err)
	}
	return crc32.Checksum(sums, castagnoli), nil
}

// eachParallel runs fn over the objectSumBlock-sized blocks of [off, off+n)
// on every core; when sums is non-nil, block i's result goes to sums[4i:].
// A block that spans devices is read into a buffer when summed, and
// handed over piece by piece otherwise.
func (r *Region) eachParallel(off Offset, n int64, fn func([]byte) uint32, sums []byte) error {
	if err := r.live("object"); err != nil {
		return err
	}
	if n < 0 || uint64(off)+uint64(n) > uint64(r.l.size()) {
		return fmt.Errorf("tier: range %v+%d of %d-byte region: %w", off, n, r.l.size(), ErrOutOfBounds)
	}
	blocks := (n + objectSumBlock - 1) / objectSumBlock
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for w := 0; w < min(runtime.NumCPU(), int(blocks)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < blocks; i = next.Add(1) - 1 {
				at := off + Offset(i*objectSumBlock)
				k := min(objectSumBlock, n-i*objectSumBlock)
				b, err := r.Slice(at, k)
				if errors.Is(err, ErrNotContiguous) {
					if sums == nil {
						if err = r.each(at, k, func(b []byte) { fn(b) }); err == nil {
							continue
						}
					} else {
						b = make([]byte, k)
						err = r.ReadAt(b, at)
					}
				}
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
				v := fn(b)
				if sums != nil {
					binary.LittleEndian.PutUint32(sums[4*i:], v)
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

// SealObject records that the payload is complete: its checksum (computed
// here, before the lock) and label, what was loaded into it.
func (c *Client) SealObject(name, label string) (Object, error) {
	o, err := c.r.OpenObject(name)
	if err != nil {
		return Object{}, err
	}
	sum, err := c.r.ObjectSum(o)
	if err != nil {
		return Object{}, err
	}
	return c.updateSeal(name, func(o *Object) error {
		if err := c.otherLoader(*o, "seal"); err != nil {
			return err
		}
		o.State, o.Sum, o.Label, o.Sealed = ObjectSealed, sum, label, time.Now()
		o.Seals++
		atomic.StoreUint64(c.loaderWord(*o), 0) // the load is over
		return c.r.Publish(o.header+objectLoaderAt, 8)
	})
}

// ClaimObjectLoad makes this client the loader of an unsealed object: until
// it seals it (or its client ends), no other client can claim, unseal or
// seal it, so two loaders never write one table. CreateObject and
// UnsealObject claim too. It fails with ErrObjectBusy while another client
// that still runs loads it (wait for its seal, or stop it); a sealed
// object comes back as it is, unclaimed.
func (c *Client) ClaimObjectLoad(name string) (Object, error) {
	var out Object
	err := c.withLock(SystemLock, func() error {
		o, err := c.r.OpenObject(name)
		if err != nil {
			return err
		}
		out = o
		if o.State == ObjectSealed {
			return nil
		}
		return c.claimLoadLocked(o)
	})
	return out, err
}

// otherLoader fails with ErrObjectBusy when a client other than c that
// still runs is loading o.
func (c *Client) otherLoader(o Object, op string) error {
	t := atomic.LoadUint64(c.loaderWord(o))
	if t == 0 || t == c.token || !c.r.tokenRuns(t) {
		return nil
	}
	inf, _ := c.r.tokenLease(t)
	return fmt.Errorf("tier: %s object %q: client %q (slot %d, pid %d) is loading it (wait for its seal, or stop it; "+
		"a loader that exited where this process cannot see it is freed when a daemon or cxltier repair reaps it): %w",
		op, o.Name, inf.Name, inf.Slot, inf.PID, ErrObjectBusy)
}

// claimLoadLocked records c as o's loader; the caller holds the system lock.
func (c *Client) claimLoadLocked(o Object) error {
	if err := c.otherLoader(o, "load"); err != nil {
		return err
	}
	atomic.StoreUint64(c.loaderWord(o), c.token)
	return c.r.Publish(o.header+objectLoaderAt, 8)
}

func (c *Client) loaderWord(o Object) *uint64 {
	b, _ := c.r.Slice(o.header+objectLoaderAt, 8) // inside the checked header page
	return u64At(b, 0)
}

// UnsealObject marks the payload as being rewritten, by this client (its
// loader, as ClaimObjectLoad): until the next seal, no reader takes it for
// a finished load. It refuses with ErrObjectBusy
// while other live clients hold the object: they read it, and a rewrite
// under them would hand them a mixture. The check and the unseal are one
// hold of the system lock, which HoldObject takes too.
func (c *Client) UnsealObject(name string) (Object, error) {
	return c.updateSeal(name, func(o *Object) error {
		if n := c.otherHolders(*o); n > 0 {
			return fmt.Errorf("tier: unseal object %q: %d other live clients hold it (stop them first): %w", name, n, ErrObjectBusy)
		}
		if err := c.claimLoadLocked(*o); err != nil { // whoever unseals loads it
			return err
		}
		o.State, o.Sum = ObjectUnsealed, 0
		return nil
	})
}

// otherHolders counts the clients other than c that hold o and may still
// run (tokenRuns).
func (c *Client) otherHolders(o Object) int {
	n := 0
	for i := 0; i < objectHolders; i++ {
		if t := atomic.LoadUint64(c.holderWord(o, i)); t != 0 && t != c.token && c.r.tokenRuns(t) {
			n++
		}
	}
	return n
}

// TokenRuns reports whether the client a token names may still run: its
// lease is live and its process is not proven gone. A claim recorded under
// a token (a reservation, a loader's claim) is let go only when this says
// no.
func (r *Region) TokenRuns(token uint64) bool { return r.tokenRuns(token) }

// tokenRuns reports whether the client a token names may still run: its
// lease is live, and its process is not proven gone (by /proc, for a
// client of this PID namespace on a tier of one host). A heartbeat that
// stopped proves nothing: a stopped or paused loader resumes and writes on,
// so its claim stands until it exits or a daemon ends it and reaps it.
// A server that exited without closing its tier, with no daemon to reap
// it, leaves a live lease behind; when this process can see that it is
// gone, it reads nothing and does not keep the table from being loaded.
func (r *Region) tokenRuns(t uint64) bool {
	inf, live := r.tokenLease(t)
	if !live {
		return false
	}
	return !(r.l.Nodes == 1 && r.provenGone(inf))
}

func (c *Client) updateSeal(name string, change func(*Object) error) (Object, error) {
	var out Object
	err := c.withLock(SystemLock, func() error {
		o, err := c.r.OpenObject(name)
		if err != nil {
			return err
		}
		if err := change(&o); err != nil {
			return err
		}
		o.StateName = o.State.String()
		out = o
		return c.r.writeSeal(o)
	})
	return out, err
}

// VerifyObject recomputes a sealed object's checksum against its seal.
func (r *Region) VerifyObject(o Object) error {
	if o.State != ObjectSealed {
		return fmt.Errorf("tier: object %q is %s: nothing to verify: %w", o.Name, o.State, ErrInvalidConfig)
	}
	sum, err := r.ObjectSum(o)
	if err != nil {
		return err
	}
	if sum != o.Sum {
		return fmt.Errorf("tier: object %q: payload checksum %#08x, sealed as %#08x: %w", o.Name, sum, o.Sum, ErrPayload)
	}
	return nil
}

// HoldObject records this client as a user of the object, so that removal
// without force refuses while it lives. A reaped client's hold lapses by
// itself (holds name a lease generation).
func (c *Client) HoldObject(name string) error {
	return c.withLock(SystemLock, func() error {
		o, err := c.r.OpenObject(name)
		if err != nil {
			return err
		}
		free := -1
		for i := 0; i < objectHolders; i++ {
			w := c.holderWord(o, i)
			switch t := atomic.LoadUint64(w); {
			case t == c.token:
				return nil
			case free < 0 && (t == 0 || !c.r.tokenLive(t)):
				free = i
			}
		}
		if free < 0 {
			return fmt.Errorf("tier: object %q: %d live holders, no room for another: %w", name, objectHolders, ErrExhausted)
		}
		atomic.StoreUint64(c.holderWord(o, free), c.token)
		return c.r.Publish(o.header+1024+Offset(8*free), 8)
	})
}

// ReleaseObject drops this client's hold.
func (c *Client) ReleaseObject(name string) error {
	return c.withLock(SystemLock, func() error {
		o, err := c.r.OpenObject(name)
		if err != nil {
			return err
		}
		for i := 0; i < objectHolders; i++ {
			if w := c.holderWord(o, i); atomic.LoadUint64(w) == c.token {
				atomic.StoreUint64(w, 0)
				return c.r.Publish(o.header+1024+Offset(8*i), 8)
			}
		}
		return nil
	})
}

func (c *Client) holderWord(o Object, i int) *uint64 {
	b, _ := c.r.Slice(o.header+1024+Offset(8*i), 8) // inside the checked header page
	return u64At(b, 0)
}

// tokenLive reports whether a lock token (gen<<32 | slot+1) names a live
// lease of that generation.
func (r *Region) tokenLive(t uint64) bool {
	_, ok := r.tokenLease(t)
	return ok
}

// tokenLease is the lease a token names, and whether it is live in that
// generation.
func (r *Region) tokenLease(t uint64) (LeaseInfo, bool) {
	slot := int(uint32(t)) - 1
	if slot < 0 || slot >= r.MaxClients() {
		return LeaseInfo{}, false
	}
	inf := r.readLease(slot)
	return inf, inf.State == "live" && inf.Gen == uint32(t>>32)
}

func (r *Region) liveHolders(words []byte) int {
	n := 0
	for i := 0; i+8 <= len(words); i += 8 {
		if t := binary.LittleEndian.Uint64(words[i:]); t != 0 && r.tokenLive(t) {
			n++
		}
	}
	return n
}

// RemoveObject deletes a named object and frees its chunks. It refuses
// with ErrObjectBusy while live clients hold it, unless force (their
// mappings then read chunks that later allocations reuse).
//
// The check of the holders and the removal are one hold of the system
// lock, which HoldObject takes too: a client cannot start holding the
// object between the check and the removal.
func (c *Client) RemoveObject(name string, force bool) error {
	return c.withLock(SystemLock, func() error {
		o, err := c.r.OpenObject(name)
		if damagedObject(err) {
			if !force {
				return fmt.Errorf("tier: remove object %q: %w (force removes a damaged object: its holders cannot be read)", name, err)
			}
			return c.removeDamagedLocked(name)
		}
		if err != nil {
			return err
		}
		if o.Holders > 0 && !force {
			return fmt.Errorf("tier: remove object %q: %d live clients hold it (stop them, or force): %w", name, o.Holders, ErrObjectBusy)
		}
		if c.afterHolderCheck != nil {
			c.afterHolderCheck()
		}
		if err := c.dirDeleteLocked(name); err != nil {
			return fmt.Errorf("tier: remove object %q: %w", name, err)
		}
		if err := c.freeChunksLocked(o.Offset, o.Chunks); err != nil {
			return fmt.Errorf("tier: remove object %q: %w", name, err)
		}
		return nil
	})
}
