package httpserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
)

// Lite serves the requests of an http.Server whose framing is plain on a
// lighter loop of its own, and hands every other connection, unread, to
// the http.Server itself.
//
// net/http costs a request more than its system calls: a background read
// started for every request whose body was consumed (a goroutine switch,
// a read that returns EAGAIN, a deadline to end it), a context and a
// cancel per request, the MIME reader's allocations. Lite reads a request
// only when all of it is what it understands: HTTP/1.1, a GET, POST, PUT
// or DELETE with an origin-form target, a header block that fits its
// 4 KiB buffer with CRLF line endings and no folded lines, at most one
// Content-Length and no Transfer-Encoding, Expect or Upgrade, exactly one
// Host, and not named by the caller's handOff function (requests that may
// stay open, such as SSE and long-polls, must notice a client that goes
// away, which net/http's background read does). Anything else (a bare LF, a request too large for the buffer, a method
// or header it does not know, a malformed line) is never parsed here: the
// connection goes to the http.Server with every byte still unread, which
// answers it, or refuses it, exactly as it would have without Lite. So
// Lite can only narrow what reaches the handler, never widen it: it is a
// fast path, not a second parser with opinions of its own.
//
// The handler sees what net/http would give it (method, URL, Header with
// canonical keys and Host taken out, Host, RemoteAddr, RequestURI,
// ContentLength, Body) and a ResponseWriter with Flush, FlushError and
// the read and write deadlines of http.ResponseController. The response
// gets net/http's framing: a Date header, Content-Length when the handler
// wrote at most 4 KiB before returning (else chunked), a sniffed
// Content-Type when it set none, no body for 204 and 304.
type Lite struct {
	srv     *http.Server
	handOff func(*http.Request) bool
	handoff *handoffListener

	mu      sync.Mutex
	conns   map[*liteConn]struct{}
	closing atomic.Bool
	active  sync.WaitGroup
}

// NewLite returns a Lite in front of srv, whose Handler, timeouts,
// ConnContext and ErrorLog it uses; Serve starts srv too. handOff, when
// not nil, names more requests that go to srv with their connection
// (those that may stay open for long, such as an event stream, and must
// notice a client that went away).
func NewLite(srv *http.Server, handOff func(*http.Request) bool) *Lite {
	return &Lite{srv: srv, handOff: handOff, conns: map[*liteConn]struct{}{}}
}

// Serve accepts connections on ln until Shutdown or Close, serving them
// itself or through the http.Server; it returns http.ErrServerClosed
// after Shutdown or Close.
func (s *Lite) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.handoff = newHandoffListener(ln)
	s.mu.Unlock()
	served := make(chan error, 1)
	go func() { served <- s.srv.Serve(s.handoff) }()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				s.handoff.Close()
				<-served
				return err
			}
			// As net/http does for a failed accept (out of file
			// descriptors, say): wait and try again.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		lc := &liteConn{c: c}
		if !s.track(lc) {
			_ = c.Close()
			return http.ErrServerClosed
		}
		go s.serveConn(lc)
	}
}

// Shutdown stops accepting, closes idle connections, waits for those
// serving a request (until ctx ends) and shuts the http.Server down.
func (s *Lite) Shutdown(ctx context.Context) error {
	s.stop()
	done := make(chan struct{})
	go func() { s.active.Wait(); close(done) }()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
		s.closeAll()
	}
	if serr := s.srv.Shutdown(ctx); err == nil {
		err = serr
	}
	return err
}

// Close closes every connection at once, and the http.Server.
func (s *Lite) Close() error {
	s.stop()
	s.closeAll()
	return s.srv.Close()
}

// stop refuses new connections and wakes the idle ones, which then close.
func (s *Lite) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closing.Store(true)
	if s.handoff != nil {
		_ = s.handoff.inner.Close()
	}
	for lc := range s.conns {
		if lc.idle.Load() {
			_ = lc.c.SetReadDeadline(time.Now())
		}
	}
}

func (s *Lite) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for lc := range s.conns {
		_ = lc.c.Close()
	}
}

