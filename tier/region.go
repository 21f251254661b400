package tier

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// Options say which devices make up a tier and how to map them.
type Options struct {
	Devices   []Backing
	Coherence Coherence
	// Format only: the geometry. DeviceSize 0 takes a dax device's whole size.
	Geometry Geometry
	// Format only: replace an existing backing file.
	Overwrite bool
	// Open only: map read-only, for inspection. No lease can be taken.
	ReadOnly bool
	// Open only: if > 0, each device's recorded size must equal it.
	ExpectDeviceSize int64
	// Touch every page from all cores at open (pays first-touch up front).
	Prefault bool
}

// Region is one mapped tier. Its methods are safe for concurrent use.
type Region struct {
	l        layout
	devs     []*mapping
	ctl      []byte // control area of device 0
	sync     syncer
	readOnly bool
	closed   atomic.Bool // set once Close has drained and goes on to unmap
	closing  atomic.Bool // Close runs (or ran): a second one is refused
	pidns    uint32      // this process's PID namespace (0: unknown), as leases record it

	clientsMu sync.Mutex
	clients   map[*Client]struct{} // attached here and not closed
}

// Format creates the devices, writes the format and returns the mapped region.
// The header is written last, so a crash mid-format leaves no valid region.
func Format(opts Options) (*Region, error) {
	if len(opts.Devices) == 0 {
		return nil, fmt.Errorf("tier: format: no devices: %w", ErrInvalidConfig)
	}
	g := opts.Geometry
	g.Devices = len(opts.Devices)
	if g.DeviceSize == 0 {
		sz, err := wholeDaxSize(opts.Devices)
		if err != nil {
			return nil, err
		}
		g.DeviceSize = sz
	}
	l, err := computeLayout(g)
	if err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(rand.Reader, l.UUID[:]); err != nil {
		return nil, fmt.Errorf("tier: format: uuid: %w", err)
	}
	l.Created = time.Now()
	if opts.Coherence == Shared {
		l.Flags |= flagShared
	}
	r := &Region{l: l, sync: syncer{shared: opts.Coherence == Shared}}
	r.pidns, _ = pidNamespace("self")
	for _, b := range opts.Devices {
		m, err := createBacking(b, g.DeviceSize, opts.Overwrite)
		if err != nil {
			r.unmapAll()
			return nil, err
		}
		r.devs = append(r.devs, m)
	}
	r.ctl = r.devs[0].data[:l.ControlSize]
	clear(r.ctl) // a reused dax device may hold an old region
	r.writeAreaHeaders()
	for i, m := range r.devs {
		dl := l
		dl.DeviceIndex = i
		copy(m.data[:headerLen], dl.encode())
		r.sync.publish(m.data[:headerLen])
	}
	if opts.Prefault {
		r.prefault()
	}
	return r, nil
}

func wholeDaxSize(devs []Backing) (int64, error) {
	var size int64
	for i, b := range devs {
		if b.Kind != BackingDax {
			return 0, fmt.Errorf("tier: format %s: device size is required for non-dax backings: %w", b, ErrInvalidConfig)
		}
		m, err := openBacking(b, false)
		if err != nil {
			return 0, err
		}
		n := int64(len(m.data)) / daxAlign * daxAlign
		_ = m.unmap()
		if i == 0 || n < size {
			size = n
		}
	}
	return size, nil
}

// Open maps an existing tier and validates every device's header, the areas
// and the root directory.
func Open(opts Options) (*Region, error) {
	if len(opts.Devices) == 0 {
		return nil, fmt.Errorf("tier: open: no devices: %w", ErrInvalidConfig)
	}
	if opts.Coherence == Shared && FlushInstruction() == "none" {
		return nil, fmt.Errorf("tier: shared coherence needs cache flush instructions this CPU lacks: %w", ErrInvalidConfig)
	}
	r := &Region{sync: syncer{shared: opts.Coherence == Shared}, readOnly: opts.ReadOnly}
	r.pidns, _ = pidNamespace("self")
	for _, b := range opts.Devices {
		m, err := openBacking(b, !opts.ReadOnly)
		if err != nil {
			r.unmapAll()
			return nil, err
		}
		r.devs = append(r.devs, m)
	}
	if err := r.validate(opts); err != nil {
		r.unmapAll()
		return nil, err
	}
	if opts.Prefault {
		r.prefault()
	}
	return r, nil
}

