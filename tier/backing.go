package tier

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// BackingKind says what kind of memory a device of the tier is.
type BackingKind int

const (
	BackingShm  BackingKind = iota // a file under /dev/shm
	BackingFile                    // any file: tmpfs, hugetlbfs, a plain file
	BackingDax                     // a devdax character device (CXL memory)
	BackingAnon                    // private anonymous memory, one process only
)

// ShmDir is where shm: backings live.
const ShmDir = "/dev/shm"

const daxAlign = 2 << 20 // devdax mappings must be 2 MiB aligned

// Backing names one device of a tier: "shm:NAME", "file:PATH", "dax:PATH" or "anon".
type Backing struct {
	Kind BackingKind
	Path string // file system path; empty for anon
}

// ParseBacking parses a backing spec.
func ParseBacking(spec string) (Backing, error) {
	kind, arg, hasArg := strings.Cut(spec, ":")
	bad := func(why string) (Backing, error) {
		return Backing{}, fmt.Errorf("tier: backing %q: %s: %w", spec, why, ErrInvalidConfig)
	}
	switch kind {
	case "anon":
		if hasArg {
			return bad("anon takes no argument")
		}
		return Backing{Kind: BackingAnon}, nil
	case "shm":
		if arg == "" || strings.ContainsAny(arg, "/\x00") || arg == "." || arg == ".." {
			return bad("shm name must be a plain file name")
		}
		return Backing{Kind: BackingShm, Path: filepath.Join(ShmDir, arg)}, nil
	case "file", "dax":
		if arg == "" || strings.ContainsRune(arg, 0) {
			return bad("path is empty")
		}
		k := BackingFile
		if kind == "dax" {
			k = BackingDax
		}
		return Backing{Kind: k, Path: filepath.Clean(arg)}, nil
	}
	return bad(`want shm:NAME, file:PATH, dax:PATH or anon`)
}

func (b Backing) String() string {
	switch b.Kind {
	case BackingShm:
		return "shm:" + filepath.Base(b.Path)
	case BackingFile:
		return "file:" + b.Path
	case BackingDax:
		return "dax:" + b.Path
	}
	return "anon"
}

// mapping is one mapped device.
type mapping struct {
	backing Backing
	data    []byte // the whole mapped device; its address is stable until unmap
	unmap   func() error
	file    fileID // what is mapped, as stat names it; zero for anon
}

// fileID names a mapped file as the kernel does, whatever path a process
// reached it by: the reaper looks for it among another process's mappings.
type fileID struct {
	dev, ino uint64
	rdev     uint64 // a device DAX character device's own number
	char     bool
}

func fileIDOf(f *os.File) fileID {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return fileID{}
	}
	return fileID{dev: st.Dev, ino: st.Ino, rdev: st.Rdev, char: st.Mode&unix.S_IFMT == unix.S_IFCHR}
}