func (s *Lite) track(lc *liteConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing.Load() {
		return false
	}
	s.conns[lc] = struct{}{}
	s.active.Add(1)
	return true
}

func (s *Lite) untrack(lc *liteConn) {
	s.mu.Lock()
	delete(s.conns, lc)
	s.mu.Unlock()
	s.active.Done()
}

// liteConn is one connection Lite serves.
type liteConn struct {
	c    net.Conn
	idle atomic.Bool // waiting for its next request
}

// Buffers of a connection: a request's header block must fit the reader
// to be served here; a response body up to liteBuffered bytes is held to
// be sent with its Content-Length.
const (
	liteBufSize  = 4 << 10
	liteBuffered = 4 << 10
	// liteDiscard is how much of a body the handler left unread is read
	// and dropped to keep the connection (net/http's figure); beyond it
	// the connection is closed.
	liteDiscard = 256 << 10
)

var (
	liteReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, liteBufSize) }}
	liteWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, liteBufSize) }}
)

func (s *Lite) serveConn(lc *liteConn) {
	c := lc.c
	handedOff := false
	br := liteReaders.Get().(*bufio.Reader)
	br.Reset(c)
	bw := liteWriters.Get().(*bufio.Writer)
	bw.Reset(c)
	ctx := context.Background()
	if s.srv.ConnContext != nil {
		ctx = s.srv.ConnContext(ctx, c)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		if p := recover(); p != nil && p != http.ErrAbortHandler {
			buf := make([]byte, 64<<10)
			buf = buf[:runtime.Stack(buf, false)]
			s.logf("http: panic serving %v: %v\n%s", c.RemoteAddr(), p, buf)
		}
		if !handedOff {
			_ = c.Close()
			br.Reset(nil)
			liteReaders.Put(br)
		}
		bw.Reset(nil)
		liteWriters.Put(bw)
		s.untrack(lc)
	}()
	remote := c.RemoteAddr().String()
	idle, header := s.srv.IdleTimeout, s.srv.ReadHeaderTimeout
	if idle == 0 {
		idle = header
	}
	for first := true; ; first = false {
		// Until its next request starts, the connection is idle: Shutdown
		// closes it.
		lc.idle.Store(true)
		wait := idle
		if first {
			wait = header
		}
		if wait > 0 {
			_ = c.SetReadDeadline(time.Now().Add(wait))
		}
		// Checked after the deadline is set: Shutdown sets its own on idle
		// connections after it marks the server closing, so one of the
		// two ends this wait.
		if s.closing.Load() {
			return
		}
		if _, err := br.Peek(1); err != nil {
			return
		}
		lc.idle.Store(false)
		if header > 0 && !first {
			_ = c.SetReadDeadline(time.Now().Add(header))
		}
		block, err := peekHeader(br)
		if err != nil {
			return
		}
		var req *http.Request
		if block != nil {
			req = parseRequest(ctx, block)
		}
		if req != nil && s.handOff != nil && s.handOff(req) {
			req = nil
		}
		if req == nil {
			// Not ours: the http.Server reads it from its first byte.
			if s.handoff.give(&handedConn{Conn: c, r: br}) {
				handedOff = true
			}
			return
		}
		_, _ = br.Discard(len(block))
		req.RemoteAddr = remote
		var body *liteBody
		if req.ContentLength > 0 {
			body = &liteBody{br: br, n: req.ContentLength}
			req.Body = body
		} else {
			req.Body = http.NoBody
		}
		w := &liteResponse{c: c, bw: bw, header: make(http.Header, 8), closeAfter: req.Close}
		s.srv.Handler.ServeHTTP(w, req)
		if body != nil && body.n > 0 {
			if body.n > liteDiscard {
				w.closeAfter = true
			} else if _, err := io.Copy(io.Discard, body); err != nil || body.n > 0 {
				w.closeAfter = true
			}
		}
		if s.closing.Load() {
			w.closeAfter = true
		}
		if err := w.finish(); err != nil || w.closeAfter {
			return
		}
	}
}

