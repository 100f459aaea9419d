package httpserver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ursula/ursula/tests/await"
)

// liteSeeds are requests for the parser tests: what Lite serves and what
// it must leave to net/http.
var liteSeeds = []string{
	"GET /v1/stream/a?offset=-1 HTTP/1.1\r\nHost: x\r\n\r\n",
	"POST /v1/stream/a HTTP/1.1\r\nHost: 127.0.0.1:4437\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nProducer-Id: p\r\n\r\nhello",
	"PUT /s HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nx-a: 1\r\nX-A: 2\r\nconnection: close\r\n\r\n",
	"DELETE /s HTTP/1.1\r\nHost: [::1]:80\r\nConnection: keep-alive\r\n\r\n",
	"GET /s?live=sse HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /s?offset=1&LIVE=long-poll HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /s?%6cive=sse HTTP/1.1\r\nHost: x\r\n\r\n",
	"HEAD /s HTTP/1.1\r\nHost: x\r\n\r\n",
	"OPTIONS /s HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /s HTTP/1.0\r\nHost: x\r\n\r\n",
	"GET http://x/s HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /s HTTP/1.1\r\n\r\n",
	"GET /s HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
	"GET /s HTTP/1.1\nHost: x\n\n",
	"GET /s HTTP/1.1\r\nHost: x\n\r\n",
	"GET /s HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",
	"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
	"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
	"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\nabc",
	"POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 3 \r\n\r\nabc",
	"POST /s HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
	"GET /s HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
	"GET /s HTTP/1.1\r\nHost: x\r\nBad Name: 1\r\n\r\n",
	"GET /s HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n",
	"GET /s HTTP/1.1\r\nHost: x y\r\n\r\n",
	"GET /s HTTP/1.1\r\nHost: x\r\n: empty\r\n\r\n",
	"GET /a b HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /\x80 HTTP/1.1\r\nHost: x\r\n\r\n",
	"get /s HTTP/1.1\r\nHost: x\r\n\r\n",
	"GET /s HTTP/1.1\r\nHost: x\r\nX-Empty:\r\nX-Tab:\tv\t\r\n\r\n",
}

// FuzzParseRequest: whatever Lite parses, net/http parses the same way
// (method, URL, Host, header, length, close); everything else Lite leaves
// alone.
func FuzzParseRequest(f *testing.F) {
	for _, s := range liteSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		br := bufio.NewReaderSize(bytes.NewReader(raw), liteBufSize)
		block, err := peekHeader(br)
		if err != nil || block == nil {
			return
		}
		got := parseRequest(context.Background(), block)
		if got == nil {
			return
		}
		want, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			t.Fatalf("Lite parsed %q, net/http refuses it: %v", raw, err)
		}
		if got.Method != want.Method || got.URL.String() != want.URL.String() || got.RequestURI != want.RequestURI ||
			got.Host != want.Host || got.ContentLength != want.ContentLength || got.Close != want.Close ||
			!sameHeader(got.Header, want.Header) {
			t.Fatalf("%q:\nLite     %s %s host %q len %d close %v %v\nnet/http %s %s host %q len %d close %v %v", raw,
				got.Method, got.URL, got.Host, got.ContentLength, got.Close, got.Header,
				want.Method, want.URL, want.Host, want.ContentLength, want.Close, want.Header)
		}
		if len(want.TransferEncoding) != 0 || want.ProtoMinor != 1 {
			t.Fatalf("%q: Lite parsed a request net/http frames otherwise", raw)
		}
	})
}

func sameHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if !slices.Equal(v, b[k]) {
			return false
		}
	}
	return true
}

