package tier

import (
	"errors"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// sharedTestGroup is a gid no account uses: membership is given to a child
// by its credentials alone, so no group need exist in /etc/group.
const sharedTestGroup = 54321

// TestASharedGroupTierIsMappedByItsMembersOnly (issue 64, defect 4): a
// root daemon's tier, made with CXLTIER_SHARED_GROUP set, is the group's
// (0660, and the daemon's socket directory group-writable, set-group-id
// and sticky, for the uplink's socket), so a
// non-root uplink in that group maps it read-write; a member without the
// setting, and a non-member with it, are refused. The same tier used to be
// refused to every other uid ("a region another user created").
func TestASharedGroupTierIsMappedByItsMembersOnly(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run processes as other users")
	}
	dir := anyUserDir(t, 0o755)
	b := Backing{Kind: BackingFile, Path: filepath.Join(dir, "tier")}
	t.Setenv(SharedGroupEnv, strconv.Itoa(sharedTestGroup))
	r := formatTest(t, testGeometry(), b)
	m, err := NewManager(r, ManagerOptions{Node: 0}) // the daemon: it shares its socket's directory
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if sock, err := r.SocketPath(0); err != nil || filepath.Dir(sock) != dir {
		t.Fatalf("the daemon's socket %s (%v) is not beside the tier in %s", sock, err, dir)
	}

	file, err := os.Stat(b.Path)
	if err != nil {
		t.Fatal(err)
	}
	if gid := file.Sys().(*syscall.Stat_t).Gid; gid != sharedTestGroup || file.Mode().Perm() != 0o660 {
		t.Errorf("the tier: group %d mode %v, want group %d mode 0660", gid, file.Mode().Perm(), sharedTestGroup)
	}
	d, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := fs.ModeSetgid | fs.ModeSticky
	if gid := d.Sys().(*syscall.Stat_t).Gid; gid != sharedTestGroup || d.Mode()&want != want || d.Mode().Perm()&0o070 != 0o070 {
		t.Errorf("its directory: group %d mode %v, want group %d, g+rwx, set-group-id and sticky", gid, d.Mode(), sharedTestGroup)
	}

	exe := copyForAnyUser(t)
	for _, tc := range []struct {
		name   string
		groups []uint32
		named  bool
		exit   int
	}{
		{"a member, the group named", []uint32{sharedTestGroup}, true, 0},
		{"a member, no group named", []uint32{sharedTestGroup}, false, 4},
		{"not a member, the group named", nil, true, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(exe, "-test.run=^$")
			cmd.Env = append(environWithout(SharedGroupEnv), envRole+"=open", envDevices+"="+b.String())
			if tc.named {
				cmd.Env = append(cmd.Env, SharedGroupEnv+"="+strconv.Itoa(sharedTestGroup))
			}
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534, Groups: tc.groups}}
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			code := 0
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.exit {
				t.Errorf("opened as uid 65534: exit %d (%s), want %d", code, out, tc.exit)
			}
		})
	}
}

// TestAPeerOfTheSharedGroupIsTrusted: a socket served by a process whose
// group is CXLTIER_SHARED_GROUP's (a non-root uplink) is trusted where
// that group is named, and refused where it is not, or where the peer's
// group is another.
func TestAPeerOfTheSharedGroupIsTrusted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run processes as other users")
	}
	r := formatTest(t, testGeometry())
	exe := copyForAnyUser(t)
	dir := anyUserDir(t, 0o777)
	for _, tc := range []struct {
		name    string
		peerGID uint32
		named   bool
		trusted bool
	}{
		{"the group named, the peer's", sharedTestGroup, true, true},
		{"no group named", sharedTestGroup, false, false},
		{"the group named, the peer's another", 65534, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strconv.Itoa(int(tc.peerGID))+strconv.FormatBool(tc.named))
			peer := spawnWith(t, r, "squatter", 0, func(cmd *exec.Cmd) {
				cmd.Path, cmd.Args[0] = exe, exe
				cmd.SysProcAttr.Credential = &syscall.Credential{Uid: 65534, Gid: tc.peerGID}
			}, envOffset+"="+path)
			if line, err := peer.out.ReadString('\n'); err != nil || line != "listening\n" {
				t.Fatalf("the peer (uid 65534 gid %d) did not listen at %s: %q %v %s", tc.peerGID, path, line, err, peer.err)
			}
			named := ""
			if tc.named {
				named = strconv.Itoa(sharedTestGroup)
			}
			t.Setenv(SharedGroupEnv, named)
			c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			err = CheckPeerUID(c, "the test's socket")
			if (err == nil) != tc.trusted || (err != nil && !errors.Is(err, ErrPermission)) {
				t.Errorf("CheckPeerUID: %v, want trusted %v", err, tc.trusted)
			}
		})
	}
}

// anyUserDir is a fresh directory with the given mode, removed at the end.
func anyUserDir(t *testing.T, mode fs.FileMode) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cxltier-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	return dir
}

func environWithout(name string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, name+"=") {
			env = append(env, kv)
		}
	}
	return env
}
