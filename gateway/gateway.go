package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/httpserver"
)

// BuiltinBucket is the bucket that holds the streams of the Durable Streams
// URL family. The node treats buckets beginning with "__" as built in.
const BuiltinBucket = "__ds"

// reservedSegment is the first path segment under the stream root that is
// reserved for the subscription APIs.
const reservedSegment = "__ds"

// ownPrefix is the path prefix of the gateway's own endpoints.
const ownPrefix = "/__ursula/"

// StreamObserver is told about successful changes to streams of the Durable
// Streams family. streamPath is the path relative to the stream root (for
// example "events/abc"). Methods are called on the request goroutine after
// the node acknowledged the change and must return quickly (hand off, never
// block on I/O).
type StreamObserver interface {
	// StreamCreated is called after a stream was created (not for a PUT
	// that confirmed an existing stream).
	StreamCreated(ctx context.Context, streamPath string)
	// StreamWritten is called after an append or close that was not a
	// duplicate.
	StreamWritten(ctx context.Context, streamPath string)
	// StreamDeleted is called after a stream was deleted.
	StreamDeleted(ctx context.Context, streamPath string)
}

// Gateway serves the HTTP protocol over a StreamService client.
type Gateway struct {
	cfg     Config
	client  streamv1.StreamServiceClient
	logger  *slog.Logger
	metrics metrics
	handler http.Handler
	// routes are the route templates under cfg.StreamRoot (spans, metrics).
	routes routes
	// budget is the process's in-flight request-body budget.
	budget *httpserver.Budget

	// stopCtx ends when the gateway shuts down; live reads watch it.
	stopCtx   context.Context
	stop      context.CancelFunc
	closeOnce sync.Once

	// hubs are the shared upstream subscriptions of SSE clients.
	hubs hubSet

	// listening is closed once Serve serves (Listening).
	listening     chan struct{}
	listeningOnce sync.Once
}

// New validates cfg and returns a gateway; it starts nothing.
func New(cfg Config, client streamv1.StreamServiceClient, logger *slog.Logger) (*Gateway, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		return nil, errors.New("gateway: nil StreamService client")
	}
	cfg.applyDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	g := &Gateway{cfg: cfg, client: client, logger: logger, budget: cfg.BodyBudget, listening: make(chan struct{})}
	g.routes = newRoutes(cfg.StreamRoot)
	if g.budget == nil {
		g.budget = httpserver.NewBudget(0)
	}
	g.metrics.budget = g.budget
	g.metrics.newDuration()
	g.stopCtx, g.stop = context.WithCancel(context.Background())
	g.handler = http.HandlerFunc(g.serveHTTP)
	return g, nil
}

// Config returns the effective configuration (defaults applied).
func (g *Gateway) Config() Config { return g.cfg }

// Handler returns the gateway's HTTP handler, without the body and write
// progress deadlines Serve adds (Config.HTTP).
func (g *Gateway) Handler() http.Handler { return g.handler }

// Listening is closed once Run (or Serve) has its listener and serves:
// the process's service manager hears then that the gateway is up
// (services/app).
func (g *Gateway) Listening() <-chan struct{} { return g.listening }

// Run listens on Config.Listen and serves until ctx ends or Close is
// called, then shuts the server down gracefully.
func (g *Gateway) Run(ctx context.Context) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", g.cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway: listen %s: %w", g.cfg.Listen, err)
	}
	return g.Serve(ctx, ln)
}

// connContextKey keys the connection of a request in its context (set by
// Serve).
type connContextKey struct{}

// shutdownTimeout bounds the graceful shutdown of the HTTP server.
const shutdownTimeout = 10 * time.Second