// createBacking makes a new backing of the given size, 0600 (0660 and the
// shared group's where CXLTIER_SHARED_GROUP names one), and maps it.
// Files are allocated up front (fallocate) so a full tmpfs fails here with an
// error instead of with SIGBUS on first touch.
func createBacking(b Backing, size int64, overwrite bool) (*mapping, error) {
	switch b.Kind {
	case BackingAnon:
		return mapAnon(size)
	case BackingDax:
		m, err := openBacking(b, true)
		if err != nil {
			return nil, err
		}
		if int64(len(m.data)) < size {
			_ = m.unmap()
			return nil, fmt.Errorf("tier: %s has %d bytes, need %d: %w", b, len(m.data), size, ErrTooSmall)
		}
		return m, nil
	}
	if err := checkFree(b, size); err != nil {
		return nil, err
	}
	// Never through a link (a planted symlink must not aim a format at
	// another file), and an existing file is checked before it is cut.
	flags := os.O_RDWR | os.O_CREATE | os.O_EXCL | unix.O_NOFOLLOW | unix.O_NONBLOCK
	if overwrite {
		flags = os.O_RDWR | os.O_CREATE | unix.O_NOFOLLOW | unix.O_NONBLOCK
	}
	f, err := os.OpenFile(b.Path, flags, 0o600)
	if err != nil {
		return nil, classifyOpenErr(b, err)
	}
	defer f.Close()
	if err := checkMode(b, f, true); err != nil {
		return nil, err
	}
	if err := shareWithGroup(b, f); err != nil {
		return nil, err
	}
	if err := f.Truncate(0); err != nil {
		return nil, fmt.Errorf("tier: clear %s: %w", b, err)
	}
	size = roundToFSBlock(f, size)
	if err := f.Truncate(size); err != nil {
		return nil, fmt.Errorf("tier: size %s to %d: %w", b, size, err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil &&
		!errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
		_ = os.Remove(b.Path)
		if errors.Is(err, unix.ENOSPC) {
			return nil, fmt.Errorf("tier: allocate %d bytes for %s: %w: %w", size, b, ErrTooSmall, err)
		}
		return nil, fmt.Errorf("tier: allocate %d bytes for %s: %w", size, b, err)
	}
	return mapFile(b, f, size, true)
}

// openBacking maps an existing backing. A read-only mapping is for inspection.
func openBacking(b Backing, writable bool) (*mapping, error) {
	if b.Kind == BackingAnon {
		return nil, fmt.Errorf("tier: anon backing cannot be reopened: %w", ErrNoBacking)
	}
	// Non-blocking: a FIFO planted at the path must be refused by
	// checkMode, not wait for a writer (it would hang inspect and destroy).
	flags := os.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK
	if writable {
		flags = os.O_RDWR | unix.O_NOFOLLOW | unix.O_NONBLOCK
	}
	f, err := os.OpenFile(b.Path, flags, 0)
	if err != nil {
		return nil, classifyOpenErr(b, err)
	}
	defer f.Close()
	if err := checkMode(b, f, writable); err != nil {
		return nil, err
	}
	size, err := backingSize(b, f)
	if err != nil {
		return nil, err
	}
	if size < headerPage {
		return nil, fmt.Errorf("tier: %s has %d bytes, less than one header page: %w", b, size, ErrTruncated)
	}
	if writable && b.Kind != BackingDax {
		if err := checkAllocated(b, f, size); err != nil {
			return nil, err
		}
	}
	return mapFile(b, f, size, writable)
}

func classifyOpenErr(b Backing, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("tier: open %s: %w: %w", b, ErrNoBacking, err)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("tier: create %s: %w: %w", b, ErrExists, err)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, unix.EROFS):
		return fmt.Errorf("tier: open %s: %w: %w", b, ErrPermission, err)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("tier: open %s: a symbolic link, not followed (name the file itself): %w: %w", b, ErrPermission, err)
	}
	return fmt.Errorf("tier: open %s: %w", b, err)
}

// checkMode refuses group- or world-writable backings, and writable ones
// another user owns: anyone who can write the region can forge every
// structure in it, and /dev/shm lets any local user create the name a
// daemon will attach to before it first starts. (Reading another user's
// region, as an inspection does, is allowed: every word read is checked.)
func checkMode(b Backing, f *os.File, writable bool) error {
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("tier: stat %s: %w", b, err)
	}
	wantChar := b.Kind == BackingDax
	isChar := st.Mode()&fs.ModeCharDevice != 0
	switch {
	case wantChar && !isChar:
		return fmt.Errorf("tier: %s is not a character device (devdax): %w", b, ErrInvalidConfig)
	case !wantChar && !st.Mode().IsRegular():
		return fmt.Errorf("tier: %s is not a regular file (a %v): %w", b, st.Mode().Type(), ErrInvalidConfig)
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	groups, _ := os.Getgroups()
	return ownership{
		dax: wantChar, writable: writable, uid: int(sys.Uid), gid: int(sys.Gid), perm: st.Mode().Perm(),
		euid: os.Geteuid(), groups: append(groups, os.Getegid()), sharedGroup: os.Getenv(SharedGroupEnv),
	}.check(b)
}

