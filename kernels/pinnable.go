package kernels

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/cxltier/cxltier/internal/procmaps"
)

// Linux refuses a long-term, writable pin (what cuMemHostRegister asks for)
// of a shared file mapping whose file system tracks dirty pages: ext4, xfs,
// btrfs and the like, on 6.x kernels. The driver answers only
// CUDA_ERROR_INVALID_VALUE, which says nothing of why, so a failed register
// looks up where the memory comes from and says what to use instead.
// tmpfs (shm:, /dev/shm), hugetlbfs and devdax devices can be pinned.

// Magic numbers of statfs(2)'s f_type that name the usual file systems.
var fsNames = map[int64]string{
	0x01021994: "tmpfs",
	0x958458f6: "hugetlbfs",
	0xef53:     "ext4",
	0x58465342: "xfs",
	0x9123683e: "btrfs",
	0x794c7630: "overlayfs",
	0x6969:     "nfs",
	0x65735546: "fuse",
	0x2fc12fc1: "zfs",
}

// pinnableFS reports whether memory of a shared mapping of a file on a file
// system with this statfs type can be pinned for a GPU.
func pinnableFS(fsType int64) bool {
	return fsType == 0x01021994 || fsType == 0x958458f6
}

func fsName(fsType int64) string {
	if n, ok := fsNames[fsType]; ok {
		return n
	}
	return fmt.Sprintf("file system type %#x", fsType)
}

// pinHint says why mem cannot be pinned for a GPU when the reason is the
// file system of the file it maps, and what to use instead; "" otherwise.
func pinHint(mem []byte) string {
	if len(mem) == 0 {
		return ""
	}
	// The address is only looked up, never dereferenced.
	m, ok, err := procmaps.At(uint64(uintptr(unsafe.Pointer(&mem[0]))))
	if err != nil || !ok || !m.File() {
		return ""
	}
	return fileHint(m.Path)
}

// fileHint is pinHint's judgement of one mapped file.
func fileHint(path string) string {
	var st unix.Stat_t
	if unix.Stat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR {
		return "" // a devdax device
	}
	var fs unix.Statfs_t
	if unix.Statfs(path, &fs) != nil || pinnableFS(int64(fs.Type)) {
		return ""
	}
	return fmt.Sprintf("the memory maps %s, a file on %s, and Linux does not pin shared mappings of files on "+
		"file systems that track dirty pages for a GPU: put the tier on tmpfs (shm:NAME, or a file under /dev/shm), "+
		"hugetlbfs or a devdax device", path, fsName(int64(fs.Type)))
}
