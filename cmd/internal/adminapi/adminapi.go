// Package adminapi holds the JSON shapes of cxltierd's admin API and a small
// client for them, shared by the daemon and the CLI.
package adminapi

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/tier/link"
	"github.com/cxltier/cxltier/topk"
)

// DefaultAddr is where cxltierd listens unless told otherwise.
const DefaultAddr = "127.0.0.1:7070"

// Status is the body of GET /v1/status.
type Status struct {
	Node        int            `json:"node"`
	LockManager bool           `json:"lock_manager"`
	Uptime      string         `json:"uptime"`
	Flush       string         `json:"flush_instruction"`
	Reaped      []tier.Reaped  `json:"reaped"`
	ReapedTotal uint64         `json:"reaped_total"`
	LockGrants  uint64         `json:"lock_grants_total"`
	Prefix      []prefix.Stats `json:"prefix_indexes"`
	Topk        topk.Stats     `json:"topk"` // sums over the live clients' sparse-KV pools
	// Links are the node's link arbiters (tier/link): per class, what the
	// live processes on each moved, waited and missed.
	Links []link.Stats `json:"links"`
	// ClientSocket is where clients prove who they are ("" if nowhere);
	// Proven, the clients that did (the only ones the daemon would end).
	ClientSocket string       `json:"client_socket"`
	Proven       []tier.Proof `json:"proven_clients"`
	Uplink       UplinkReach  `json:"uplink"`
	tier.Snapshot
}

// UplinkReach says whether the node's uplink answers at its socket.
type UplinkReach struct {
	Socket    string `json:"socket"`
	Listening bool   `json:"listening"`
	Error     string `json:"error,omitempty"`
}

// FetchStatus asks the daemon at addr (host:port) for its status.
func FetchStatus(addr string, timeout time.Duration) (Status, []byte, error) {
	var st Status
	addr, err := HostPort(addr)
	if err != nil {
		return st, nil, err
	}
	client := &http.Client{Timeout: timeout}
	resp, err := client.Get("http://" + addr + "/v1/status")
	if err != nil {
		return st, nil, fmt.Errorf("is cxltierd running? %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return st, nil, fmt.Errorf("read status from %s: %w", addr, err)
	}
	if resp.Header.Get(HealthHeader) == "" {
		return st, nil, notTheDaemon(addr, resp.StatusCode)
	}
	if resp.StatusCode != http.StatusOK {
		return st, raw, fmt.Errorf("status from %s: HTTP %d: %s", addr, resp.StatusCode, raw)
	}
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, raw, fmt.Errorf("status from %s: %w", addr, err)
	}
	return st, raw, nil
}

// FetchHealth asks the daemon at addr for /healthz: nil when it answers
// that the tier is healthy, else what it said or why it did not answer.
func FetchHealth(addr string, timeout time.Duration) error {
	addr, err := HostPort(addr)
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: timeout}
	resp, err := client.Get("http://" + addr + "/healthz")
	if err != nil {
		return fmt.Errorf("is cxltierd running? %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.Header.Get(HealthHeader) == "" {
		return notTheDaemon(addr, resp.StatusCode)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: %s", addr, resp.StatusCode, strings.TrimSpace(string(raw)))
	}
	return nil
}

// HealthHeader is set on every answer of cxltierd's admin API, so that a
// client tells the daemon from any other server on its port.
const HealthHeader = "X-Cxltier-Daemon"

func notTheDaemon(addr string, code int) error {
	return fmt.Errorf("%s answers HTTP %d but is not cxltierd (no %s header): another server on this port? (-addr, the daemon's -listen)",
		addr, code, HealthHeader)
}

// HostPort checks an -addr value and returns it as host:port: the admin
// API is plain HTTP, so "http://host:port/" is taken as host:port and any
// other scheme or a path is refused with what to write instead.
func HostPort(addr string) (string, error) {
	a := strings.TrimSuffix(strings.TrimSpace(addr), "/")
	a = strings.TrimPrefix(a, "http://")
	if strings.Contains(a, "://") || strings.Contains(a, "/") {
		return "", fmt.Errorf("-addr %q: give HOST:PORT, e.g. %s (the admin API is plain HTTP on loopback)", addr, DefaultAddr)
	}
	if _, _, err := net.SplitHostPort(a); err != nil {
		return "", fmt.Errorf("-addr %q: give HOST:PORT, e.g. %s: %v", addr, DefaultAddr, err)
	}
	return a, nil
}
