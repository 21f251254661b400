package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cxltier/cxltier/cmd/internal/adminapi"
	"github.com/cxltier/cxltier/internal/syncbuf"
	"github.com/cxltier/cxltier/kernels"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/tier/link"
	"github.com/cxltier/cxltier/topk"
)

// The test binary doubles as the daemon (role "daemon": main() with the
// arguments in CXLTIERD_ARGS) and as a tier client that takes a lock and
// waits to be killed (role "holder").
const (
	envRole   = "CXLTIERD_TEST_ROLE"
	envArgs   = "CXLTIERD_ARGS"
	envDevice = "CXLTIERD_TEST_DEVICE"
)

func TestMain(m *testing.M) {
	switch os.Getenv(envRole) {
	case "daemon":
		var args []string
		if a := os.Getenv(envArgs); a != "" {
			args = strings.Split(a, " ")
		}
		os.Args = append([]string{"cxltierd"}, args...)
		main()
		os.Exit(0)
	case "holder":
		if err := holder(); err != nil {
			fmt.Fprintln(os.Stderr, "holder:", err)
			os.Exit(3)
		}
	}
	os.Exit(m.Run())
}

func holder() error {
	b, err := tier.ParseBacking(os.Getenv(envDevice))
	if err != nil {
		return err
	}
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		return err
	}
	c, err := r.Attach(tier.ClientOptions{Name: "holder"})
	if err != nil {
		return err
	}
	if err := c.Lock(tier.FirstUserLock); err != nil {
		return err
	}
	if _, err := c.AllocChunks(3); err != nil {
		return err
	}
	fmt.Println("locked")
	select {}
}

var addrRE = regexp.MustCompile(`admin API on http://([0-9.:]+)`)

// waitAddr polls a daemon's log until it names its admin address.
func waitAddr(t *testing.T, log fmt.Stringer) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if m := addrRE.FindStringSubmatch(log.String()); m != nil {
			return m[1]
		}
	}
	t.Fatalf("daemon did not start; log:\n%s", log)
	return ""
}

