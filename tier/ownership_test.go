package tier

import (
	"errors"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestOwnership: the usual shared devdax setup (root:dax 0660, the server
// in group dax) is accepted; backings another user could write are not.
func TestOwnership(t *testing.T) {
	const me, root, dax, other = 1000, 0, 995, 2000
	cases := []struct {
		name   string
		o      ownership
		accept bool
	}{
		{"own file 0600", ownership{uid: me, gid: me, perm: 0o600}, true},
		{"own file, world-writable", ownership{uid: me, gid: me, perm: 0o606}, false},
		{"another user's file", ownership{uid: other, gid: other, perm: 0o600}, false},
		{"own file 0660, no shared group named", ownership{uid: me, gid: dax, perm: 0o660}, false},
		{"own file 0660, its group named", ownership{uid: me, gid: dax, perm: 0o660, sharedGroup: strconv.Itoa(dax)}, true},
		{"own file 0660, another group named", ownership{uid: me, gid: dax, perm: 0o660, sharedGroup: "1"}, false},
		{"root's file 0660, its group named", ownership{uid: root, gid: dax, perm: 0o660, sharedGroup: strconv.Itoa(dax)}, true},
		{"root's file 0660, no shared group named", ownership{uid: root, gid: dax, perm: 0o660}, false},
		{"root's file 0660, another group named", ownership{uid: root, gid: dax, perm: 0o660, sharedGroup: "1"}, false},
		{"root's file 0660 of a group this process is not in", ownership{uid: root, gid: 6, perm: 0o660, sharedGroup: "6"}, false},
		{"another user's file 0660, its group named", ownership{uid: other, gid: dax, perm: 0o660, sharedGroup: strconv.Itoa(dax)}, false},
		{"devdax root:dax 0660, in dax", ownership{dax: true, uid: root, gid: dax, perm: 0o660}, true},
		{"devdax root:disk 0660, not in disk", ownership{dax: true, uid: root, gid: 6, perm: 0o660}, false},
		{"devdax root:root 0600", ownership{dax: true, uid: root, gid: root, perm: 0o600}, true},
		{"devdax of another user", ownership{dax: true, uid: other, gid: dax, perm: 0o660}, false},
		{"devdax world-writable", ownership{dax: true, uid: root, gid: dax, perm: 0o666}, false},
		{"read-only view of another user's file", ownership{uid: other, gid: other, perm: 0o644, writable: false}, true},
	}
	for _, c := range cases {
		o := c.o
		o.euid, o.groups = me, []int{me, dax}
		if c.name != "read-only view of another user's file" {
			o.writable = true
		}
		err := o.check(Backing{Kind: BackingFile, Path: "/x"})
		if (err == nil) != c.accept || (err != nil && !errors.Is(err, ErrPermission)) {
			t.Errorf("%s: %v, want accepted %v", c.name, err, c.accept)
		}
	}
	// A root process (a serving pod in SGLang's image) maps a tier of the
	// named group without being in it; not one of a group nobody named.
	for _, c := range []struct {
		name   string
		o      ownership
		accept bool
	}{
		{"as root: root's file 0660, its group named", ownership{uid: root, gid: dax, perm: 0o660, sharedGroup: strconv.Itoa(dax)}, true},
		{"as root: root's file 0660, no group named", ownership{uid: root, gid: dax, perm: 0o660}, false},
		{"as root: root's file 0660, another group named", ownership{uid: root, gid: dax, perm: 0o660, sharedGroup: "1"}, false},
	} {
		o := c.o
		o.euid, o.groups, o.writable = root, []int{root}, true
		err := o.check(Backing{Kind: BackingFile, Path: "/x"})
		if (err == nil) != c.accept || (err != nil && !errors.Is(err, ErrPermission)) {
			t.Errorf("%s: %v, want accepted %v", c.name, err, c.accept)
		}
	}
}

// TestFIFORefused: a FIFO planted at a tier's path is refused at once; it
// used to block every open (inspect, destroy) waiting for a writer.
func TestFIFORefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tier")
	if err := unix.Mkfifo(path, 0o600); err != nil {
		t.Skip(err)
	}
	for _, readOnly := range []bool{true, false} { // inspect opens read-only
		done := make(chan error, 1)
		go func() {
			r, err := Open(Options{Devices: []Backing{{Kind: BackingFile, Path: path}}, ReadOnly: readOnly})
			if err == nil {
				r.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("a FIFO as a tier (read-only %v): %v", readOnly, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("opening a FIFO as a tier (read-only %v) blocked", readOnly)
		}
	}
}