// SharedGroupEnv names a group whose members may share file and shm
// backings group-writable (mode 0660); without it those must be the
// user's own and writable by it alone.
const SharedGroupEnv = "CXLTIER_SHARED_GROUP"

// ownership is who may use a backing. A tier's memory is trusted by every
// process that maps it, so a backing another user could write is refused:
//
//   - world-writable: never;
//   - a devdax device: owned by root (as udev makes them) or by this user;
//     group-writable (root:dax 0660, the usual setup) when this process is
//     in that group, since the administrator granted the group the device;
//   - a file or shm backing: owned by this user, or by root where
//     CXLTIER_SHARED_GROUP is set (a root daemon's tier that non-root
//     uplinks and servers share); group-writable only when its group is
//     the one CXLTIER_SHARED_GROUP names (by name or id) and this process
//     is in it or is root. Root can write every file anyway, so trusting
//     its files adds no writer; another user's file may be a squatter's.
//
// Read-only mappings (inspect) only need the world-writable check.
type ownership struct {
	dax, writable bool
	uid, gid      int
	perm          fs.FileMode
	euid          int
	groups        []int
	sharedGroup   string // name or id; "" for none
}

func (o ownership) check(b Backing) error {
	if o.perm&0o002 != 0 {
		return fmt.Errorf("tier: %s has mode %v: world-writable backings are refused: %w", b, o.perm, ErrPermission)
	}
	if !o.writable {
		return nil
	}
	inGroup := slices.Contains(o.groups, o.gid)
	switch {
	case o.uid != o.euid && !(o.uid == 0 && (o.dax || o.sharedGroup != "")):
		return fmt.Errorf("tier: %s is owned by uid %d, this process runs as %d: a region another user created is refused: %w",
			b, o.uid, o.euid, ErrPermission)
	case o.perm&0o020 == 0:
		return nil
	case o.dax && inGroup:
		return nil
	case !o.dax && (inGroup || o.euid == 0) && o.sharedGroup != "" && groupIs(o.gid, o.sharedGroup):
		return nil // root needs no membership to write it: the named group is what is trusted
	case o.dax:
		return fmt.Errorf("tier: %s has mode %v and group %d, which this process is not in: %w", b, o.perm, o.gid, ErrPermission)
	}
	return fmt.Errorf("tier: %s has mode %v: group-writable files are refused unless %s names their group (%d) and this process is in it (or is root): %w",
		b, o.perm, SharedGroupEnv, o.gid, ErrPermission)
}

// groupIs reports whether gid is the group named (a name or a number).
func groupIs(gid int, name string) bool {
	if id, err := strconv.Atoi(name); err == nil {
		return id == gid
	}
	g, err := user.LookupGroup(name)
	return err == nil && g.Gid == strconv.Itoa(gid)
}

func backingSize(b Backing, f *os.File) (int64, error) {
	if b.Kind != BackingDax {
		st, err := f.Stat()
		if err != nil {
			return 0, fmt.Errorf("tier: stat %s: %w", b, err)
		}
		return st.Size(), nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("tier: stat %s: %w", b, err)
	}
	return daxSize(unix.Major(st.Rdev), unix.Minor(st.Rdev))
}

// daxSize reads a devdax device's size from sysfs; the character device
// itself reports no size.
func daxSize(major, minor uint32) (int64, error) {
	p := fmt.Sprintf("/sys/dev/char/%d:%d/size", major, minor)
	raw, err := os.ReadFile(p)
	if err != nil {
		return 0, fmt.Errorf("tier: dax size from %s: %w", p, err)
	}
	return parseSysSize(p, raw)
}