// Verify checks, as a health probe does, that every device's header still
// decodes to the layout the region was opened with and the areas still
// check: damage or an overwrite under a running process shows here. (An
// orphaned lock is not unhealthy: the next waiter or reaper pass frees it.)
func (r *Region) Verify() error {
	if err := r.live("verify"); err != nil {
		return err
	}
	for i, m := range r.devs {
		r.sync.refresh(m.data[:headerLen])
		l, err := decodeHeader(m.data)
		if err != nil {
			return fmt.Errorf("tier: %s: %w", m.backing, err)
		}
		l.DeviceIndex = 0
		if l.UUID != r.l.UUID || l.Geometry != r.l.Geometry || l.ControlSize != r.l.ControlSize {
			return fmt.Errorf("tier: %s (device %d): the header changed since the region was opened: %w", m.backing, i, ErrCorrupt)
		}
	}
	r.sync.refresh(r.ctl)
	if err := checkAreas(r.ctl, &r.l); err != nil {
		return fmt.Errorf("tier: %s: %w", r.devs[0].backing, err)
	}
	return nil
}

func (r *Region) validate(opts Options) error {
	for i, m := range r.devs {
		r.sync.refresh(m.data[:headerLen])
		l, err := decodeHeader(m.data)
		if err != nil {
			return fmt.Errorf("tier: %s: %w", m.backing, err)
		}
		if i == 0 {
			r.l = l
		}
		if err := r.checkDevice(i, m, l, opts.ExpectDeviceSize); err != nil {
			return err
		}
	}
	r.l.DeviceIndex = 0
	r.ctl = r.devs[0].data[:r.l.ControlSize]
	r.sync.refresh(r.ctl)
	if err := checkAreas(r.ctl, &r.l); err != nil {
		return fmt.Errorf("tier: %s: %w", r.devs[0].backing, err)
	}
	return nil
}

func (r *Region) checkDevice(i int, m *mapping, l layout, expect int64) error {
	size := int64(len(m.data))
	switch {
	case l.Devices != len(r.devs):
		return fmt.Errorf("tier: %s: region has %d devices, %d given: %w", m.backing, l.Devices, len(r.devs), ErrDeviceOrder)
	case l.DeviceIndex != i:
		return fmt.Errorf("tier: %s: is device %d of its tier, given as device %d: %w", m.backing, l.DeviceIndex, i, ErrDeviceOrder)
	case l.UUID != r.l.UUID || l.Geometry != r.l.Geometry:
		return fmt.Errorf("tier: %s: belongs to another tier than %s: %w", m.backing, r.devs[0].backing, ErrDeviceOrder)
	case size < l.DeviceSize:
		return fmt.Errorf("tier: %s: %d bytes, header says %d: %w", m.backing, size, l.DeviceSize, ErrTruncated)
	case size > l.DeviceSize && m.backing.Kind != BackingDax:
		return fmt.Errorf("tier: %s: %d bytes, header says %d: %w", m.backing, size, l.DeviceSize, ErrSizeMismatch)
	case expect > 0 && expect != l.DeviceSize:
		return fmt.Errorf("tier: %s: device size %d, expected %d: %w", m.backing, l.DeviceSize, expect, ErrSizeMismatch)
	}
	return nil
}

