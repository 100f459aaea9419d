package httpserver

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// deadlineWriter is a ResponseWriter that records the deadlines set on it
// (http.ResponseController finds its methods) and the size of each write.
type deadlineWriter struct {
	header http.Header
	clock  *fakeClock
	reads  []time.Duration // each read deadline, relative to the clock when set (0: cleared)
	writes []time.Duration
	pieces []int
	// writeDeadline is the write deadline in force.
	writeDeadline time.Time
	// atWrite is, for each write, how long the deadline in force left.
	atWrite []time.Duration
	flushes int
}

func (w *deadlineWriter) Header() http.Header { return w.header }
func (w *deadlineWriter) WriteHeader(int)     {}
func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.pieces = append(w.pieces, len(p))
	left := time.Duration(0)
	if !w.writeDeadline.IsZero() {
		left = w.writeDeadline.Sub(w.clock.Now())
	}
	w.atWrite = append(w.atWrite, left)
	return len(p), nil
}
func (w *deadlineWriter) FlushError() error { w.flushes++; return nil }
func (w *deadlineWriter) SetReadDeadline(t time.Time) error {
	w.reads = append(w.reads, rel(t, w.clock.Now()))
	return nil
}
func (w *deadlineWriter) SetWriteDeadline(t time.Time) error {
	w.writeDeadline = t
	w.writes = append(w.writes, rel(t, w.clock.Now()))
	return nil
}

func rel(t, now time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return t.Sub(now)
}

// trickle is a request body that hands out one byte per read and moves
// the clock by step before each.
type trickle struct {
	clock *fakeClock
	step  time.Duration
	left  int
	reads int
}

func (b *trickle) Read(p []byte) (int, error) {
	if b.left == 0 {
		return 0, io.EOF
	}
	b.clock.Add(b.step)
	b.reads++
	b.left--
	p[0] = 'x'
	if b.left == 0 {
		return 1, io.EOF
	}
	return 1, nil
}

func (b *trickle) Close() error { return nil }

func testHandler(cfg Config, clock *fakeClock, h http.HandlerFunc) http.Handler {
	hd := cfg.Handler(h).(*handler)
	hd.now = clock.Now
	return hd
}

// TestBodyProgressDeadline: a body that keeps arriving, one byte every
// 0.4 timeouts, for 20 timeouts in all, is read to the end: every read
// starts with at least half a timeout left, the deadline is moved only
// when less than half is left, the first deadline is set before the
// handler runs, and after EOF on HTTP/1 the deadline is never touched
// again (the server's background read owns it then).
func TestBodyProgressDeadline(t *testing.T) {
	const timeout = 10 * time.Second
	clock := &fakeClock{now: time.Unix(1000, 0)}
	w := &deadlineWriter{header: http.Header{}, clock: clock}
	body := &trickle{clock: clock, step: 4 * time.Second, left: 50}
	var got []byte
	var readsAtStart int
	h := testHandler(Config{BodyReadTimeout: timeout}, clock, func(_ http.ResponseWriter, r *http.Request) {
		readsAtStart = len(w.reads)
		var err error
		got, err = io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("read body: %v", err)
		}
		// Reads after EOF leave the deadline alone.
		n := len(w.reads)
		_, _ = r.Body.Read(make([]byte, 1))
		if len(w.reads) != n {
			t.Errorf("a read after EOF set a read deadline")
		}
	})
	req, _ := http.NewRequest(http.MethodPost, "http://x/", body)
	req.ContentLength = 50
	h.ServeHTTP(w, req)
	if len(got) != 50 {
		t.Fatalf("read %d bytes, want 50", len(got))
	}
	if readsAtStart != 1 || w.reads[0] != timeout {
		t.Fatalf("deadline before the handler: %v (set %d times)", w.reads, readsAtStart)
	}
	// 50 reads 4 s apart: the deadline is moved every other read at most.
	if len(w.reads) < 10 || len(w.reads) > 30 {
		t.Fatalf("read deadline set %d times for 50 reads: %v", len(w.reads), w.reads)
	}
	for i, d := range w.reads {
		if d != timeout {
			t.Fatalf("read deadline %d set %v ahead, want %v", i, d, timeout)
		}
	}
}

// TestBodyProgressDeadlineHTTP2: on HTTP/2 the read deadline is cleared at
// EOF (a deadline that passes there resets the stream).
func TestBodyProgressDeadlineHTTP2(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	w := &deadlineWriter{header: http.Header{}, clock: clock}
	h := testHandler(Config{BodyReadTimeout: time.Second}, clock, func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
	})
	req, _ := http.NewRequest(http.MethodPost, "http://x/", &trickle{clock: clock, step: time.Millisecond, left: 3})
	req.ContentLength, req.ProtoMajor = 3, 2
	h.ServeHTTP(w, req)
	if n := len(w.reads); n < 2 || w.reads[n-1] != 0 {
		t.Fatalf("read deadlines %v: the last must clear", w.reads)
	}
}