func (s *Lite) logf(format string, args ...any) {
	if s.srv.ErrorLog != nil {
		s.srv.ErrorLog.Printf(format, args...)
	}
}

// peekHeader returns the request's header block (through its empty line)
// without consuming it, reading more as needed; nil when the block is not
// one Lite serves: it does not fit the buffer, or a line ends in a bare
// LF.
func peekHeader(br *bufio.Reader) ([]byte, error) {
	checked := 0
	for {
		buf, _ := br.Peek(br.Buffered())
		for i := checked; i < len(buf); i++ {
			if buf[i] != '\n' {
				continue
			}
			if i == 0 || buf[i-1] != '\r' {
				return nil, nil
			}
			if i >= 3 && buf[i-2] == '\n' && buf[i-3] == '\r' {
				return buf[:i+1], nil
			}
		}
		checked = len(buf)
		if len(buf) == br.Size() {
			return nil, nil
		}
		if _, err := br.Peek(len(buf) + 1); err != nil {
			if len(buf) > 0 && errors.Is(err, io.EOF) {
				// A partial request and then the end: the http.Server
				// answers what it makes of it.
				return nil, nil
			}
			return nil, err
		}
	}
}

// parseRequest parses block (a header block from peekHeader) into a
// request on ctx, or returns nil when Lite does not serve it.
func parseRequest(ctx context.Context, block []byte) *http.Request {
	// One string holds the whole block: every method, target, name and
	// value below is a piece of it.
	text := string(block[:len(block)-2])
	line, rest, ok := cutLine(text)
	if !ok {
		return nil
	}
	var method string
	switch {
	case len(line) > 4 && line[:4] == "GET ":
		method = http.MethodGet
	case len(line) > 5 && line[:5] == "POST ":
		method = http.MethodPost
	case len(line) > 4 && line[:4] == "PUT ":
		method = http.MethodPut
	case len(line) > 7 && line[:7] == "DELETE ":
		method = http.MethodDelete
	default:
		return nil
	}
	line = line[len(method)+1:]
	const proto = " HTTP/1.1"
	if len(line) <= len(proto) || line[len(line)-len(proto):] != proto {
		return nil
	}
	target := line[:len(line)-len(proto)]
	if target[0] != '/' {
		return nil
	}
	for i := 0; i < len(target); i++ {
		if b := target[i]; b <= ' ' || b >= 0x7f {
			return nil
		}
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil
	}

	// Count the lines to size the header map and its values at once.
	n := 0
	for i := 0; i < len(rest); i++ {
		if rest[i] == '\n' {
			n++
		}
	}
	h := make(http.Header, n)
	vals := make([]string, n)
	var host string
	hosts, lengths := 0, 0
	length := int64(0)
	closeAfter := false
	for i := 0; len(rest) > 0; i++ {
		line, rest, ok = cutLine(rest)
		if !ok {
			return nil
		}
		name, value, ok := strings.Cut(line, ":")
		value = trimOWS(value)
		if !ok || !httpguts.ValidHeaderFieldName(name) || !httpguts.ValidHeaderFieldValue(value) {
			return nil
		}
		key := http.CanonicalHeaderKey(name)
		switch key {
		case "Host":
			hosts++
			host = value
			if host == "" || !httpguts.ValidHostHeader(host) {
				return nil
			}
			continue
		case "Content-Length":
			lengths++
			if lengths > 1 {
				return nil
			}
			if length, ok = parseLength(value); !ok {
				return nil
			}
		case "Transfer-Encoding", "Expect", "Upgrade", "Te", "Trailer":
			return nil
		case "Connection":
			switch {
			case asciiEqualFold(value, "close"):
				closeAfter = true
			case asciiEqualFold(value, "keep-alive"):
			default:
				return nil
			}
		}
		vals[i] = value
		if prev, ok := h[key]; ok {
			h[key] = append(prev, value)
		} else {
			h[key] = vals[i : i+1 : i+1]
		}
	}
	if hosts != 1 {
		return nil
	}
	r := new(http.Request).WithContext(ctx)
	r.Method = method
	r.URL = u
	r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.1", 1, 1
	r.Header = h
	r.Host = host
	r.RequestURI = target
	r.ContentLength = length
	r.Close = closeAfter
	return r
}

