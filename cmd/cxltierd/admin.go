package main

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cxltier/cxltier/cluster"
	"github.com/cxltier/cxltier/cmd/internal/adminapi"
	"github.com/cxltier/cxltier/prefix"
	"github.com/cxltier/cxltier/tier"
	"github.com/cxltier/cxltier/tier/link"
	"github.com/cxltier/cxltier/topk"
)

// admin serves the daemon's HTTP API: read-only endpoints for anyone who can
// reach the (loopback by default) address, mutating ones only with the
// bearer token.
type admin struct {
	r       *tier.Region
	m       *tier.Manager
	px      *prefixes
	cfg     config
	token   []byte
	started time.Time
	logger  *log.Logger
	limits  *limits // nil: unbounded
}

func newAdmin(r *tier.Region, m *tier.Manager, px *prefixes, cfg config, token []byte, logger *log.Logger) *admin {
	return &admin{r: r, m: m, px: px, cfg: cfg, token: token, started: time.Now(), logger: logger, limits: newLimits(cfg.AdminRate)}
}

// Connection bounds of the admin API (see connGate): the server's own
// limit is above the gate's, so the gate decides who gives way.
const (
	adminConnsTotal  = 192 // proven (kept-alive) connections, all peers
	adminConnsPeer   = 32  // proven connections of one peer
	adminConnsFresh  = 512 // connections whose first request has not arrived
	adminConcurrency = adminConnsTotal + adminConnsFresh + 64
)

// limits are the admin API's rate limits: a bucket per peer (peerOf) for
// callers without the token, and one of their own for callers with it, so
// that a local user flooding the API cannot starve the operator. Liveness
// (/healthz) is never limited: an orchestrator whose probes got 429 from a
// healthy daemon would restart it.
type limits struct {
	rate       float64
	authorised *limiter
	mu         sync.Mutex
	byAddr     map[string]*limiter
}

// maxTrackedAddrs bounds the per-address buckets; past it they start over
// (a flood from many addresses then shares fresh buckets, which is no worse
// than one bucket for all).
const maxTrackedAddrs = 4096

func newLimits(rate float64) *limits {
	if rate <= 0 {
		return nil
	}
	return &limits{rate: rate, authorised: newLimiter(rate), byAddr: map[string]*limiter{}}
}

// allow charges a request from addr (with the token when authorised).
func (ls *limits) allow(addr string, authorised bool, now time.Time) bool {
	if ls == nil {
		return true
	}
	if authorised {
		return ls.authorised.allow(now)
	}
	ls.mu.Lock()
	l, ok := ls.byAddr[addr]
	if !ok {
		if len(ls.byAddr) >= maxTrackedAddrs {
			clear(ls.byAddr)
		}
		l = newLimiter(ls.rate)
		ls.byAddr[addr] = l
	}
	ls.mu.Unlock()
	return l.allow(now)
}

// limiter is a token bucket: rate per second, bursts of up to rate (at
// least one).
type limiter struct {
	mu           sync.Mutex
	rate, tokens float64
	last         time.Time
}

func newLimiter(rate float64) *limiter {
	if rate <= 0 {
		return nil
	}
	return &limiter{rate: rate, tokens: max(rate, 1), last: time.Now()}
}

func (l *limiter) allow(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tokens = min(max(l.rate, 1), l.tokens+now.Sub(l.last).Seconds()*l.rate)
	l.last = now
	if l.tokens < 1 {
		return false
	}
	l.tokens--
	return true
}

func (a *admin) server() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:               a.handle,
		Name:                  "cxltierd",
		ReadTimeout:           5 * time.Second,
		WriteTimeout:          10 * time.Second,
		IdleTimeout:           30 * time.Second,
		MaxRequestBodySize:    64 << 10,
		ReadBufferSize:        8 << 10,
		Concurrency:           adminConcurrency,
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
		// fasthttp's own lines (a connection closed mid-request) go where
		// the daemon's log goes, not straight to the process's stderr.
		Logger: a.logger,
	}
}

type route struct {
	method  string
	mutates bool
	fn      func(*fasthttp.RequestCtx)
}