// Serve serves on ln until ctx ends or Close is called; it closes ln. The
// server has the timeouts of Config.HTTP: headers, idle connections, and
// progress deadlines for request bodies and for each response write.
func (g *Gateway) Serve(ctx context.Context, ln net.Listener) error {
	srv := g.cfg.HTTP.Server(g.handler, slog.NewLogLogger(g.logger.Handler(), slog.LevelWarn))
	// SSE hub writers look at the connection's send queue, which only the
	// accepted socket itself can tell.
	srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		if nc, ok := c.(interface{ NetConn() net.Conn }); ok {
			c = nc.NetConn()
		}
		return context.WithValue(ctx, connContextKey{}, c)
	}
	lim := httpserver.LimitConnections(ln, g.cfg.MaxConnections, connRefusal(g.cfg.MaxConnections))
	g.metrics.conns.Store(lim)
	ln = lim
	// Requests with plain framing are served on a lighter loop than
	// net/http's; every other connection goes to srv unread, and so do
	// the requests that may stay open (live reads, the status page's
	// event stream): they must notice a client that left, which
	// net/http's background read does.
	lite := httpserver.NewLite(srv, mayStayOpen)
	g.logger.Info("gateway listening", "addr", ln.Addr().String(), "stream_root", g.cfg.StreamRoot, "status_page", g.cfg.StatusPage)
	if g.cfg.StatusPage == StatusPageOn && g.cfg.StatusUI != nil {
		g.logger.Warn("the cluster status page answers every client of this listener (gateway.status_page = \"on\"): put an authenticating proxy in front", "path", statusPagePrefix+"/")
	}
	g.listeningOnce.Do(func() { close(g.listening) })
	errCh := make(chan error, 1)
	go func() { errCh <- lite.Serve(ln) }()
	select {
	case err := <-errCh:
		g.stop()
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("gateway: serve: %w", err)
	case <-ctx.Done():
	case <-g.stopCtx.Done():
	}
	// End live reads first so Shutdown does not wait for them.
	g.stop()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := lite.Shutdown(sctx); err != nil {
		g.logger.Warn("gateway shutdown incomplete", "err", err)
		_ = lite.Close()
	}
	<-errCh
	g.logger.Info("gateway stopped")
	return nil
}

// mayStayOpen reports whether r may hold its connection open for long: a
// GET whose query may name live (any '%' counts: an escaped name is not
// worth decoding here), or one of the gateway's own routes.
func mayStayOpen(r *http.Request) bool {
	if strings.HasPrefix(r.URL.Path, ownPrefix) {
		return true
	}
	if r.Method != http.MethodGet {
		return false
	}
	q := r.URL.RawQuery
	for i := range len(q) {
		if q[i] == '%' || i+4 <= len(q) && strings.EqualFold(q[i:i+4], "live") {
			return true
		}
	}
	return false
}

// Close ends live reads and makes Serve return. It is idempotent.
func (g *Gateway) Close() {
	g.closeOnce.Do(g.stop)
	g.hubs.close()
}

// Shared header values; never mutated (len == cap, so appends copy).
var (
	valNosniff      = []string{"nosniff"}
	valCORP         = []string{"cross-origin"}
	valAllowOrigin  = []string{"*"}
	valExpose       = []string{exposeHeaders}
	valAllowMethods = []string{"GET, POST, PUT, DELETE, HEAD, OPTIONS"}
	valAllowHeaders = []string{allowHeaders}
	valMaxAge       = []string{"86400"}
	valTrue         = []string{"true"}
	valNoStore      = []string{"no-store"}
	valCacheable    = []string{"public, max-age=60, stale-while-revalidate=300"}
)

// allowHeaders is the CORS allow-list of request headers: every request
// header the gateway and the subscription APIs read, but those a proxy
// sets (X-Forwarded-Host, X-Forwarded-Proto), plus the W3C trace context
// the server span continues. TestCORSHeadersComplete fails when a handler
// reads a header that is not listed here.
const allowHeaders = "Content-Type, Authorization, If-None-Match, Prefer, traceparent, tracestate, " +
	"Stream-Seq, Stream-TTL, Stream-Expires-At, Stream-Closed, Stream-Incarnation, " +
	"Stream-Record-Match, Stream-Snapshot-Match, Producer-Id, Producer-Epoch, Producer-Seq, " +
	"Stream-Forked-From, Stream-Fork-Offset, Stream-Fork-Sub-Offset"