// cutLine splits off the first CRLF-terminated line of s.
func cutLine(s string) (line, rest string, ok bool) {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '\r' {
			if s[i+1] != '\n' {
				return "", "", false
			}
			return s[:i], s[i+2:], true
		}
	}
	return "", "", false
}

func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

func parseLength(v string) (int64, bool) {
	if v == "" || len(v) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
		n = n*10 + int64(v[i]-'0')
	}
	return n, true
}

func asciiEqualFold(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if b >= 'A' && b <= 'Z' {
			b += 'a' - 'A'
		}
		if b != lower[i] {
			return false
		}
	}
	return true
}

// liteBody is a request body of a known length read from the
// connection's reader.
type liteBody struct {
	br *bufio.Reader
	n  int64 // bytes left
}

func (b *liteBody) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.br.Read(p)
	b.n -= int64(n)
	if b.n == 0 {
		return n, io.EOF
	}
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (b *liteBody) Close() error { return nil }

// liteResponse is the ResponseWriter of a request Lite serves.
type liteResponse struct {
	c          net.Conn
	bw         *bufio.Writer
	header     http.Header
	status     int
	declared   int64 // Content-Length the handler set, -1 for none
	written    int64 // body bytes the handler wrote
	held       []byte
	sent       bool // the status line and header are in bw
	chunked    bool
	closeAfter bool
	err        error
}

func (w *liteResponse) Header() http.Header { return w.header }

func (w *liteResponse) WriteHeader(code int) {
	if w.status != 0 || code < 200 {
		// A second call is ignored, as net/http does; informational
		// answers are not sent.
		return
	}
	if code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	w.status = code
	w.declared = -1
	if v := w.header.Get("Content-Length"); v != "" {
		if n, ok := parseLength(v); ok {
			w.declared = n
		} else {
			delete(w.header, "Content-Length")
		}
	}
}

// bodyAllowed reports whether the status may carry a body.
func (w *liteResponse) bodyAllowed() bool {
	return w.status != http.StatusNoContent && w.status != http.StatusNotModified
}

func (w *liteResponse) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.bodyAllowed() {
		return 0, http.ErrBodyNotAllowed
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.declared >= 0 && w.written+int64(len(p)) > w.declared {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if !w.sent {
		if len(w.held)+len(p) <= liteBuffered {
			w.held = append(w.held, p...)
			return len(p), nil
		}
		w.sendHeader(false, p)
	}
	return w.writeBody(p)
}

// writeBody writes p after the header, in a chunk when chunked.
func (w *liteResponse) writeBody(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if w.chunked {
		var size [20]byte
		w.bw.Write(strconv.AppendInt(size[:0], int64(len(p)), 16))
		w.bw.WriteString("\r\n")
	}
	n, err := w.bw.Write(p)
	if w.chunked && err == nil {
		_, err = w.bw.WriteString("\r\n")
	}
	if err != nil {
		w.err = err
		w.closeAfter = true
	}
	return n, err
}

// FlushError sends what the handler wrote so far.
func (w *liteResponse) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return w.err
	}
	if !w.sent {
		w.sendHeader(false, nil)
	}
	if err := w.bw.Flush(); err != nil {
		w.err = err
		w.closeAfter = true
		return err
	}
	return nil
}

func (w *liteResponse) Flush() { _ = w.FlushError() }

// SetReadDeadline and SetWriteDeadline serve http.ResponseController.
func (w *liteResponse) SetReadDeadline(t time.Time) error  { return w.c.SetReadDeadline(t) }
func (w *liteResponse) SetWriteDeadline(t time.Time) error { return w.c.SetWriteDeadline(t) }

