package adminapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestFetchHealthKnowsTheDaemon: a health check said ok to any server
// answering 200 on the port; it now wants the daemon's header, and
// reports the daemon's own 503 with its reason.
func TestFetchHealthKnowsTheDaemon(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header bool
		code   int
		want   string // "" for ok
	}{
		{"another server", false, 200, "is not cxltierd"},
		{"the daemon", true, 200, ""},
		{"the daemon, unhealthy", true, 503, "HTTP 503: unhealthy: damaged"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.header {
					w.Header().Set(HealthHeader, "1")
				}
				w.WriteHeader(tc.code)
				if tc.code != 200 {
					w.Write([]byte("unhealthy: damaged\n"))
				}
			}))
			defer srv.Close()
			err := FetchHealth(strings.TrimPrefix(srv.URL, "http://"), 5*time.Second)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("FetchHealth: %v, want %q", err, tc.want)
			}
		})
	}
}

// TestFetchStatusKnowsTheDaemon: status at another server printed that
// server's whole 404 page (or a bare EOF); it says the port is not
// cxltierd's.
func TestFetchStatusKnowsTheDaemon(t *testing.T) {
	for _, tc := range []struct {
		name   string
		header bool
		code   int
		body   string
		want   string // "" for ok
	}{
		{"another server", false, 404, "<html>not found</html>", "is not cxltierd"},
		{"another server answering 200", false, 200, "{}", "is not cxltierd"},
		{"the daemon", true, 200, `{"node": 3}`, ""},
		{"the daemon, refusing", true, 429, "slow down", "HTTP 429: slow down"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.header {
					w.Header().Set(HealthHeader, "1")
				}
				w.WriteHeader(tc.code)
				w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			st, _, err := FetchStatus(strings.TrimPrefix(srv.URL, "http://"), 5*time.Second)
			if tc.want == "" && (err != nil || st.Node != 3) || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("FetchStatus: %+v, %v; want %q", st.Node, err, tc.want)
			}
		})
	}
}
