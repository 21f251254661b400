package main

import (
	"bufio"
	"bytes"
	"io"
	"log"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cxltier/cxltier/tier"
)

// FuzzAdminRequest feeds arbitrary HTTP requests to the admin handler: it
// never panics, only answers with the codes the API defines, and never runs
// a mutating endpoint without the token.
func FuzzAdminRequest(f *testing.F) {
	for _, s := range []string{
		"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /v1/reap HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer nope\r\n\r\n",
		"POST /v1/reap HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n\r\n",
		"DELETE /v1/status HTTP/1.1\r\nHost: x\r\n\r\n",
		"HEAD /v1/status HTTP/1.1\r\nHost: x\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	b, _ := tier.ParseBacking("anon")
	g := tier.DefaultGeometry()
	g.DeviceSize, g.ChunkSize = 16<<20, 256<<10
	r, err := tier.Format(tier.Options{Devices: []tier.Backing{b}, Geometry: g})
	if err != nil {
		f.Fatal(err)
	}
	defer r.Close()
	m, err := tier.NewManager(r, tier.ManagerOptions{})
	if err != nil {
		f.Fatal(err)
	}
	a := newAdmin(r, m, nil, config{}, []byte("s3cret"), log.New(io.Discard, "", 0))
	allowed := map[int]bool{200: true, 401: true, 403: true, 404: true, 405: true, 429: true}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var req fasthttp.Request
		if err := req.Read(bufio.NewReader(bytes.NewReader(raw))); err != nil {
			return // the server would answer 400 before the handler
		}
		var ctx fasthttp.RequestCtx
		ctx.Init(&req, nil, nil)
		a.handle(&ctx)
		code := ctx.Response.StatusCode()
		if !allowed[code] {
			t.Fatalf("status %d for %q", code, raw)
		}
		auth := string(req.Header.Peek("Authorization"))
		if string(ctx.Path()) == "/v1/reap" && code == 200 && !strings.HasSuffix(auth, " s3cret") {
			t.Fatalf("reap ran without the token: %q", raw)
		}
	})
}

func TestAdminRateLimit(t *testing.T) {
	l := newLimiter(5)
	now := time.Now()
	for i := range 5 {
		if !l.allow(now) {
			t.Fatalf("request %d of a burst of 5 refused", i)
		}
	}
	if l.allow(now) {
		t.Fatal("a sixth request in the same instant allowed")
	}
	if !l.allow(now.Add(250 * time.Millisecond)) { // 1.25 tokens back
		t.Fatal("no token back after 250 ms at 5/s")
	}
	if newLimiter(0) != nil {
		t.Error("rate 0 should mean no limiter")
	}
}

// TestAdminLimitsPerClient: callers without the token are limited per
// address, and callers with it by a bucket of their own, so a flood from
// one local user leaves the operator's requests through. One bucket for
// every request used to let four connections starve an authorised reap.
func TestAdminLimitsPerClient(t *testing.T) {
	ls := newLimits(3)
	now := time.Now()
	for range 10 {
		ls.allow("127.0.0.1", false, now)
	}
	if ls.allow("127.0.0.1", false, now) {
		t.Fatal("a flooding address still allowed")
	}
	if !ls.allow("10.0.0.7", false, now) {
		t.Fatal("another address refused because of the flood")
	}
	if !ls.allow("127.0.0.1", true, now) {
		t.Fatal("an authorised caller refused because of the flood")
	}
	if newLimits(0).allow("x", false, now) != true {
		t.Fatal("no limits refused a request")
	}
}

// TestLabelValue: label values escape exactly what the Prometheus text
// format escapes. Go's %q (used before) wrote \u2028 and \t escapes the
// format does not read, so an index name could break the scrape.
func TestLabelValue(t *testing.T) {
	for in, want := range map[string]string{
		"plain":          `"plain"`,
		"a\"b":           `"a\"b"`,
		`back\slash`:     `"back\\slash"`,
		"line\nfeed":     `"line\nfeed"`,
		"tab\tand\u2028": "\"tab\tand\u2028\"",
		"bad\xffutf8":    "\"bad\uFFFDutf8\"",
	} {
		if got := labelValue(in); got != want {
			t.Errorf("labelValue(%q) = %s, want %s", in, got, want)
		}
	}
}