// sendHeader writes the status line and the header into bw, followed by
// the held body. final: the handler has returned, so the held body is
// the whole body and its length is known. next is what the handler is
// writing now, for sniffing when nothing is held.
func (w *liteResponse) sendHeader(final bool, next []byte) {
	w.sent = true
	h := w.header
	length := -1
	allowed := w.bodyAllowed()
	if allowed {
		if _, ok := h["Content-Type"]; !ok {
			if sniff := w.held; len(sniff) > 0 {
				h.Set("Content-Type", http.DetectContentType(sniff))
			} else if len(next) > 0 {
				h.Set("Content-Type", http.DetectContentType(next))
			}
		}
		switch {
		case w.declared >= 0:
		case final:
			// Written below rather than set in h: one more key grew the
			// map of a typical answer, 8 % of the bytes the gateway
			// allocated per append.
			length = len(w.held)
		default:
			w.chunked = true
		}
	} else {
		delete(h, "Transfer-Encoding")
		if w.status == http.StatusNoContent {
			delete(h, "Content-Length")
		}
	}
	bw := w.bw
	var num [20]byte
	bw.WriteString("HTTP/1.1 ")
	bw.Write(strconv.AppendInt(num[:0], int64(w.status), 10))
	bw.WriteByte(' ')
	bw.WriteString(http.StatusText(w.status))
	bw.WriteString("\r\n")
	if _, ok := h["Date"]; !ok {
		bw.WriteString("Date: ")
		bw.WriteString(httpDate())
		bw.WriteString("\r\n")
	}
	for k, vs := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range vs {
			bw.WriteString(k)
			bw.WriteString(": ")
			writeHeaderValue(bw, v)
			bw.WriteString("\r\n")
		}
	}
	if length >= 0 {
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(num[:0], int64(length), 10))
		bw.WriteString("\r\n")
	}
	if w.chunked {
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	if w.closeAfter {
		bw.WriteString("Connection: close\r\n")
	}
	bw.WriteString("\r\n")
	held := w.held
	w.held = nil
	if allowed {
		w.writeBody(held)
	}
}

// finish completes the response after the handler returned and flushes
// it; an error means the connection cannot carry another request.
func (w *liteResponse) finish() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.declared >= 0 && w.written < w.declared && w.bodyAllowed() {
		// The body is shorter than announced: the client can only tell
		// by the connection's end.
		w.closeAfter = true
	}
	if !w.sent {
		w.sendHeader(true, nil)
	}
	if w.chunked && w.err == nil {
		w.bw.WriteString("0\r\n\r\n")
	}
	if w.err != nil {
		return w.err
	}
	return w.bw.Flush()
}

// writeHeaderValue writes v with CR and LF replaced by spaces, as
// net/http does, so that no value can start a line of its own.
func writeHeaderValue(bw *bufio.Writer, v string) {
	if !strings.ContainsAny(v, "\r\n") {
		bw.WriteString(v)
		return
	}
	for i := 0; i < len(v); i++ {
		if b := v[i]; b == '\r' || b == '\n' {
			bw.WriteByte(' ')
		} else {
			bw.WriteByte(b)
		}
	}
}

// httpDate is the Date header's value, formatted once a second.
func httpDate() string {
	now := time.Now()
	sec := now.Unix()
	if d := cachedDate.Load(); d != nil && d.sec == sec {
		return d.text
	}
	d := &dateText{sec: sec, text: now.UTC().Format(http.TimeFormat)}
	cachedDate.Store(d)
	return d.text
}

type dateText struct {
	sec  int64
	text string
}

var cachedDate atomic.Pointer[dateText]

// handoffListener hands connections Lite does not serve to the
// http.Server.
type handoffListener struct {
	inner net.Listener
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newHandoffListener(inner net.Listener) *handoffListener {
	return &handoffListener{inner: inner, conns: make(chan net.Conn), done: make(chan struct{})}
}

// give hands c over; false when the http.Server stopped accepting.
func (l *handoffListener) give(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.inner.Addr() }

// handedConn is a connection handed to the http.Server: its reads start
// with what Lite's reader holds.
type handedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *handedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// NetConn returns the accepted connection, unwrapped.
func (c *handedConn) NetConn() net.Conn {
	if nc, ok := c.Conn.(interface{ NetConn() net.Conn }); ok {
		return nc.NetConn()
	}
	return c.Conn
}
