package tier

import (
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// sharedGroupID resolves CXLTIER_SHARED_GROUP (a group name or id) to a
// gid; ok is false where it is not set.
func sharedGroupID() (gid int, ok bool, err error) {
	name := os.Getenv(SharedGroupEnv)
	if name == "" {
		return 0, false, nil
	}
	if id, err := strconv.Atoi(name); err == nil && id >= 0 {
		return id, true, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, false, fmt.Errorf("tier: %s=%q: %w: %w", SharedGroupEnv, name, ErrInvalidConfig, err)
	}
	id, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, false, fmt.Errorf("tier: %s=%q: group id %q: %w", SharedGroupEnv, name, g.Gid, ErrInvalidConfig)
	}
	return id, true, nil
}

// shareWithGroup gives a file or shm backing this process just created to
// the shared group, read-write (0660), where CXLTIER_SHARED_GROUP names
// one: a root daemon's tier is then the one non-root uplinks and servers
// in that group map, with no chmod by hand.
func shareWithGroup(b Backing, f *os.File) error {
	gid, ok, err := sharedGroupID()
	if err != nil || !ok || b.Kind == BackingDax {
		return err
	}
	if err := f.Chown(-1, gid); err != nil {
		return fmt.Errorf("tier: give %s to group %d (%s): this process must be in that group: %w", b, gid, SharedGroupEnv, err)
	}
	if err := f.Chmod(0o660); err != nil {
		return fmt.Errorf("tier: make %s group-writable: %w", b, err)
	}
	return nil
}

// shareSocketDirectory shares the daemon's socket directory with
// CXLTIER_SHARED_GROUP's group, where one is named: the group's uplink
// binds its own socket and lock file there.
func shareSocketDirectory(socket string) error {
	gid, ok, err := sharedGroupID()
	if err != nil || !ok {
		return err
	}
	return shareDirectory(filepath.Dir(socket), gid)
}

// shareDirectory lets the shared group create its sockets and lock files
// in a tier's directory: group-writable, set-group-id (what is created
// there is the group's) and sticky (no member removes or replaces what
// another made, the tier and the daemon's socket included). Only a
// directory this process owns and nobody else may write is changed: a
// world-writable one (/dev/shm, /tmp) already lets members in, and is not
// ours to change.
func shareDirectory(dir string, gid int) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("tier: share directory %s: %w", dir, err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o002 != 0 {
		return nil
	}
	if err := os.Chown(dir, -1, gid); err != nil {
		return fmt.Errorf("tier: give directory %s to group %d: %w", dir, gid, err)
	}
	mode := fi.Mode().Perm() | 0o070 | fs.ModeSetgid | fs.ModeSticky
	if err := os.Chmod(dir, mode); err != nil {
		return fmt.Errorf("tier: make directory %s group-writable: %w", dir, err)
	}
	return nil
}