// TestNoBodyNoReadDeadline: a request without a body never gets a read
// deadline (on HTTP/1 the server's background read runs from the start,
// and a deadline would end it and cancel the request).
func TestNoBodyNoReadDeadline(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	w := &deadlineWriter{header: http.Header{}, clock: clock}
	h := testHandler(Config{}, clock, func(http.ResponseWriter, *http.Request) {})
	req, _ := http.NewRequest(http.MethodGet, "http://x/", nil)
	h.ServeHTTP(w, req)
	if len(w.reads) != 0 {
		t.Fatalf("read deadlines %v on a request without a body", w.reads)
	}
}

// TestBodyWrappedInPlace: the handler reads the body through the wrapper
// (which sets its read deadline), and once it returned the request holds
// its own body again: the wrapper is pooled and must not stay reachable
// from a request its caller may look at or serve again.
func TestBodyWrappedInPlace(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	for i := range 2 { // the second request gets the pooled wrapper back
		w := &deadlineWriter{header: http.Header{}, clock: clock}
		body := fmt.Sprintf("body %d", i)
		var got string
		var wrapped bool
		h := testHandler(Config{}, clock, func(_ http.ResponseWriter, r *http.Request) {
			_, wrapped = r.Body.(*progressBody)
			b, err := io.ReadAll(r.Body)
			if err != nil {
				t.Errorf("read body: %v", err)
			}
			got = string(b)
		})
		req, _ := http.NewRequest(http.MethodPost, "http://x/", strings.NewReader(body))
		orig := req.Body
		h.ServeHTTP(w, req)
		if !wrapped || got != body {
			t.Fatalf("request %d: handler read %q through the wrapper %v, want %q through it", i, got, wrapped, body)
		}
		if req.Body != orig {
			t.Fatalf("request %d: body after the handler is %T, want the request's own", i, req.Body)
		}
		if len(w.reads) == 0 {
			t.Fatalf("request %d: no read deadline set", i)
		}
	}
}

// TestWriteProgressDeadline: a large write goes out in pieces of at most
// 64 KiB, each starting with at least half the timeout left; a deadline
// the handler sets itself is kept until it sets the zero time; the last
// flush after the handler gets a deadline too.
func TestWriteProgressDeadline(t *testing.T) {
	const timeout = 10 * time.Second
	clock := &fakeClock{now: time.Unix(1000, 0)}
	w := &deadlineWriter{header: http.Header{}, clock: clock}
	h := testHandler(Config{WriteTimeout: timeout}, clock, func(rw http.ResponseWriter, _ *http.Request) {
		rc := http.NewResponseController(rw)
		// 1 MiB in one call, the clock moving 3 s per piece.
		for range 4 {
			clock.Add(3 * time.Second)
			if _, err := rw.Write(make([]byte, 256<<10)); err != nil {
				t.Error(err)
			}
		}
		if err := rc.Flush(); err != nil {
			t.Error(err)
		}
		// A deadline of the handler's own.
		own := clock.Now().Add(time.Second)
		if err := rc.SetWriteDeadline(own); err != nil {
			t.Error(err)
		}
		clock.Add(time.Hour)
		n := len(w.writes)
		_, _ = rw.Write([]byte("x"))
		if len(w.writes) != n || !w.writeDeadline.Equal(own) {
			t.Error("a write replaced the handler's own deadline")
		}
		if err := rc.SetWriteDeadline(time.Time{}); err != nil {
			t.Error(err)
		}
		_, _ = rw.Write([]byte("y"))
		if w.writes[len(w.writes)-1] != timeout {
			t.Errorf("after the handler cleared its deadline: %v", w.writes)
		}
	})
	req, _ := http.NewRequest(http.MethodGet, "http://x/", nil)
	h.ServeHTTP(w, req)
	for i, n := range w.pieces[:16] {
		if n != writePiece {
			t.Fatalf("piece %d is %d bytes, want %d", i, n, writePiece)
		}
	}
	for i, left := range w.atWrite {
		if i == 16 { // the write under the handler's own deadline, an hour late
			continue
		}
		if left < timeout/2 {
			t.Fatalf("write %d started with %v left, want at least %v", i, left, timeout/2)
		}
	}
	if w.flushes != 1 {
		t.Fatalf("%d flushes", w.flushes)
	}
}

// TestWriteDeadlineHTTP2: on HTTP/2 each write's deadline is cleared after
// it, so an idle SSE stream is never reset.
func TestWriteDeadlineHTTP2(t *testing.T) {
	clock := &fakeClock{now: time.Unix(1000, 0)}
	w := &deadlineWriter{header: http.Header{}, clock: clock}
	h := testHandler(Config{WriteTimeout: time.Second}, clock, func(rw http.ResponseWriter, _ *http.Request) {
		_, _ = rw.Write([]byte("event"))
		if !w.writeDeadline.IsZero() {
			t.Error("the deadline outlived the write")
		}
	})
	req, _ := http.NewRequest(http.MethodGet, "http://x/", nil)
	req.ProtoMajor = 2
	h.ServeHTTP(w, req)
	if len(w.writes) != 2 || w.writes[0] != time.Second || w.writes[1] != 0 {
		t.Fatalf("write deadlines %v, want [1s 0]", w.writes)
	}
}