func parseSysSize(path string, raw []byte) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("tier: size in %s is %q: %w", path, raw, ErrInvalidConfig)
	}
	return n, nil
}

// roundToFSBlock rounds a size up to the file system's block size, which on
// hugetlbfs is the huge page size (truncating to less would fail there).
func roundToFSBlock(f *os.File, size int64) int64 {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil || st.Type != unix.HUGETLBFS_MAGIC {
		return size
	}
	return alignUp(size, st.Bsize)
}

func mapFile(b Backing, f *os.File, size int64, writable bool) (*mapping, error) {
	if size != int64(int(size)) {
		return nil, fmt.Errorf("tier: %s size %d does not fit the address space: %w", b, size, ErrInvalidConfig)
	}
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE
	}
	if b.Kind == BackingDax {
		m, err := mapAligned(b, f, size, prot)
		if m != nil {
			m.file = fileIDOf(f)
		}
		return m, err
	}
	data, err := unix.Mmap(int(f.Fd()), 0, int(size), prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("tier: mmap %s (%d bytes): %w", b, size, err)
	}
	adviseHugePages(data)
	return &mapping{backing: b, data: data, unmap: func() error { return unix.Munmap(data) }, file: fileIDOf(f)}, nil
}

func mapAnon(size int64) (*mapping, error) {
	data, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("tier: mmap anon (%d bytes): %w", size, err)
	}
	return &mapping{backing: Backing{Kind: BackingAnon}, data: data, unmap: func() error { return unix.Munmap(data) }}, nil
}

// adviseHugePages asks for transparent huge pages on a file mapping. A
// tmpfs mounted huge=advise (or with shmem_enabled=advise) then backs the
// tier with 2 MiB pages: a random row read of a table far larger than the
// TLB costs a page walk per row on 4 KiB pages, and walks, not bytes, bound
// such reads (docs/operations.md, "Huge pages"). Advice only: where it is
// refused or ignored the mapping works as before, so its error is dropped.
func adviseHugePages(data []byte) { _ = unix.Madvise(data, unix.MADV_HUGEPAGE) }

// prefault touches every page of the mapping from all cores, so first-touch
// costs are paid once at start and in parallel rather than on the data path.
func prefault(data []byte) {
	const page = 4096
	workers := runtime.NumCPU()
	span := alignUp(int64(len(data))/int64(workers)+1, page)
	var wg sync.WaitGroup
	for start := int64(0); start < int64(len(data)); start += span {
		end := min(start+span, int64(len(data)))
		wg.Add(1)
		go func(part []byte) {
			defer wg.Done()
			var sink byte
			for i := 0; i < len(part); i += page {
				sink += part[i]
			}
			_ = sink
		}(data[start:end])
	}
	wg.Wait()
}

// populate enters data's pages into the page tables: writable through
// MADV_POPULATE_WRITE where the kernel has it, else (older kernels answer
// EINVAL) by reading a byte of each page. ENOMEM (a tmpfs that cannot
// supply the pages) and the rest are errors.
func populate(data []byte, writable bool) error {
	if writable {
		err := unix.Madvise(data, unix.MADV_POPULATE_WRITE)
		if err == nil || !errors.Is(err, unix.EINVAL) {
			return err
		}
	}
	prefault(data)
	return nil
}

// ReadOnlyView is a second, read-only mapping of part of the tier: a
// consumer that must never write a table maps it this way, so a stray
// store faults in that process instead of damaging what every other
// process reads.
type ReadOnlyView struct {
	Data []byte // the requested bytes
	all  []byte // the mapping, from an aligned device offset
}

// Close unmaps the view; Data must not be used afterwards.
func (v *ReadOnlyView) Close() error {
	if v.all == nil {
		return nil
	}
	all := v.all
	v.all, v.Data = nil, nil
	return unix.Munmap(all)
}