// exposeHeaders is the CORS list of response headers a page may read:
// every header a handler sets, but the CORS-safelisted ones and those
// meant for the browser itself (X-Content-Type-Options, ...).
// TestCORSHeadersComplete fails when a handler sets one not listed here.
const exposeHeaders = "Stream-Next-Offset, Stream-Cursor, Stream-Up-To-Date, Stream-Closed, " +
	"Producer-Epoch, Producer-Seq, Producer-Expected-Seq, Producer-Received-Seq, Producer-Outcome, " +
	"ETag, Location, Allow, Retry-After, Content-Type, Content-Length, " +
	"Stream-SSE-Data-Encoding, Stream-TTL, Stream-Expires-At, " +
	"Stream-Incarnation, Stream-Previous-Incarnation, Stream-Inherited-Offset, Ursula-Cluster-Id, " +
	"Stream-Retained-Offset, Stream-Snapshot-Offset, Stream-Snapshot-Digest, Stream-Snapshot-Part-Digest, " +
	"Stream-Record-Start, Stream-Record-Next, Stream-Record-First"

// recorder remembers the status written through it.
type recorder struct {
	http.ResponseWriter
	status int
}

var recorderPool = sync.Pool{New: func() any { return new(recorder) }}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Flush lets SSE flush through the recorder.
func (r *recorder) Flush() {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// FlushError flushes and reports whether the client is still there.
func (r *recorder) FlushError() error {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if f, ok := r.ResponseWriter.(interface{ FlushError() error }); ok {
		return f.FlushError()
	}
	return http.NewResponseController(r.ResponseWriter).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// serveHTTP is the entry point: common headers, the request's server span,
// metrics, panic safety and routing.
func (g *Gateway) serveHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h["X-Content-Type-Options"] = valNosniff
	h["Cross-Origin-Resource-Policy"] = valCORP
	h["Access-Control-Allow-Origin"] = valAllowOrigin
	h["Access-Control-Expose-Headers"] = valExpose

	g.metrics.inFlight.Add(1)
	defer g.metrics.inFlight.Add(-1)
	var start time.Time
	timed := g.metrics.duration.Enabled(r.Context())
	if timed {
		start = time.Now()
	}
	ctx, span := g.startSpan(r)
	if ctx != r.Context() {
		r = r.WithContext(ctx)
	}
	rec := recorderPool.Get().(*recorder)
	rec.ResponseWriter, rec.status = w, 0
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				endSpan(span, rec.status)
				panic(p)
			}
			g.logger.ErrorContext(ctx, "gateway handler panic", "method", r.Method, "path", r.URL.Path, "panic", p)
			if rec.status == 0 {
				writeError(rec, errors.New("internal error"))
			}
		}
		status := rec.status
		if status == 0 {
			status = http.StatusOK
		}
		g.metrics.countRequest(r.Method, status)
		if timed {
			route, _ := g.routes.of(r.URL.Path)
			g.metrics.recordDuration(ctx, time.Since(start), route, r.Method, status, r.TLS != nil)
		}
		endSpan(span, status)
		rec.ResponseWriter = nil
		recorderPool.Put(rec)
	}()
	g.route(rec, r)
}

// route dispatches a request to its handler.
func (g *Gateway) route(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodOptions {
		g.preflight(w, r)
		return
	}
	path := r.URL.Path
	if strings.HasPrefix(path, ownPrefix) {
		if isStatusPage(path) {
			g.serveStatusPage(w, r)
			return
		}
		g.serveOwn(w, r, path[len(ownPrefix):])
		return
	}
	root := g.cfg.StreamRoot
	if strings.HasPrefix(path, root) {
		rest := path[len(root):]
		if rest == reservedSegment || strings.HasPrefix(rest, reservedSegment+"/") {
			if g.cfg.Subscriptions == nil {
				notFound(w, "no subscription service")
				return
			}
			g.cfg.Subscriptions.ServeHTTP(w, r)
			return
		}
		if rest == "" {
			notFound(w, "no stream named")
			return
		}
		if err := ValidateStreamID(rest); err != nil {
			badRequest(w, err)
			return
		}
		g.serveStream(w, r, target{ref: &streamv1.StreamRef{Bucket: BuiltinBucket, Stream: rest}, path: rest})
		return
	}
	if path == root[:len(root)-1] {
		notFound(w, "no stream named")
		return
	}
	g.serveUrsula(w, r, path)
}

// target is the stream a request addresses.
type target struct {
	ref *streamv1.StreamRef
	// path is the stream path relative to the stream root for the Durable
	// Streams family, empty for Ursula's family (no observer calls).
	path string
	// incarnation is the request's Stream-Incarnation (0: none).
	incarnation uint64
}