// serve runs Server(h) on a loopback listener until the test ends.
func serve(t *testing.T, cfg Config, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := cfg.Server(h, nil)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return ln.Addr().String()
}

// readUntilClosed reads from c until the server closes it and returns
// what came.
func readUntilClosed(t *testing.T, c net.Conn) string {
	t.Helper()
	// A bound for a broken server, not a synchronization: the server
	// closes the connection well within it.
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	b, err := io.ReadAll(c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the server did not close the connection: %v (read %q)", err, b)
	}
	return string(b)
}

// TestStalledBodyCutOff: a client that announces a body and stops sending
// it is cut off: the handler's read fails with ErrBodyStalled, and the
// connection is closed after the answer.
func TestStalledBodyCutOff(t *testing.T) {
	readErr := make(chan error, 1)
	addr := serve(t, Config{BodyReadTimeout: 200 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		readErr <- err
		w.WriteHeader(http.StatusRequestTimeout)
	}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
	if err := <-readErr; !errors.Is(err, ErrBodyStalled) {
		t.Fatalf("read error %v, want ErrBodyStalled", err)
	}
	if got := readUntilClosed(t, c); !strings.HasPrefix(got, "HTTP/1.1 408") {
		t.Fatalf("answer %q", got)
	}
}

// TestUnreadBodyDrainBounded: a handler that answers without reading a
// body the client announced but never sends (before its first flush, as
// an SSE response does) is not held by the server's own reading of that
// body: the flush returns, and the connection is closed.
func TestUnreadBodyDrainBounded(t *testing.T) {
	flushed := make(chan error, 1)
	addr := serve(t, Config{BodyReadTimeout: 200 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		flushed <- http.NewResponseController(w).Flush()
		_, _ = w.Write([]byte("done"))
	}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
	if err := <-flushed; err != nil {
		t.Fatalf("flush: %v", err)
	}
	if got := readUntilClosed(t, c); !strings.HasPrefix(got, "HTTP/1.1 200") || !strings.Contains(got, "done") {
		t.Fatalf("answer %q", got)
	}
}

// TestSlowReaderCutOff: a response to a client that does not read fails
// once the socket buffers are full and no write progresses for the write
// timeout; the handler is freed, and it was not cut while the client
// read.
func TestSlowReaderCutOff(t *testing.T) {
	writeErr := make(chan error, 1)
	chunk := bytes.Repeat([]byte("x"), 1<<20)
	addr := serve(t, Config{WriteTimeout: 200 * time.Millisecond}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/small" {
			_, _ = w.Write([]byte("ok"))
			return
		}
		for range 256 { // 256 MiB, far beyond any socket buffer
			if _, err := w.Write(chunk); err != nil {
				writeErr <- err
				return
			}
		}
		writeErr <- nil
	}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
	err = <-writeErr
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("write error %v, want a timeout", err)
	}
	// The server still serves others.
	resp, err := http.Get("http://" + addr + "/small")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if string(b) != "ok" {
		t.Fatalf("body %q", b)
	}
}

// TestKeepAliveAfterBody: a request whose body was read to the end leaves
// the connection usable: the next request on it is served, with a live
// context.
func TestKeepAliveAfterBody(t *testing.T) {
	addr := serve(t, Config{BodyReadTimeout: time.Second}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil || r.Context().Err() != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "%d", len(b))
	}))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	for i, body := range []string{"hello", "", "again"} {
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		req, _ := http.NewRequest(http.MethodPost, "/", nil)
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != fmt.Sprint(len(body)) {
			t.Fatalf("request %d: %d %q", i, resp.StatusCode, b)
		}
	}
}

// TestConfig: defaults, validation and flags.
func TestConfig(t *testing.T) {
	var c Config
	c.ApplyDefaults()
	if c.ReadHeaderTimeout != DefaultReadHeaderTimeout || c.BodyReadTimeout != DefaultBodyReadTimeout ||
		c.WriteTimeout != DefaultWriteTimeout || c.IdleTimeout != DefaultIdleTimeout || c.MaxHeaderBytes != DefaultMaxHeaderBytes {
		t.Fatalf("defaults %+v", c)
	}
	if err := (Config{WriteTimeout: -1}).Validate("gateway.http"); err == nil || !strings.Contains(err.Error(), "gateway.http.write_timeout") {
		t.Fatalf("validate: %v", err)
	}
	srv := Config{IdleTimeout: time.Minute}.Server(http.NotFoundHandler(), nil)
	if srv.IdleTimeout != time.Minute || srv.ReadHeaderTimeout != DefaultReadHeaderTimeout || srv.MaxHeaderBytes != DefaultMaxHeaderBytes {
		t.Fatalf("server %+v", srv)
	}
}