// startInProcess runs the daemon in this process until the test ends.
func startInProcess(t *testing.T, args ...string) (addr, device string, log *syncbuf.Buffer) {
	t.Helper()
	device = fmt.Sprintf("shm:cxltierd-test-%d-%d", os.Getpid(), time.Now().UnixNano())
	t.Cleanup(func() { os.Remove("/dev/shm/" + strings.TrimPrefix(device, "shm:")) })
	log = &syncbuf.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	all := append([]string{"-device", device, "-size", "32MiB", "-chunk", "256KiB", "-listen", "127.0.0.1:0", "-prefix-blocks", "0"}, args...)
	go func() { done <- run(ctx, all, log) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v\n%s", err, log)
		}
	})
	return waitAddr(t, log), device, log
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestConfig(t *testing.T) {
	cfg, err := loadConfig(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	opts, err := cfg.Options()
	if err != nil {
		t.Fatal(err)
	}
	if len(opts.Devices) != 1 || opts.Devices[0].String() != "shm:cxltier" || opts.Geometry.DeviceSize != 256<<20 ||
		opts.Coherence != tier.Local || opts.Geometry.Nodes != 1 || cfg.Listen != adminapi.DefaultAddr || cfg.Node != 0 {
		t.Errorf("embedded default: %+v %+v", cfg, opts)
	}

	dir := t.TempDir()
	file := filepath.Join(dir, "cxltierd.json")
	os.WriteFile(file, []byte(`{"device":["shm:a","shm:b"],"size":"1GiB","nodes":4,"node":2,"lease-timeout":"3s","listen":"127.0.0.1:9"}`), 0o600)
	cfg, err = loadConfig([]string{"-config", file, "-listen", "127.0.0.1:8"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if opts, _ = cfg.Options(); len(opts.Devices) != 2 || opts.Geometry.DeviceSize != 1<<30 || opts.Geometry.Nodes != 4 ||
		cfg.Node != 2 || opts.Geometry.LeaseTimeout != 3*time.Second || cfg.Listen != "127.0.0.1:8" {
		t.Errorf("config file + flag: %+v %+v", cfg, opts)
	}
	cfg, _ = loadConfig([]string{"-config", file, "-device", "shm:c"}, io.Discard)
	if cfg.Devices.List[0] != "shm:c" || len(cfg.Devices.List) != 1 {
		t.Errorf("-device should replace the file's devices: %v", cfg.Devices.List)
	}

	// The "-size applies only when formatting" note is for a size someone asked for.
	other := filepath.Join(dir, "nosize.json")
	os.WriteFile(other, []byte(`{"nodes":2}`), 0o600)
	for _, tc := range []struct {
		args []string
		want bool
	}{{nil, false}, {[]string{"-size", "1GiB"}, true}, {[]string{"-config", file}, true}, {[]string{"-config", other}, false}} {
		if cfg, err := loadConfig(tc.args, io.Discard); err != nil || cfg.sizeGiven != tc.want {
			t.Errorf("%v: size given %v, want %v (%v)", tc.args, cfg.sizeGiven, tc.want, err)
		}
	}

	os.WriteFile(file, []byte(`{"devices":["shm:a"]}`), 0o600)
	for _, args := range [][]string{
		{"-config", file},                       // unknown key
		{"-config", filepath.Join(dir, "nope")}, // missing file
		{"-size", "12parsecs"},
		{"-device", "tape:/dev/st0"},
		{"extra"},
		{"-lease-timeout", "-1s"},
	} {
		if _, err := loadConfig(args, io.Discard); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}

func TestToken(t *testing.T) {
	dir := t.TempDir()
	const secret = "s3cret-s3cret-s3cret"
	good := filepath.Join(dir, "token")
	os.WriteFile(good, []byte(secret+"\n"), 0o600)
	if tok, err := loadToken(good); err != nil || string(tok) != secret {
		t.Errorf("token %q, %v", tok, err)
	}
	link := filepath.Join(dir, "link")
	os.Symlink(good, link)
	long := filepath.Join(dir, "long")
	os.WriteFile(long, bytes.Repeat([]byte("x"), maxTokenBytes+1), 0o600)
	for name, file := range map[string]struct {
		data string
		mode os.FileMode
	}{
		"world-readable": {secret, 0o644},
		"empty":          {"", 0o600},
		"one byte":       {"x", 0o600},
		"short":          {"s3cret", 0o600},
	} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(file.data), file.mode)
		if _, err := loadToken(p); err == nil {
			t.Errorf("%s token file accepted", name)
		}
	}
	if _, err := loadToken(long); err == nil {
		t.Error("a token of more than 4096 bytes accepted (it used to be cut short)")
	}
	if _, err := loadToken(link); err == nil {
		t.Error("a token file behind a symbolic link followed")
	}
	if os.Geteuid() == 0 { // as root, make a file another user owns
		other := filepath.Join(dir, "other")
		os.WriteFile(other, []byte(secret), 0o600)
		if err := os.Chown(other, 65534, 65534); err == nil {
			if _, err := loadToken(other); err == nil {
				t.Error("a token file owned by another user accepted")
			}
		}
	}
	t.Setenv(tokenEnv, "short")
	if _, err := loadToken(""); err == nil {
		t.Error("a short token in the environment accepted")
	}
}

func TestAdminEndpoints(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte("let-me-in-0123456789"), 0o600)
	addr, _, log := startInProcess(t, "-token-file", tokenFile, "-prefix-blocks", "8", "-prefix-block-bytes", "256KiB")
	base := "http://" + addr

	if code, body := get(t, base+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("healthz: %d %q", code, body)
	}
	if err := adminapi.FetchHealth(addr, 5*time.Second); err != nil {
		t.Errorf("the health check against the daemon itself: %v", err)
	}
	if _, _, err := adminapi.FetchStatus(addr, 5*time.Second); err != nil {
		t.Errorf("cxltier status against the daemon itself: %v", err)
	}
	if resp, err := http.Get(base + "/no/such/endpoint"); err != nil || resp.Header.Get(adminapi.HealthHeader) == "" {
		t.Errorf("a 404 of the daemon does not say it is the daemon's: %v", err)
	} else {
		resp.Body.Close()
	}
	code, body := get(t, base+"/v1/status")
	var st adminapi.Status
	if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
		t.Fatalf("status: %d %v %s", code, err, body)
	}
	// The prefix index the daemon created holds the only used chunks.
	if st.Chunks.Total == 0 || st.Chunks.Used == 0 || st.Free != (st.Chunks.Total-st.Chunks.Used)*st.Chunks.Size || len(st.Devices) != 1 ||
		len(st.Prefix) != 1 || st.Prefix[0].Name != "default" || st.Prefix[0].Blocks != 8 ||
		len(st.Clients) != 1 || !st.Clients[0].Daemon || !st.LockManager {
		t.Errorf("status: %+v", st)
	}
	code, body = get(t, base+"/metrics")
	for _, want := range []string{"# TYPE cxltier_tier_free_bytes gauge", "cxltier_up{node=\"0\"} 1", "cxltier_clients_live 1", "cxltier_clients_reaped_total 0", "cxltier_prefix_blocks{index=\"default\"} 8", "cxltier_prefix_hits_total{index=\"default\"} 0"} {
		if code != 200 || !strings.Contains(body, want) {
			t.Errorf("metrics lack %q:\n%s", want, body)
		}
	}
	if code, _ := get(t, base+"/nope"); code != 404 {
		t.Errorf("unknown path: %d", code)
	}
	post := func(path, auth string) int {
		req, _ := http.NewRequest(http.MethodPost, base+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		path, auth string
		want       int
	}{
		{"/v1/reap", "", 401},
		{"/v1/reap", "Bearer wrong", 401},
		{"/v1/reap", "Basic let-me-in-0123456789", 401},
		{"/v1/reap", "Bearer let-me-in-0123456789", 200},
		{"/v1/status", "Bearer let-me-in-0123456789", 405},
	} {
		if got := post(tc.path, tc.auth); got != tc.want {
			t.Errorf("POST %s with %q: %d, want %d", tc.path, tc.auth, got, tc.want)
		}
	}
	if strings.Contains(log.String(), "let-me-in-0123456789") {
		t.Error("token appears in the daemon's log")
	}
}

func TestMutationsDisabledWithoutToken(t *testing.T) {
	t.Setenv(tokenEnv, "")
	addr, _, _ := startInProcess(t)
	resp, err := http.Post("http://"+addr+"/v1/reap", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 403 {
		t.Errorf("reap without configured token: %d, want 403", resp.StatusCode)
	}
}

func TestDaemonReapsKilledHolder(t *testing.T) {
	addr, device, _ := startInProcess(t, "-lease-timeout", "1s")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=holder", envDevice+"="+device)
	cmd.Stderr = os.Stderr
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill() // a failed check must not leave the holder waiting forever
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "locked\n" {
		t.Fatalf("holder: %q %v", line, err)
	}
	st, _, err := adminapi.FetchStatus(addr, time.Second)
	if err != nil || len(st.Locks) != 1 || st.Chunks.Used != 3 {
		t.Fatalf("while held: locks %+v, used %d, %v", st.Locks, st.Chunks.Used, err)
	}
	pid := cmd.Process.Pid
	killed := time.Now()
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	var reaped *tier.Reaped
	for reaped == nil && time.Since(killed) < 5*time.Second {
		time.Sleep(20 * time.Millisecond)
		if st, _, err = adminapi.FetchStatus(addr, time.Second); err != nil {
			t.Fatal(err)
		}
		for _, rp := range st.Reaped {
			if rp.PID == pid {
				reaped = &rp
			}
		}
	}
	if reaped == nil {
		t.Fatalf("status never showed pid %d reaped: %+v", pid, st.Reaped)
	}
	if took := time.Since(killed); took > time.Second {
		t.Errorf("reaped after %v, lease timeout 1s", took)
	}
	if reaped.Locks != 1 || reaped.Chunks != 3 || len(st.Locks) != 0 || st.Chunks.Used != 0 || st.ReapedTotal != 1 {
		t.Errorf("after reaping: %+v, locks %+v, used %d", reaped, st.Locks, st.Chunks.Used)
	}
	// The lock is usable again from another process (this one).
	b, _ := tier.ParseBacking(device)
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := r.Attach(tier.ClientOptions{Name: "after"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := c.LockContext(ctx, tier.FirstUserLock); err != nil {
		t.Fatalf("lock after reaping: %v", err)
	}
	c.Unlock(tier.FirstUserLock)
}

// TestNoFlags runs the daemon exactly as the README's first command does:
// no flags. It needs the default shm name and port to be free.
func TestNoFlags(t *testing.T) {
	const shmPath = "/dev/shm/cxltier"
	if _, err := os.Stat(shmPath); err == nil {
		t.Skipf("%s exists (a real tier?); not touching it", shmPath)
	}
	if ln, err := net.Listen("tcp", adminapi.DefaultAddr); err != nil {
		t.Skipf("%s busy: %v", adminapi.DefaultAddr, err)
	} else {
		ln.Close()
	}
	defer os.Remove(shmPath)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envRole+"=daemon", envArgs+"=")
	log := &syncbuf.Buffer{}
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	addr := waitAddr(t, log)
	if addr != adminapi.DefaultAddr {
		t.Errorf("listening on %s, want %s", addr, adminapi.DefaultAddr)
	}
	base := "http://" + addr
	if code, _ := get(t, base+"/healthz"); code != 200 {
		t.Errorf("healthz %d", code)
	}
	if code, body := get(t, base+"/metrics"); code != 200 || !strings.Contains(body, "cxltier_tier_size_bytes 268435456") {
		t.Errorf("metrics %d:\n%s", code, body)
	}
	st, _, err := adminapi.FetchStatus(addr, time.Second)
	if err != nil || st.Devices[0] != "shm:cxltier" || st.DeviceSize != 256<<20 || st.Coherence != "local" || st.Nodes != 1 {
		t.Errorf("status %+v %v", st, err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("exit after SIGTERM: %v\n%s", err, log)
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("no exit 10s after SIGTERM\n%s", log)
	}
	if !strings.Contains(log.String(), "stopped") {
		t.Errorf("no clean-shutdown message:\n%s", log)
	}
	// The region outlives the daemon and reopens cleanly with no live leases.
	b, _ := tier.ParseBacking("shm:cxltier")
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if ls := r.Leases(); len(ls) != 0 {
		t.Errorf("leases after clean shutdown: %+v", ls)
	}
}

// daemonAndClient starts a daemon in this process and attaches another
// client, called name, to its tier, as an engine on the node would.
func daemonAndClient(t *testing.T, name string) (string, *tier.Client) {
	t.Helper()
	addr, device, _ := startInProcess(t)
	b, _ := tier.ParseBacking(device)
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	c, err := r.Attach(tier.ClientOptions{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return addr, c
}

// TestTopkMetrics: a sparse-KV pool in another client of the tier (this
// test process) shows in the daemon's metrics and status while it lives.
func TestTopkMetrics(t *testing.T) {
	addr, c := daemonAndClient(t, "sglang")
	eng := kernels.NewCPU(1)
	defer eng.Close()
	p, err := topk.New(c, eng, nil, topk.Config{Layers: 1, EntryBytes: 64, Slots: 4, TopK: 2, MaxRequests: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Register(0, topk.Sequence{Layers: 1, EntryBytes: 64, Capacity: 16}); err != nil {
		t.Fatal(err)
	}
	if err := p.Append(0, 0, make([]byte, 16*64)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Resolve(0, []int{0}, []int64{16}, []int32{9, 15}, make([]int32, 2)); err != nil {
		t.Fatal(err)
	}
	_, body := get(t, "http://"+addr+"/metrics")
	for _, want := range []string{"cxltier_topk_sequences 1", "cxltier_topk_steps_total 1", "cxltier_topk_misses_total 1",
		"cxltier_topk_fetched_bytes_total 128"} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	p.Close()
	st, _, err := adminapi.FetchStatus(addr, time.Second)
	if err != nil || st.Topk.Steps != 0 || st.Topk.Sequences != 0 {
		t.Errorf("after the pool closed: %+v %v", st.Topk, err)
	}
}

// TestLinkMetrics: a link arbiter in another client of the tier (this test
// process) shows per class in the daemon's metrics while it lives.
func TestLinkMetrics(t *testing.T) {
	addr, c := daemonAndClient(t, "engine")
	lk, err := link.Open(c, link.Config{})
	if err != nil {
		t.Fatal(err)
	}
	lk.Claim(time.Now().Add(time.Millisecond))
	lk.Done(true)
	lk.Turn(4096)
	f := lk.BeginFirst(time.Now().Add(time.Minute))
	f.Turn(8192)
	f.End()
	_, body := get(t, "http://"+addr+"/metrics")
	for _, want := range []string{`cxltier_link_processes{link="node0"} 1`,
		`cxltier_link_deadline_transfers_total{link="node0",class="deadline"} 1`,
		`cxltier_link_deadline_misses_total{link="node0",class="deadline"} 1`,
		`cxltier_link_bulk_bytes_total{link="node0",class="bulk"} 4096`,
		`cxltier_link_first_token_transfers_total{link="node0",class="first_token"} 1`,
		`cxltier_link_first_token_misses_total{link="node0",class="first_token"} 0`,
		`cxltier_link_first_token_bytes_total{link="node0",class="first_token"} 8192`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	lk.Close()
	st, _, err := adminapi.FetchStatus(addr, time.Second)
	if err != nil || len(st.Links) != 1 || st.Links[0].Processes != 0 || st.Links[0].Claims != 0 {
		t.Errorf("after the arbiter closed: %+v %v", st.Links, err)
	}
}

func TestAdminRateLimitOverHTTP(t *testing.T) {
	addr, _, _ := startInProcess(t, "-admin-rate", "2")
	codes := map[int]int{}
	for range 6 {
		code, _ := get(t, "http://"+addr+"/metrics")
		codes[code]++
	}
	if codes[200] < 2 || codes[429] == 0 {
		t.Errorf("6 quick requests at 2/s: %v", codes)
	}
	// Liveness is never limited, even while others are.
	for range 6 {
		if code, body := get(t, "http://"+addr+"/healthz"); code != 200 {
			t.Fatalf("/healthz under a flood: %d %s", code, body)
		}
	}
	if _, err := loadConfig([]string{"-admin-rate", "-1"}, io.Discard); err == nil {
		t.Error("negative rate accepted")
	}
}

// TestFIFOsRefused: a FIFO at the token file's or the config file's path
// is refused at once. The daemon used to block on it before listening,
// deaf to SIGTERM.
func TestFIFOsRefused(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skip(err)
	}
	for name, load := range map[string]func() error{
		"token file":  func() error { _, err := loadToken(fifo); return err },
		"config file": func() error { _, err := loadConfig([]string{"-config", fifo}, io.Discard); return err },
	} {
		done := make(chan error, 1)
		go func() { done <- load() }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("a FIFO as the %s: %v", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("reading a FIFO as the %s blocked", name)
		}
	}
}

// fromAlias is an HTTP client whose connections come from a loopback
// alias (127.0.0.n), without keep-alive.
func fromAlias(n int) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(n))}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
}

// TestAdminNotStarvedByIdleConnections: hundreds of idle connections, from
// 127.0.0.1 and from other loopback addresses, no longer lock /healthz and
// the token holder out: idle connections give way to new ones. 64 of them
// from 127.0.0.1 used to make every request from that address fail, and
// some 300 over other loopback addresses made the server answer 503.
func TestAdminNotStarvedByIdleConnections(t *testing.T) {
	const secret = "s3cret-s3cret-s3cret"
	t.Setenv(tokenEnv, secret)
	addr, _, _ := startInProcess(t)
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for i := range 364 {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(1+i/64))}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		idle = append(idle, c)
	}
	time.Sleep(100 * time.Millisecond)
	for _, alias := range []int{1, 9} {
		mustGetIn(t, addr, alias, secret, "idle connections")
	}
}

// mustGetIn checks that /healthz and the token holder's reap are answered
// for a client at 127.0.0.alias, behind what crowds the server.
func mustGetIn(t *testing.T, addr string, alias int, secret, behind string) {
	t.Helper()
	resp, err := fromAlias(alias).Get("http://" + addr + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/healthz from 127.0.0.%d behind %s: %v %v", alias, behind, resp, err)
	}
	resp.Body.Close()
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/reap", nil)
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err = fromAlias(alias).Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("the token holder from 127.0.0.%d behind %s: %v %v", alias, behind, resp, err)
	}
	resp.Body.Close()
}

// TestAdminRateLimitCountsLoopbackAsOnePeer: the rate limit cannot be
// multiplied by sending from many loopback addresses.
func TestAdminRateLimitCountsLoopbackAsOnePeer(t *testing.T) {
	addr, _, _ := startInProcess(t, "-admin-rate", "2")
	codes := map[int]int{}
	for i := range 8 {
		resp, err := fromAlias(2 + i).Get("http://" + addr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		codes[resp.StatusCode]++
	}
	if codes[429] == 0 {
		t.Fatalf("8 quick requests at 2/s from 8 loopback addresses: %v", codes)
	}
	for _, c := range []struct {
		ip, want string
	}{{"127.0.0.1", "loopback"}, {"127.9.8.7", "loopback"}, {"::1", "loopback"},
		{"10.1.2.3", "10.1.2.3"}, {"2001:db8::1", "2001:db8::/64"}, {"2001:db8::ffff:1", "2001:db8::/64"}} {
		if got := peerOf(net.ParseIP(c.ip)); got != c.want {
			t.Errorf("peerOf(%s) = %s, want %s", c.ip, got, c.want)
		}
	}
}

// TestAdminNotStarvedBySlowRequests: connections that send the start of a
// request and stall (slow-loris) fill a peer's share of connections; once
// they have stalled past slowAfter they give way, so /healthz and the
// token holder still get in. They used to hold every slot until the read
// timeout, and a client reopening them every few seconds locked loopback
// out for good.
func TestAdminNotStarvedBySlowRequests(t *testing.T) {
	const secret = "s3cret-s3cret-s3cret"
	t.Setenv(tokenEnv, secret)
	addr, _, _ := startInProcess(t)
	var slow []net.Conn
	defer func() {
		for _, c := range slow {
			c.Close()
		}
	}()
	for i := range 2 * adminConnsPeer {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("slow connection %d: %v", i, err)
		}
		if _, err := c.Write([]byte("GET /heal")); err != nil {
			t.Fatalf("slow connection %d: %v", i, err)
		}
		slow = append(slow, c)
	}
	time.Sleep(slowAfter + 200*time.Millisecond)
	mustGetIn(t, addr, 1, secret, fmt.Sprintf("%d stalled requests", len(slow)))
}

// TestReapOneSlotOnTheOperatorsWord: POST /v1/reap?slot=N reaps that client
// at once (here a client of this very process, which no reap ever
// signals); a slot that is not a number, not a client's or holds no lease
// is a 400 naming it.
func TestReapOneSlotOnTheOperatorsWord(t *testing.T) {
	const secret = "let-me-in-0123456789"
	t.Setenv(tokenEnv, secret)
	addr, device, _ := startInProcess(t)
	b, _ := tier.ParseBacking(device)
	r, err := tier.Open(tier.Options{Devices: []tier.Backing{b}})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := r.Attach(tier.ClientOptions{Name: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	slot := c.Slot()
	post := func(query string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/reap"+query, nil)
		req.Header.Set("Authorization", "Bearer "+secret)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, q := range []string{"?slot=x", "?slot=-1", "?slot=100000", "?slot=" + strconv.Itoa(slot+1)} {
		if code, body := post(q); code != 400 || !strings.Contains(body, "slot") {
			t.Errorf("POST /v1/reap%s: %d %s, want 400 naming the slot", q, code, body)
		}
	}
	code, body := post("?slot=" + strconv.Itoa(slot))
	if code != 200 || !strings.Contains(body, `"name": "gone"`) || !strings.Contains(body, "operator") {
		t.Fatalf("POST /v1/reap?slot=%d: %d %s", slot, code, body)
	}
	for _, l := range r.Leases() {
		if l.Slot == slot && l.State == "live" && l.Name == "gone" {
			t.Errorf("the reaped client's lease is still live: %+v", l)
		}
	}
}

// TestCheckConfigRefusesWhatTheDaemonRefuses (issue 64, defect 8):
// -check-config (and so deploy/validate) said ok to settings the daemon
// refused at start, and -node 5 -nodes 2 formatted a tier before it was
// refused. Both now share one check, which runs before anything is made.
func TestCheckConfigRefusesWhatTheDaemonRefuses(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-size", "0"}, "device size 0"},
		{[]string{"-size", "1KiB"}, "leaves no data"},
		{[]string{"-clients-per-node", "0"}, "clients per node 0"},
		{[]string{"-chunk", "3KiB"}, "chunk size 3072"},
		{[]string{"-node", "5", "-nodes", "2"}, "-node 5: the tier to be formatted has nodes 0 to 1"},
		{[]string{"-manager-node", "-1"}, "-manager-node -1"},
		{[]string{"-prefix-block-bytes", "1GiB", "-size", "64MiB"}, "-prefix-block-bytes"},
	} {
		for _, only := range []bool{true, false} {
			device := fmt.Sprintf("shm:cxltierd-check-%d-%d", os.Getpid(), time.Now().UnixNano())
			path := "/dev/shm/" + strings.TrimPrefix(device, "shm:")
			args := append([]string{"-device", device, "-listen", "127.0.0.1:0"}, tc.args...)
			if only {
				args = append(args, "-check-config")
			}
			err := run(context.Background(), args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%v (check only %v): %v, want an error saying %q", tc.args, only, err, tc.want)
			}
			if _, statErr := os.Stat(path); statErr == nil {
				os.Remove(path)
				t.Errorf("%v (check only %v): a tier was made before the refusal", tc.args, only)
			}
		}
	}
	var dax syncbuf.Buffer // size 0 takes a DAX device whole
	if err := run(context.Background(), []string{"-device", "dax:/dev/dax-cxltierd-check-missing", "-size", "0", "-check-config"}, &dax); err != nil {
		t.Errorf("size 0 of a DAX device: %v: %s", err, dax.String())
	}
	var out syncbuf.Buffer
	if err := run(context.Background(), []string{"-device", "shm:cxltierd-check-ok", "-nodes", "2", "-node", "1", "-check-config"}, &out); err != nil ||
		!strings.Contains(out.String(), "configuration ok") {
		t.Errorf("a good configuration: %v: %s", err, out.String())
	}
}