// MapReadOnly maps [off, off+n), which must lie on one device, read-only
// from the backing file. An anonymous tier has no file: ErrInvalidConfig.
func (r *Region) MapReadOnly(off Offset, n int64) (*ReadOnlyView, error) {
	if err := r.live("map read-only"); err != nil {
		return nil, err
	}
	if _, err := r.Slice(off, n); err != nil { // bounds and contiguity
		return nil, err
	}
	dev, devOff, _, err := r.Locate(off)
	if err != nil {
		return nil, err
	}
	b := r.devs[dev].backing
	if b.Kind == BackingAnon {
		return nil, fmt.Errorf("tier: map %v+%d read-only: an anonymous tier has no file to map: %w", off, n, ErrInvalidConfig)
	}
	// 2 MiB: what device DAX and hugetlbfs mappings need; more than enough
	// for a page-cache file.
	start := devOff / daxAlign * daxAlign
	length := alignUp(devOff+n, daxAlign) - start
	if end := int64(len(r.devs[dev].data)); start+length > end {
		length = end - start
	}
	f, err := os.OpenFile(b.Path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("tier: map %s read-only: %w", b, err)
	}
	defer f.Close()
	if err := checkMode(b, f, false); err != nil {
		return nil, err
	}
	all, err := unix.Mmap(int(f.Fd()), start, int(length), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("tier: map %s read-only at %d (+%d): %w", b, start, length, err)
	}
	adviseHugePages(all)
	lo := devOff - start
	return &ReadOnlyView{Data: all[lo : lo+n : lo+n], all: all}, nil
}

// checkFree refuses a file or shm backing larger than its file system's
// free space (plus what a file being replaced holds): a tier commits its
// whole size when it is formatted — on /dev/shm that is host memory — so
// the refusal names both numbers before anything is allocated.
func checkFree(b Backing, size int64) error {
	dir := filepath.Dir(b.Path)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil // nothing to judge by: fallocate still refuses what does not fit
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if fi, err := os.Lstat(b.Path); err == nil && fi.Mode().IsRegular() {
		free += fi.Size()
	}
	if size > free {
		return fmt.Errorf("tier: %s needs %d bytes and %s has %d free (a tier takes its whole size when formatted)%s: %w",
			b, size, dir, free, tmpfsHint(st.Type), ErrTooSmall)
	}
	return nil
}

// tmpfsHint says what to mount where a too-small file system is a tmpfs:
// a container's /dev/shm is 64 MiB unless its runtime is told otherwise.
func tmpfsHint(fsType int64) string {
	if fsType != unix.TMPFS_MAGIC {
		return ""
	}
	return "; in a container /dev/shm is 64 MiB unless the runtime is told otherwise: docker run --shm-size, " +
		"a Kubernetes emptyDir with medium Memory and a sizeLimit, or the host's tier directory (or a DAX device) " +
		"mounted in (docs/operations.md, \"Running under Kubernetes\")"
}

// checkAllocated refuses a tier file whose pages are not all allocated
// when its file system has no room for the rest: the first touch of such
// a page would end the process with SIGBUS, in whichever process touched
// it. (Format allocates every page; a file copied sparse, or punched,
// lacks some.)
func checkAllocated(b Backing, f *os.File, size int64) error {
	var st unix.Stat_t
	if unix.Fstat(int(f.Fd()), &st) != nil {
		return nil
	}
	var fsst unix.Statfs_t
	if unix.Fstatfs(int(f.Fd()), &fsst) != nil {
		return nil
	}
	missing := size - st.Blocks*512
	free := int64(fsst.Bavail) * int64(fsst.Bsize)
	if missing <= 0 || missing <= free {
		return nil
	}
	return fmt.Errorf("tier: %s has %d of its %d bytes unallocated and its file system %d free: a process touching them "+
		"would die of SIGBUS%s: %w", b, missing, size, free, tmpfsHint(int64(fsst.Type)), ErrTooSmall)
}