// serveUrsula serves Ursula's /{bucket} and /{bucket}/{stream} family.
func (g *Gateway) serveUrsula(w http.ResponseWriter, r *http.Request, path string) {
	p := strings.TrimPrefix(path, "/")
	if p == "" {
		notFound(w, "no such resource")
		return
	}
	bucket, stream, hasStream := strings.Cut(p, "/")
	if hasStream && strings.HasSuffix(stream, "/") && !strings.Contains(stream[:len(stream)-1], "/") {
		stream = stream[:len(stream)-1]
	}
	if err := ValidateBucket(bucket); err != nil {
		badRequest(w, err)
		return
	}
	if !hasStream || stream == "" {
		g.serveBucket(w, r, bucket)
		return
	}
	stream, sub, hasSub := strings.Cut(stream, "/")
	if err := ValidateStreamID(stream); err != nil {
		badRequest(w, err)
		return
	}
	t := target{ref: &streamv1.StreamRef{Bucket: bucket, Stream: stream}}
	if !hasSub {
		if stream == listSegment {
			g.serveList(w, r, bucket)
			return
		}
		g.serveStream(w, r, t)
		return
	}
	switch res, arg, _ := strings.Cut(sub, "/"); {
	case res == "retention" && !strings.Contains(arg, "/") && (arg != "" || strings.Contains(r.URL.RawQuery, "record=")):
		// …/retention/{offset}, or …/retention?record=N.
		if r.Method != http.MethodPut {
			methodNotAllowed(w, "PUT, OPTIONS")
			return
		}
		g.setRetention(w, r, t, arg)
	case res == "append-batch" && arg == "":
		if r.Method != http.MethodPost {
			methodNotAllowed(w, "POST, OPTIONS")
			return
		}
		inc, err := parseIncarnation(r.Header)
		if err != nil {
			badRequest(w, err)
			return
		}
		t.incarnation = inc
		g.appendBatch(w, r, t)
	case res == "snapshot" && !strings.Contains(arg, "/"):
		g.serveSnapshot(w, r, t, arg)
	case res == "snapshot":
		g.serveSnapshotParts(w, r, t, arg)
	case res == "bootstrap" && arg == "":
		g.bootstrap(w, r, t)
	case res == "attrs" && arg == "":
		g.serveAttrs(w, r, t)
	default:
		notFound(w, "no such resource")
	}
}

// serveStream dispatches a stream operation by method.
func (g *Gateway) serveStream(w http.ResponseWriter, r *http.Request, t target) {
	inc, err := parseIncarnation(r.Header)
	if err != nil {
		badRequest(w, err)
		return
	}
	t.incarnation = inc
	switch r.Method {
	case http.MethodPut:
		g.createStream(w, r, t)
	case http.MethodPost:
		g.appendStream(w, r, t)
	case http.MethodGet:
		g.readStream(w, r, t)
	case http.MethodHead:
		g.headStream(w, r, t)
	case http.MethodDelete:
		g.deleteStream(w, r, t)
	default:
		methodNotAllowed(w, "GET, POST, PUT, DELETE, HEAD, OPTIONS")
	}
}

// preflight answers a CORS preflight (any OPTIONS request).
func (g *Gateway) preflight(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h["Access-Control-Allow-Methods"] = valAllowMethods
	h["Access-Control-Allow-Headers"] = valAllowHeaders
	if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
		var extra []string
		for _, name := range strings.Split(req, ",") {
			name = strings.TrimSpace(name)
			if name == "" || !isToken(name) || containsFold(allowHeaders, name) {
				continue
			}
			extra = append(extra, name)
		}
		if len(extra) > 0 {
			h["Access-Control-Allow-Headers"] = []string{allowHeaders + ", " + strings.Join(extra, ", ")}
		}
	}
	h["Access-Control-Max-Age"] = valMaxAge
	h.Set("Allow", "GET, POST, PUT, DELETE, HEAD, OPTIONS")
	w.WriteHeader(http.StatusNoContent)
}

// containsFold reports whether the comma-separated list has name
// (case-insensitively).
func containsFold(list, name string) bool {
	for _, item := range strings.Split(list, ",") {
		if strings.EqualFold(strings.TrimSpace(item), name) {
			return true
		}
	}
	return false
}

// isToken reports whether s is an HTTP token (a valid header name).
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return s != ""
}