// Close unmaps every device. The region's content stays in its backings.
//
// Close must not race with other calls on r. Clients still attached stop
// their heartbeats first and report ErrClosed from then on; their leases
// stay in the tier for a reaper to reclaim, as a crashed process's would.
// Afterwards calls that return an error return ErrClosed, and the others
// zero values (no lease, no lock, no device): the mapping is gone, and a
// method must not fault on it.
//
// It first turns away new holds on every client and waits up to CloseWait
// for those in flight: an operation still reading the mapping would fault,
// which no recover catches. If they do not finish, it reports
// ErrHoldsInFlight and the region stays mapped and usable.
func (r *Region) Close() error {
	// Closed only once the holds have drained: a close that gives up
	// leaves the region as it was, and while it waits, the region's own
	// calls go on (its clients' gates turn new holds away meanwhile).
	if !r.closing.CompareAndSwap(false, true) {
		return fmt.Errorf("tier: close: %w", ErrClosed)
	}
	r.clientsMu.Lock()
	left := make([]*Client, 0, len(r.clients))
	for c := range r.clients {
		left = append(left, c)
	}
	r.clientsMu.Unlock()
	was := make([]uint32, len(left))
	for i, c := range left {
		was[i] = c.gate.state.Load()
		if err := c.gate.shut(gateClosed, c.closeWait); err != nil {
			for j, done := range left[:i] {
				done.gate.state.Store(was[j])
			}
			r.closing.Store(false)
			return fmt.Errorf("tier: close: client slot %d: %w", c.slot, err)
		}
	}
	r.closed.Store(true)
	for _, c := range left {
		c.abandon()
	}
	return r.unmapAll()
}

// track and untrack keep the set of clients Close must stop.
func (r *Region) track(c *Client) {
	r.clientsMu.Lock()
	defer r.clientsMu.Unlock()
	if r.clients == nil {
		r.clients = map[*Client]struct{}{}
	}
	r.clients[c] = struct{}{}
}

func (r *Region) untrack(c *Client) {
	r.clientsMu.Lock()
	defer r.clientsMu.Unlock()
	delete(r.clients, c)
}

// Closed reports whether Close has run: objects that keep slices of the
// mapping check it before they touch them (a check, not a guard: a Close
// racing with their use still unmaps under them).
func (r *Region) Closed() bool { return r.closed.Load() }

// live reports ErrClosed once Close has run.
func (r *Region) live(op string) error {
	if r.closed.Load() {
		return fmt.Errorf("tier: %s: %w", op, ErrClosed)
	}
	return nil
}

func (r *Region) unmapAll() error {
	var errs []error
	for _, m := range r.devs {
		if err := m.unmap(); err != nil {
			errs = append(errs, fmt.Errorf("tier: unmap %s: %w", m.backing, err))
		}
	}
	r.devs, r.ctl = nil, nil
	return errors.Join(errs...)
}

func (r *Region) prefault() {
	for _, m := range r.devs {
		prefault(m.data)
	}
}

// Populate enters every page of the tier into this process's page tables
// without changing a byte, and returns the bytes it covered. Each process
// maps the tier on its own: on 4 KiB pages (a shm: tier) its first access
// to each page is a minor fault, about as costly as copying the page, so a
// process that moves many pages (a transfer backend, the uplink) pays them
// once here instead of on its data path. It asks the kernel for writable
// entries (MADV_POPULATE_WRITE, Linux 5.14); where that is refused, and on
// a read-only region, it reads a byte of each page instead. Huge pages
// (dax, hugetlbfs) make it cheap; on 4 KiB pages it costs 2 MiB of page
// tables per GiB of tier.
func (r *Region) Populate() (int64, error) {
	if err := r.live("populate"); err != nil {
		return 0, err
	}
	var n int64
	for i, m := range r.devs {
		if err := populate(m.data, !r.readOnly); err != nil {
			return n, fmt.Errorf("tier: populate device %d (%s): %w", i, m.backing, err)
		}
		n += int64(len(m.data))
	}
	return n, nil
}

// Info describes a region for status pages and inspection.
type Info struct {
	Version     uint32
	Geometry    Geometry
	UUID        [16]byte
	Created     time.Time
	Size        int64 // logical bytes: control area + data
	ControlSize int64
	ChunkCount  int64
	Devices     []string
	Coherence   Coherence
	FormattedAs Coherence
}

// Info returns the region's header facts.
func (r *Region) Info() Info {
	inf := Info{
		Version: r.l.Version, Geometry: r.l.Geometry, UUID: r.l.UUID, Created: r.l.Created,
		Size: r.l.size(), ControlSize: r.l.ControlSize, ChunkCount: r.l.ChunkCount,
		Coherence: Local, FormattedAs: Local,
	}
	if r.sync.shared {
		inf.Coherence = Shared
	}
	if r.l.Flags&flagShared != 0 {
		inf.FormattedAs = Shared
	}
	for _, m := range r.devs {
		inf.Devices = append(inf.Devices, m.backing.String())
	}
	return inf
}