func (a *admin) routes() map[string]route {
	return map[string]route{
		"/healthz":   {fasthttp.MethodGet, false, a.healthz},
		"/v1/status": {fasthttp.MethodGet, false, a.status},
		"/metrics":   {fasthttp.MethodGet, false, a.metrics},
		"/v1/reap":   {fasthttp.MethodPost, true, a.reap},
	}
}

func (a *admin) handle(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.Set(adminapi.HealthHeader, "1") // every answer says it is cxltierd's, errors too
	path := string(ctx.Path())
	rt, ok := a.routes()[path]
	authed := a.hasToken(ctx)
	switch {
	case path != "/healthz" && !a.limits.allow(peerOf(ctx.RemoteIP()), authed, time.Now()):
		ctx.Response.Header.Set("Retry-After", "1")
		writeError(ctx, fasthttp.StatusTooManyRequests, "more than %v admin requests per second from %s", a.cfg.AdminRate, ctx.RemoteIP())
	case !ok:
		writeError(ctx, fasthttp.StatusNotFound, "no such endpoint: %s", ctx.Path())
	case string(ctx.Method()) != rt.method && !(rt.method == fasthttp.MethodGet && ctx.IsHead()):
		ctx.Response.Header.Set("Allow", rt.method)
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "%s %s: use %s", ctx.Method(), ctx.Path(), rt.method)
	case rt.mutates && !a.authorized(ctx, authed):
	default:
		rt.fn(ctx)
	}
}

// hasToken reports whether the request carries the bearer token (compared
// in constant time), without answering it.
func (a *admin) hasToken(ctx *fasthttp.RequestCtx) bool {
	const prefix = "Bearer "
	h := ctx.Request.Header.Peek(fasthttp.HeaderAuthorization)
	return len(a.token) > 0 && len(h) >= len(prefix) && string(h[:len(prefix)]) == prefix &&
		subtle.ConstantTimeCompare(h[len(prefix):], a.token) == 1
}