// TestLiteServesOnlyPlainRequests: the seeds Lite must serve, and those it
// must leave to net/http.
func TestLiteServesOnlyPlainRequests(t *testing.T) {
	served := map[int]bool{0: true, 1: true, 2: true, 3: true, 4: true, 5: true, 6: true, 20: true, 30: true}
	for i, s := range liteSeeds {
		br := bufio.NewReaderSize(strings.NewReader(s), liteBufSize)
		block, err := peekHeader(br)
		if err != nil {
			t.Fatalf("seed %d: %v", i, err)
		}
		ok := block != nil && parseRequest(context.Background(), block) != nil
		if ok != served[i] {
			t.Errorf("seed %d %q: served by Lite %v, want %v", i, s, ok, served[i])
		}
	}
	big := "GET /s HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", liteBufSize) + "\r\n\r\n"
	if block, _ := peekHeader(bufio.NewReaderSize(strings.NewReader(big), liteBufSize)); block != nil {
		t.Error("a header block larger than the buffer was taken")
	}
}

// echoHandler answers with what it was asked, in the ways the gateway
// answers: a short body, a long one, a flushed one, no body, an error.
func echoHandler(w http.ResponseWriter, r *http.Request) {
	var body []byte
	if r.URL.Path != "/unread" {
		var err error
		if body, err = io.ReadAll(r.Body); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
	}
	w.Header().Set("X-Method", r.Method)
	w.Header().Set("X-Host", r.Host)
	w.Header().Set("X-Uri", r.RequestURI)
	w.Header().Set("X-Header-A", strings.Join(r.Header["X-A"], ","))
	switch r.URL.Path {
	case "/none":
		w.WriteHeader(http.StatusNoContent)
	case "/long":
		_, _ = w.Write(bytes.Repeat([]byte("0123456789"), 1000))
	case "/flush":
		_, _ = w.Write([]byte("first\n"))
		http.NewResponseController(w).Flush()
		_, _ = w.Write([]byte("second\n"))
	case "/length":
		w.Header().Set("Content-Length", "5")
		_, _ = w.Write([]byte("exact"))
	case "/json":
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"code":"CONFLICT"}`))
	case "/evil":
		w.Header().Set("X-Evil", "a\r\nInjected: yes")
		_, _ = w.Write(body)
	default:
		_, _ = w.Write(body)
	}
}

// startLite serves h through Lite (lite) or net/http alone on loopback.
func startLite(t *testing.T, h http.Handler, lite bool) (addr string, l *Lite) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := Config{}.Server(h, nil)
	done := make(chan error, 1)
	if lite {
		l = NewLite(srv, func(r *http.Request) bool { return r.URL.Path == "/events" || r.URL.Query().Has("live") })
		go func() { done <- l.Serve(ln) }()
	} else {
		go func() { done <- srv.Serve(ln) }()
	}
	t.Cleanup(func() {
		if l != nil {
			_ = l.Close()
		} else {
			_ = srv.Close()
		}
		if err := <-done; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	})
	return ln.Addr().String(), l
}

// exchange sends raw requests on one connection and reads as many
// responses.
func exchangeRaw(t *testing.T, addr string, raw string, n int) []*http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute)) // a bound for a broken server
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var out []*http.Response
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d to %q: %v", len(out), raw, err)
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("response %d body: %v", len(out), err)
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		out = append(out, resp)
	}
	return out
}

// TestLiteAnswersAsNetHTTP: the same requests, kept alive on one
// connection, get the same answers (status, header but Date, framing,
// body) from Lite as from net/http alone.
func TestLiteAnswersAsNetHTTP(t *testing.T) {
	h := http.HandlerFunc(echoHandler)
	liteAddr, _ := startLite(t, h, true)
	plainAddr, _ := startLite(t, h, false)
	requests := []string{
		"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nX-A: 1\r\nx-a: 2\r\n\r\nhello",
		"GET /none HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /long HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /flush HTTP/1.1\r\nHost: x\r\n\r\n",
		"GET /length HTTP/1.1\r\nHost: x\r\n\r\n",
		"PUT /json?x=1 HTTP/1.1\r\nHost: h:1\r\nContent-Length: 2\r\n\r\n{}",
		"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n<a>",
		"POST /evil HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nz",
		"POST /unread HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nabcd",
		// Handed off: the rest of the connection goes to net/http.
		"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
	}
	raw := strings.Join(requests, "")
	got := exchangeRaw(t, liteAddr, raw, len(requests))
	want := exchangeRaw(t, plainAddr, raw, len(requests))
	for i := range requests {
		g, w := got[i], want[i]
		gb, _ := io.ReadAll(g.Body)
		wb, _ := io.ReadAll(w.Body)
		short := func(b []byte) []byte { return b[:min(len(b), 64)] }
		g.Header.Del("Date")
		w.Header.Del("Date")
		if g.StatusCode != w.StatusCode || !bytes.Equal(gb, wb) || !sameHeader(g.Header, w.Header) ||
			!slices.Equal(g.TransferEncoding, w.TransferEncoding) || g.ContentLength != w.ContentLength || g.Close != w.Close {
			t.Errorf("request %d %q:\nLite     %d %v te %v len %d close %v %q\nnet/http %d %v te %v len %d close %v %q", i, requests[i],
				g.StatusCode, g.Header, g.TransferEncoding, g.ContentLength, g.Close, short(gb),
				w.StatusCode, w.Header, w.TransferEncoding, w.ContentLength, w.Close, short(wb))
		}
	}
}

// TestLiteHandsOffLiveReads: a GET the handOff function names (one that
// may stay open) is served by net/http, which ends its context when the
// client goes away.
func TestLiteHandsOffLiveReads(t *testing.T) {
	for _, target := range []string{"/s?live=sse", "/events"} {
		t.Run(target, func(t *testing.T) { testLiteHandsOff(t, target) })
	}
}

func testLiteHandsOff(t *testing.T, target string) {
	var ended atomic.Bool
	started := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("live") == "" && r.URL.Path != "/events" {
			echoHandler(w, r)
			return
		}
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		close(started)
		<-r.Context().Done()
		ended.Store(true)
	})
	addr, _ := startLite(t, h, true)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	// A plain request first, served by Lite, then a live one on the same
	// connection.
	fmt.Fprintf(c, "GET /echo HTTP/1.1\r\nHost: x\r\n\r\nGET %s HTTP/1.1\r\nHost: x\r\n\r\n", target)
	<-started
	_ = c.Close()
	await.True(t, "the live read's context to end when its client left", ended.Load)
}

// TestLiteShutdown: Shutdown closes idle connections, lets a request in
// progress finish, and Serve returns.
func TestLiteShutdown(t *testing.T) {
	release := make(chan struct{})
	inHandler := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(inHandler)
			<-release
		}
		_, _ = w.Write([]byte("ok"))
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := NewLite(Config{}.Server(h, nil), nil)
	served := make(chan error, 1)
	go func() { served <- l.Serve(ln) }()

	idle := exchangeConn(t, ln.Addr().String(), "GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
	fresh, err := net.Dial("tcp", ln.Addr().String()) // never sends a byte
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	busy, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	fmt.Fprint(busy, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
	<-inHandler

	shut := make(chan error, 1)
	go func() { shut <- l.Shutdown(context.Background()) }()
	for _, c := range []net.Conn{idle, fresh} {
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
			t.Fatalf("idle connection after Shutdown: read %d, %v; want it closed", n, err)
		}
	}
	close(release)
	_ = busy.SetReadDeadline(time.Now().Add(time.Minute))
	resp, err := http.ReadResponse(bufio.NewReader(busy), nil)
	if err != nil || resp.StatusCode != http.StatusOK || !resp.Close {
		t.Fatalf("request in progress at Shutdown: %v %v", resp, err)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("Serve: %v", err)
	}
}

// exchangeConn sends one request and reads its response, leaving the
// connection open.
func exchangeConn(t *testing.T, addr, raw string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	fmt.Fprint(c, raw)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	_ = c.SetDeadline(time.Time{})
	return c
}