// Size is the logical size of the region in bytes.
func (r *Region) Size() int64 { return r.l.size() }

// DataStart is the Offset of the first data chunk.
func (r *Region) DataStart() Offset { return Offset(r.l.ControlSize) }

// Locate maps a logical offset to its device, the offset inside that device,
// and how many bytes from there are contiguous on that device.
func (r *Region) Locate(off Offset) (dev int, devOff int64, contiguous int64, err error) {
	o := int64(off)
	if off >= Offset(r.l.size()) {
		return 0, 0, 0, fmt.Errorf("tier: locate %v in %d-byte region: %w", off, r.l.size(), ErrOutOfBounds)
	}
	if o < r.l.ControlSize {
		return 0, o, r.l.ControlSize - o, nil
	}
	d := o - r.l.ControlSize
	stripe := d / r.l.Stripe
	n := int64(r.l.Devices)
	within := d % r.l.Stripe
	devOff = r.l.ControlSize + (stripe/n)*r.l.Stripe + within
	contiguous = r.l.Stripe - within
	if n == 1 {
		contiguous = r.l.size() - o
	}
	return int(stripe % n), devOff, contiguous, nil
}

// Slice returns the n bytes at off as one slice of the mapping. It fails if
// the range leaves the region or, on a striped tier, crosses to another device.
func (r *Region) Slice(off Offset, n int64) ([]byte, error) {
	if err := r.live("slice"); err != nil {
		return nil, err
	}
	if n < 0 || uint64(off)+uint64(n) > uint64(r.l.size()) {
		return nil, fmt.Errorf("tier: slice %v+%d of %d-byte region: %w", off, n, r.l.size(), ErrOutOfBounds)
	}
	if n == 0 {
		return nil, nil
	}
	dev, devOff, contig, err := r.Locate(off)
	if err != nil {
		return nil, err
	}
	if n > contig {
		return nil, fmt.Errorf("tier: slice %v+%d: %w", off, n, ErrNotContiguous)
	}
	return r.devs[dev].data[devOff : devOff+n : devOff+n], nil
}

// each calls fn on the device-contiguous pieces of [off, off+n).
func (r *Region) each(off Offset, n int64, fn func(b []byte)) error {
	if err := r.live("access"); err != nil {
		return err
	}
	if n < 0 || uint64(off)+uint64(n) > uint64(r.l.size()) {
		return fmt.Errorf("tier: range %v+%d of %d-byte region: %w", off, n, r.l.size(), ErrOutOfBounds)
	}
	for n > 0 {
		dev, devOff, contig, err := r.Locate(off)
		if err != nil {
			return err
		}
		k := min(n, contig)
		fn(r.devs[dev].data[devOff : devOff+k])
		off += Offset(k)
		n -= k
	}
	return nil
}

// ReadAt copies region bytes at off into p, across devices as needed.
func (r *Region) ReadAt(p []byte, off Offset) error {
	return r.each(off, int64(len(p)), func(b []byte) { p = p[copy(p, b):] })
}

// WriteAt copies p into the region at off, across devices as needed.
func (r *Region) WriteAt(p []byte, off Offset) error {
	if r.readOnly {
		return fmt.Errorf("tier: write at %v: %w", off, ErrReadOnly)
	}
	return r.each(off, int64(len(p)), func(b []byte) { p = p[copy(b, p):] })
}

// Publish makes [off, off+n) visible to other hosts (shared coherence):
// write back exactly those lines, then fence. A no-op on a local tier.
func (r *Region) Publish(off Offset, n int64) error {
	return r.each(off, n, r.sync.publish)
}

// Refresh drops stale cached copies of [off, off+n) before a read of shared
// metadata written by another host. A no-op on a local tier.
func (r *Region) Refresh(off Offset, n int64) error {
	return r.each(off, n, r.sync.refresh)
}

// Device returns device i's whole mapping, for engines that register host
// memory with a GPU; nil for no such device or after Close. The caller
// must not use it after Close.
func (r *Region) Device(i int) []byte {
	if i < 0 || i >= len(r.devs) {
		return nil
	}
	return r.devs[i].data
}

// NumDevices is the number of devices the region stripes across.
func (r *Region) NumDevices() int { return len(r.devs) }