// authorized checks the bearer token in constant time. Without a configured
// token every mutation is refused: an open admin port must not be writable.
func (a *admin) authorized(ctx *fasthttp.RequestCtx, authed bool) bool {
	if len(a.token) == 0 {
		writeError(ctx, fasthttp.StatusForbidden, "mutating endpoints are disabled: start cxltierd with -token-file or %s", tokenEnv)
		return false
	}
	if !authed {
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="cxltierd"`)
		writeError(ctx, fasthttp.StatusUnauthorized, "missing or wrong bearer token")
		return false
	}
	return true
}

// healthz says ok, or 503 with what is wrong: a region header or area
// table that no longer checks (damaged, or zeroed under the daemon).
func (a *admin) healthz(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain; charset=utf-8")
	if err := a.r.Verify(); err != nil {
		ctx.SetStatusCode(fasthttp.StatusServiceUnavailable)
		ctx.SetBodyString("unhealthy: " + err.Error() + "\n")
		return
	}
	ctx.SetBodyString("ok\n")
}

func (a *admin) snapshot() adminapi.Status {
	st := a.m.Stats()
	reaped := a.m.Reaped()
	if reaped == nil {
		reaped = []tier.Reaped{}
	}
	return adminapi.Status{
		Node:         a.cfg.Node,
		LockManager:  a.cfg.Node == a.cfg.ManagerNode,
		Uptime:       time.Since(a.started).Round(time.Second).String(),
		Flush:        tier.FlushInstruction(),
		Reaped:       reaped,
		ReapedTotal:  st.Reaped,
		LockGrants:   st.Grants,
		Prefix:       a.px.stats(),
		Topk:         a.topkStats(),
		Links:        a.linkStats(),
		ClientSocket: a.m.SocketPath(),
		Proven:       a.m.Proofs(),
		Uplink:       a.uplinkReach(),
		Snapshot:     a.r.Snapshot(),
	}
}

// uplinkReach tries the node uplink's socket, as the node's clients would.
func (a *admin) uplinkReach() adminapi.UplinkReach {
	if a.r.Anonymous() {
		return adminapi.UplinkReach{Error: "an anonymous tier has no uplink"}
	}
	path, err := cluster.Address(a.r, a.cfg.Node)
	if err != nil {
		return adminapi.UplinkReach{Error: err.Error()}
	}
	out := adminapi.UplinkReach{Socket: path}
	if err := cluster.Reachable(path, 200*time.Millisecond); err != nil {
		out.Error = err.Error()
	} else {
		out.Listening = true
	}
	return out
}

// topkStats sums the sparse-KV pools of live clients; a damaged table is
// logged and reported as zeros rather than failing the whole status.
func (a *admin) topkStats() topk.Stats {
	st, err := topk.ReadStats(a.r)
	if err != nil {
		a.logger.Printf("topk stats: %v", err)
	}
	return st
}

// linkStats reads the node's link tables; a damaged one is logged and left
// out rather than failing the whole status.
func (a *admin) linkStats() []link.Stats {
	names, err := link.Tables(a.r)
	if err != nil {
		a.logger.Printf("link stats: %v", err)
	}
	out := []link.Stats{}
	for _, name := range names {
		st, err := link.ReadStats(a.r, name)
		if err != nil {
			a.logger.Printf("link stats: %v", err)
			continue
		}
		out = append(out, st)
	}
	return out
}

func (a *admin) status(ctx *fasthttp.RequestCtx) { writeJSON(ctx, fasthttp.StatusOK, a.snapshot()) }

// reap runs a reap pass; with ?slot=N it reaps that client now, on the
// operator's word that its process is gone (tier.Manager.Reap: a process
// this host sees alive is still ended first, or the reap refused).
func (a *admin) reap(ctx *fasthttp.RequestCtx) {
	if arg := ctx.QueryArgs().Peek("slot"); arg != nil {
		slot, err := strconv.Atoi(string(arg))
		if err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, "slot %q: not a number", arg)
			return
		}
		rp, err := a.m.Reap(slot, "reaped by an operator (POST /v1/reap?slot)")
		switch {
		case errors.Is(err, tier.ErrInvalidConfig) || errors.Is(err, tier.ErrNotFound):
			writeError(ctx, fasthttp.StatusBadRequest, "%v", err)
		case err != nil:
			writeError(ctx, fasthttp.StatusConflict, "%v", err)
		default:
			writeJSON(ctx, fasthttp.StatusOK, map[string]any{"reaped": []tier.Reaped{rp}})
		}
		return
	}
	got := a.m.ReapOnce()
	if got == nil {
		got = []tier.Reaped{}
	}
	writeJSON(ctx, fasthttp.StatusOK, map[string]any{"reaped": got})
}

func (a *admin) metrics(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain; version=0.0.4; charset=utf-8")
	writeMetrics(ctx, a.snapshot())
}

// writeMetrics renders the Prometheus text exposition format.
func writeMetrics(w io.Writer, s adminapi.Status) {
	metric := func(name, typ, help string, value any, labels ...string) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
		lbl := ""
		for i := 0; i+1 < len(labels); i += 2 {
			if lbl != "" {
				lbl += ","
			}
			lbl += labels[i] + "=" + labelValue(labels[i+1])
		}
		if lbl != "" {
			lbl = "{" + lbl + "}"
		}
		fmt.Fprintf(w, "%s%s %v\n", name, lbl, value)
	}
	live, dead := 0, 0
	for _, c := range s.Clients {
		if c.State == "live" {
			live++
		} else {
			dead++
		}
	}
	metric("cxltier_up", "gauge", "1 while the daemon serves.", 1, "node", fmt.Sprint(s.Node))
	metric("cxltier_tier_size_bytes", "gauge", "Logical size of the tier (control area + data).", s.Size)
	metric("cxltier_tier_used_bytes", "gauge", "Data bytes in allocated chunks.", s.Used)
	metric("cxltier_tier_free_bytes", "gauge", "Data bytes in free chunks.", s.Free)
	metric("cxltier_chunks", "gauge", "Chunks in the data area.", s.Chunks.Total)
	metric("cxltier_chunks_used", "gauge", "Allocated chunks.", s.Chunks.Used)
	metric("cxltier_chunks_shared", "gauge", "Chunks owned by shared structures rather than a client.", s.Chunks.Shared)
	metric("cxltier_devices", "gauge", "Devices the tier stripes across.", len(s.Devices))
	metric("cxltier_clients_live", "gauge", "Attached clients with a live lease (daemons included).", live)
	metric("cxltier_clients_dead", "gauge", "Leases of dead clients not yet reclaimed.", dead)
	metric("cxltier_locks_held", "gauge", "Global locks held or requested.", len(s.Locks))
	metric("cxltier_clients_reaped_total", "counter", "Dead clients reclaimed by this daemon.", s.ReapedTotal)
	metric("cxltier_clients_proven", "gauge", "Clients that proved who they are over the client socket (the only ones the daemon ever ends).", len(s.Proven))
	up := 0
	if s.Uplink.Listening {
		up = 1
	}
	metric("cxltier_uplink_listening", "gauge", "Whether the node's uplink answers at its socket (0: cluster pages are local misses).", up)
	metric("cxltier_lock_grants_total", "counter", "Global lock grants by this daemon (lock manager only).", s.LockGrants)
	metric("cxltier_directory_entries", "gauge", "Named objects in the root directory.", len(s.Directory))
	writePrefixMetrics(w, s.Prefix)
	writeTopkMetrics(metric, s.Topk)
	writeLinkMetrics(w, s.Links)
}

// writeLinkMetrics writes one family per counter with a sample per link
// table and, where the counter has one, its class ("deadline": transfers
// that claimed the link; "first_token": transfers a request's first token
// waits on, which wait for claims only; "bulk": pieces paced by both).
func writeLinkMetrics(w io.Writer, links []link.Stats) {
	if len(links) == 0 {
		return
	}
	family := func(name, typ, help, class string, value func(link.Stats) any) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
		for _, st := range links {
			lbl := "link=" + labelValue(st.Name)
			if class != "" {
				lbl += ",class=" + labelValue(class)
			}
			fmt.Fprintf(w, "%s{%s} %v\n", name, lbl, value(st))
		}
	}
	family("cxltier_link_processes", "gauge", "Live processes on the link's arbiter.", "", func(s link.Stats) any { return s.Processes })
	family("cxltier_link_deadline_transfers_total", "counter", "Transfers with a deadline that claimed the link.", "deadline", func(s link.Stats) any { return s.Claims })
	family("cxltier_link_deadline_misses_total", "counter", "Of those, the ones ready past their deadline.", "deadline", func(s link.Stats) any { return s.Misses })
	family("cxltier_link_claimed_seconds_total", "counter", "Time the link was claimed by transfers with a deadline.", "deadline", func(s link.Stats) any { return s.Claimed.Seconds() })
	family("cxltier_link_bulk_bytes_total", "counter", "Bytes bulk transfers moved in paced pieces.", "bulk", func(s link.Stats) any { return s.BulkBytes })
	family("cxltier_link_bulk_waits_total", "counter", "Bulk pieces that waited for a claim.", "bulk", func(s link.Stats) any { return s.BulkWaits })
	family("cxltier_link_bulk_waited_seconds_total", "counter", "Time bulk pieces waited for claims.", "bulk", func(s link.Stats) any { return s.BulkWaited.Seconds() })
	family("cxltier_link_first_token_transfers_total", "counter", "Transfers a request's first token waited on (KV loads, a prefill's pages for its decode).", "first_token", func(s link.Stats) any { return s.FirstTransfers })
	family("cxltier_link_first_token_misses_total", "counter", "Of those, the ones that ended past their deadline.", "first_token", func(s link.Stats) any { return s.FirstMisses })
	family("cxltier_link_first_token_bytes_total", "counter", "Bytes first-token transfers moved in paced pieces.", "first_token", func(s link.Stats) any { return s.FirstBytes })
	family("cxltier_link_first_token_waited_seconds_total", "counter", "Time first-token pieces waited for claims.", "first_token", func(s link.Stats) any { return s.FirstWaited.Seconds() })
}

// labelValue quotes a label value as the Prometheus text format wants:
// only backslash, double quote and line feed escaped, every other byte as
// is (UTF-8 passes through). Go's %q escapes more (\u2028, \t, \x00) in
// ways the format does not read, so a tenant's index name could break the
// whole scrape.
func labelValue(v string) string {
	v = strings.ToValidUTF8(v, "\uFFFD") // the format is UTF-8
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '\\':
			b.WriteString(`\\`)
		case '"':
			b.WriteString(`\"`)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// writeTopkMetrics exports the sparse-KV pools of the live clients; their
// counters leave the sums when a process exits, as a restart's would.
func writeTopkMetrics(metric func(name, typ, help string, value any, labels ...string), t topk.Stats) {
	metric("cxltier_topk_sequences", "gauge", "Sparse-KV sequences registered by live clients.", t.Sequences)
	metric("cxltier_topk_extents", "gauge", "Tier extents (chunks) holding their entries.", t.Extents)
	metric("cxltier_topk_steps_total", "counter", "Resolve calls (one layer of one decode step for a batch).", t.Steps)
	metric("cxltier_topk_hits_total", "counter", "Selected tokens found in the GPU buffer.", t.Hits)
	metric("cxltier_topk_misses_total", "counter", "Selected tokens fetched into an evicted slot.", t.Misses)
	metric("cxltier_topk_fills_total", "counter", "Entries copied on a slot's first use.", t.Fills)
	metric("cxltier_topk_hit_rate", "gauge", "Hits over hits and misses, live clients since they started.", t.HitRate())
	metric("cxltier_topk_fetched_bytes_total", "counter", "Bytes copied from the tier into GPU buffers.", t.BytesFetched)
	metric("cxltier_topk_resolve_seconds_total", "counter", "Time in Resolve, fetch included.", t.ResolveTime.Seconds())
}

// writePrefixMetrics writes one family per counter with a sample per index.
func writePrefixMetrics(w io.Writer, idx []prefix.Stats) {
	if len(idx) == 0 {
		return
	}
	family := func(name, typ, help string, value func(prefix.Stats) any) {
		fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
		for _, st := range idx {
			fmt.Fprintf(w, "%s{index=%s} %v\n", name, labelValue(st.Name), value(st))
		}
	}
	family("cxltier_prefix_entries_ready", "gauge", "Entries readers can hit.", func(s prefix.Stats) any { return s.Ready })
	family("cxltier_prefix_entries_reserved", "gauge", "Entries being written.", func(s prefix.Stats) any { return s.Reserved })
	family("cxltier_prefix_blocks", "gauge", "Payload blocks of the index.", func(s prefix.Stats) any { return s.Blocks })
	family("cxltier_prefix_blocks_used", "gauge", "Payload blocks in use.", func(s prefix.Stats) any { return s.UsedBlocks })
	family("cxltier_prefix_bytes_stored", "gauge", "Bytes of blocks in use.", func(s prefix.Stats) any { return s.UsedBlocks * s.BlockBytes })
	family("cxltier_prefix_pins_held", "gauge", "Entries pinned by live clients.", func(s prefix.Stats) any { return s.PinsHeld })
	family("cxltier_prefix_hit_rate", "gauge", "Hits over keys looked up, since the index was created.", func(s prefix.Stats) any { return s.HitRate() })
	family("cxltier_prefix_hits_total", "counter", "Keys found by lookups.", func(s prefix.Stats) any { return s.Hits })
	family("cxltier_prefix_misses_total", "counter", "Keys looked up and not found.", func(s prefix.Stats) any { return s.Misses })
	family("cxltier_prefix_inserts_total", "counter", "Entries published.", func(s prefix.Stats) any { return s.Inserts })
	family("cxltier_prefix_evictions_total", "counter", "Entries evicted for space.", func(s prefix.Stats) any { return s.Evictions })
	family("cxltier_prefix_reclaimed_total", "counter", "Reservations of dead clients reclaimed.", func(s prefix.Stats) any { return s.Reclaimed })
	family("cxltier_prefix_checksum_failures_total", "counter", "Payloads that failed their checksum (entry dropped).", func(s prefix.Stats) any { return s.ChecksumFailures })
	family("cxltier_prefix_bytes_in_total", "counter", "Payload bytes published.", func(s prefix.Stats) any { return s.BytesIn })
	family("cxltier_prefix_bytes_out_total", "counter", "Payload bytes read by Get.", func(s prefix.Stats) any { return s.BytesOut })
}

func writeJSON(ctx *fasthttp.RequestCtx, code int, v any) {
	ctx.SetStatusCode(code)
	ctx.SetContentType("application/json")
	enc := json.NewEncoder(ctx)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		ctx.SetStatusCode(fasthttp.StatusInternalServerError)
		ctx.SetBodyString(fmt.Sprintf(`{"error":%q}`, err.Error()))
	}
}

func writeError(ctx *fasthttp.RequestCtx, code int, format string, args ...any) {
	writeJSON(ctx, code, map[string]string{"error": fmt.Sprintf(format, args...)})
}
