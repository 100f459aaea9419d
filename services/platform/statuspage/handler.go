package statuspage

import (
	"context"
	"embed"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Prefix is the path the page is served under.
const Prefix = "/__ursula/ui"

// keepAliveInterval is how often an idle live connection gets an SSE
// comment, so that proxies and the write deadline see progress.
const keepAliveInterval = 15 * time.Second

// retryMs is the reconnection delay the page's EventSource is told.
const retryMs = 2000

//go:embed assets
var assets embed.FS

// contentTypes of the embedded files, by extension.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

// csp allows the page its own files and its own origin's live connection,
// nothing else: no inline script, no other origin, no framing.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// ServeHTTP serves the page under Prefix:
//
//	GET /__ursula/ui              redirects to /__ursula/ui/
//	GET /__ursula/ui/             the page (index.html)
//	GET /__ursula/ui/{file}       its script and style sheet
//	GET /__ursula/ui/snapshot     the cluster view as JSON, with its history
//	GET /__ursula/ui/events       the view live (text/event-stream)
//
// Every answer forbids caching, framing and cross-origin reads (no
// Access-Control-Allow-Origin). The caller decides who may reach it.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Del("Access-Control-Allow-Origin")
	h.Del("Access-Control-Expose-Headers")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", csp)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	rest, ok := strings.CutPrefix(r.URL.Path, Prefix)
	switch {
	case !ok:
		http.NotFound(w, r)
	case rest == "":
		http.Redirect(w, r, Prefix+"/", http.StatusMovedPermanently)
	case rest == "/":
		p.serveAsset(w, r, "index.html")
	case rest == "/snapshot":
		snap, _, _ := p.current(true)
		h.Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(snap)
	case rest == "/events":
		p.serveEvents(w, r)
	default:
		p.serveAsset(w, r, rest[1:])
	}
}

func (p *Page) serveAsset(w http.ResponseWriter, r *http.Request, name string) {
	ct := ""
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		ct = contentTypes[name[i:]]
	}
	if ct == "" || strings.Contains(name, "/") {
		http.NotFound(w, r)
		return
	}
	b, err := assets.ReadFile("assets/" + name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", ct)
	if r.Method == http.MethodHead {
		return
	}
	_, _ = w.Write(b)
}

// serveEvents streams the view: an "snapshot" event with the history at
// once, then one without it at every refresh, and a comment when nothing
// changed for keepAliveInterval. A viewer that reads slowly skips views
// (it always gets the newest), so nothing queues for it. At most
// MaxViewers are served at once.
func (p *Page) serveEvents(w http.ResponseWriter, r *http.Request) {
	select {
	case p.viewers <- struct{}{}:
	default:
		w.Header().Set("Retry-After", "5")
		http.Error(w, "too many viewers of the status page", http.StatusServiceUnavailable)
		return
	}
	defer func() { <-p.viewers }()
	// The first viewer turns the idle polling into the fast one now.
	select {
	case p.watched <- struct{}{}:
	default:
	}
	flusher, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	if r.Method == http.MethodHead {
		return
	}
	ctx := r.Context()
	snap, version, changed := p.current(true)
	if err := writeEvent(w, snap, true); err != nil {
		return
	}
	flusher.Flush()
	keepAlive := time.NewTicker(keepAliveInterval)
	defer keepAlive.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-keepAlive.C:
			if _, err := w.Write([]byte(": keep-alive\n\n")); err != nil {
				return
			}
			flusher.Flush()
		case <-changed:
			var v uint64
			snap, v, changed = p.current(false)
			if v == version {
				continue
			}
			version = v
			if err := writeEvent(w, snap, false); err != nil {
				return
			}
			flusher.Flush()
		}
	}
}

// writeEvent writes one "snapshot" event (with the retry hint on the first).
func writeEvent(w http.ResponseWriter, snap Snapshot, first bool) error {
	b, err := json.Marshal(snap)
	if err != nil {
		return err
	}
	var buf []byte
	if first {
		buf = append(buf, "retry: "...)
		buf = strconv.AppendInt(buf, retryMs, 10)
		buf = append(buf, '\n')
	}
	buf = append(buf, "event: snapshot\ndata: "...)
	buf = append(buf, b...) // JSON has no raw newlines
	buf = append(buf, "\n\n"...)
	_, err = w.Write(buf)
	return err
}

// WithStop ends the page's live connections when stop ends (a server
// shutting down gracefully waits for its handlers to return). A nil stop
// returns h.
func WithStop(h http.Handler, stop context.Context) http.Handler {
	if stop == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		unregister := context.AfterFunc(stop, cancel)
		defer unregister()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}
