package gateway

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/httpserver"
	"github.com/ursula/ursula/tests/await"
)

func TestValidHeaderText(t *testing.T) {
	tests := []struct {
		name string
		v    string
		tab  bool
		ok   bool
	}{
		{"empty", "", false, true},
		{"ascii", "producer-1", false, true},
		{"utf-8", "prodücer-ß-✓", false, true},
		{"256 bytes", strings.Repeat("a", 256), false, true},
		{"257 bytes", strings.Repeat("a", 257), false, false},
		{"invalid utf-8", "a\xff\xfeb", false, false},
		{"truncated rune", "a\xc3", false, false},
		{"overlong", "\xc0\xaf", false, false},
		{"surrogate", "\xed\xa0\x80", false, false},
		{"nul", "a\x00b", false, false},
		{"control", "a\x01b", false, false},
		{"newline", "a\nb", false, false},
		{"del", "a\x7fb", false, false},
		{"c1 control", "a\u0085b", false, false},
		{"tab", "a\tb", false, false},
		{"tab allowed", "text/plain;\tcharset=utf-8", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := validHeaderText(tt.v, tt.tab); got != tt.ok {
				t.Fatalf("validHeaderText(%q, %v) = %v, want %v", tt.v, tt.tab, got, tt.ok)
			}
		})
	}
}

// TestHeaderTextRefused: Producer-Id, Stream-Seq and Content-Type values
// that are not valid UTF-8, hold control characters or pass 256 bytes are
// refused with 400 before the node is called (the node's protobuf strings
// cannot hold invalid UTF-8: that used to be a 500), on every route that
// passes them on.
func TestHeaderTextRefused(t *testing.T) {
	producer := map[string]string{"Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0", "Content-Type": "text/plain"}
	routes := []struct {
		name, method, target, body string
		headers                    []string // the headers the route passes on
	}{
		{"append", "POST", "/v1/stream/s", "x", []string{"Producer-Id", "Stream-Seq", "Content-Type"}},
		{"create", "PUT", "/v1/stream/s", "", []string{"Content-Type"}},
		{"batch", "POST", "/b1/s/append-batch", "\x00\x00\x00\x01x", []string{"Producer-Id", "Stream-Seq", "Content-Type"}},
		{"snapshot", "PUT", "/b1/s/snapshot/0000000000000000_0000000000000000", "x", []string{"Content-Type"}},
		{"commit", "POST", "/b1/s/snapshot/0000000000000000_0000000000000000/commit", `{"parts":[{"part":1,"digest":"x"}]}`, []string{"Content-Type"}},
	}
	bad := map[string]string{
		"invalid utf-8": "a\xff\xfe",
		"control":       "a\x01b",
		"c1 control":    "a\u0085",
		"too long":      strings.Repeat("p", 257),
	}
	for _, rt := range routes {
		for _, name := range rt.headers {
			for what, v := range bad {
				t.Run(rt.name+"/"+name+"/"+what, func(t *testing.T) {
					g := newTestGateway(t, &fakeClient{}, nil) // any call to the node fails the test
					hdr := map[string]string{"Content-Type": "text/plain"}
					if name == "Producer-Id" {
						for k, v := range producer {
							hdr[k] = v
						}
					}
					hdr[name] = v
					rec := do(t, g, rt.method, rt.target, rt.body, hdr)
					if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "INVALID_ARGUMENT") {
						t.Fatalf("%s %s with %s %q: %d %s", rt.method, rt.target, name, v, rec.Code, rec.Body)
					}
				})
			}
		}
	}
	// At the bound, and UTF-8 beyond ASCII, the request reaches the node.
	f := &fakeClient{appendFn: func(in *streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
		if len(in.GetProducer().GetId()) != 256 || in.GetStreamSeq() != "séq-✓" {
			t.Errorf("producer %q seq %q", in.GetProducer().GetId(), in.GetStreamSeq())
		}
		return &streamv1.AppendResponse{NextOffset: "0_1"}, nil
	}}
	g := newTestGateway(t, f, nil)
	rec := do(t, g, "POST", "/v1/stream/s", "x", map[string]string{
		"Content-Type": "text/plain;\tcharset=utf-8", "Producer-Id": strings.Repeat("p", 256), "Producer-Epoch": "0", "Producer-Seq": "0", "Stream-Seq": "séq-✓",
	})
	if rec.Code != http.StatusOK {
		t.Fatalf("valid headers: %d %s", rec.Code, rec.Body)
	}
}

// TestBodyBudget: a request whose body the process's budget cannot hold
// answers 503 OVERLOADED with Retry-After, is counted, and reaches no
// node; a body is charged while the node handles it and released after.
func TestBodyBudget(t *testing.T) {
	budget := httpserver.NewBudget(1 << 20)
	var during int64
	f := &fakeClient{appendFn: func(in *streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
		during = budget.InUse()
		return &streamv1.AppendResponse{NextOffset: "0_1"}, nil
	}}
	g := newTestGateway(t, f, func(c *Config) { c.BodyBudget = budget })
	body := strings.Repeat("x", 100<<10)
	hdr := map[string]string{"Content-Type": "text/plain"}
	if rec := do(t, g, "POST", "/v1/stream/s", body, hdr); rec.Code != http.StatusNoContent {
		t.Fatalf("append: %d %s", rec.Code, rec.Body)
	}
	if during != int64(len(body)) || budget.InUse() != 0 {
		t.Fatalf("budget in use %d during the append, %d after; want %d and 0", during, budget.InUse(), len(body))
	}

	// Another request holds nearly all of it.
	if !budget.TryAcquire(budget.Limit() - 10<<10) {
		t.Fatal("acquire")
	}
	rec := do(t, g, "POST", "/v1/stream/s", body, hdr)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") != "1" || !strings.Contains(rec.Body.String(), "OVERLOADED") {
		t.Fatalf("over budget: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	var m map[string]any
	if err := json.Unmarshal(do(t, g, "GET", "/__ursula/metrics", "", nil).Body.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	if m["inflight_body_refusals"] != float64(1) || m["inflight_body_limit_bytes"] != float64(1<<20) ||
		m["inflight_body_bytes"] != float64(budget.Limit()-10<<10) || m["requests_in_flight"] != float64(1) {
		t.Fatalf("metrics %v", m)
	}
	budget.Release(budget.Limit() - 10<<10)
	if rec := do(t, g, "POST", "/v1/stream/s", body, hdr); rec.Code != http.StatusNoContent {
		t.Fatalf("after release: %d %s", rec.Code, rec.Body)
	}
}

// stalledBody hands out a few bytes and then fails as a body whose
// progress deadline passed.
type stalledBody struct{ sent bool }

func (b *stalledBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		return copy(p, "0123456789"), nil
	}
	return 0, fmt.Errorf("%w: i/o timeout", httpserver.ErrBodyStalled)
}

func (b *stalledBody) Close() error { return nil }

// TestBodyStalled: a body that stops making progress answers 408
// REQUEST_TIMEOUT, having held no more than a first piece of the budget
// for a body announced at 32 MiB.
func TestBodyStalled(t *testing.T) {
	budget := httpserver.NewBudget(0)
	g := newTestGateway(t, &fakeClient{}, func(c *Config) { c.BodyBudget = budget })
	req, _ := http.NewRequest("POST", "http://example.com/v1/stream/s", nil)
	req.Body, req.ContentLength = &stalledBody{}, 32<<20
	req.Header.Set("Content-Type", "text/plain")
	rec := newRecorder()
	g.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusRequestTimeout || !strings.Contains(rec.Body.String(), "REQUEST_TIMEOUT") {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if budget.InUse() != 0 {
		t.Fatalf("budget in use %d", budget.InUse())
	}
}

// frames encodes payloads as an append-batch body.
func frames(payloads ...[]byte) string {
	var b bytes.Buffer
	for _, p := range payloads {
		_ = binary.Write(&b, binary.BigEndian, uint32(len(p)))
		b.Write(p)
	}
	return b.String()
}

// TestUploadLimitsFollowConfig: snapshots, staged parts and append
// batches are bounded by max_body_bytes, not by a constant.
func TestUploadLimitsFollowConfig(t *testing.T) {
	const limit = 1000
	f := &fakeClient{
		putSnapshot: func(*streamv1.PutSnapshotRequest) (*streamv1.PutSnapshotResponse, error) {
			return &streamv1.PutSnapshotResponse{Offset: "0_0", Digest: "d"}, nil
		},
		putPart: func(*streamv1.PutSnapshotPartRequest) (*streamv1.PutSnapshotPartResponse, error) {
			return &streamv1.PutSnapshotPartResponse{Digest: "d"}, nil
		},
		appendFn: func(*streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
			return &streamv1.AppendResponse{NextOffset: "0_1"}, nil
		},
	}
	g := newTestGateway(t, f, func(c *Config) { c.MaxBodyBytes = limit })
	const snap = "/b1/s/snapshot/0000000000000000_0000000000000000"
	hdr := map[string]string{"Content-Type": "application/octet-stream", "Prefer": "return=minimal"}
	tests := []struct {
		name, method, target, body string
		status                     int
	}{
		{"snapshot at the limit", "PUT", snap, strings.Repeat("x", limit), http.StatusNoContent},
		{"snapshot above", "PUT", snap, strings.Repeat("x", limit+1), http.StatusRequestEntityTooLarge},
		{"part at the limit", "PUT", snap + "/parts/1", strings.Repeat("x", limit), http.StatusNoContent},
		{"part above", "PUT", snap + "/parts/1", strings.Repeat("x", limit+1), http.StatusRequestEntityTooLarge},
		{"batch at the limit", "POST", "/b1/s/append-batch", frames(bytes.Repeat([]byte("x"), limit/2), bytes.Repeat([]byte("y"), limit/2)), http.StatusNoContent},
		{"batch above", "POST", "/b1/s/append-batch", frames(bytes.Repeat([]byte("x"), limit/2), bytes.Repeat([]byte("y"), limit/2+1)), http.StatusRequestEntityTooLarge},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := do(t, g, tt.method, tt.target, tt.body, hdr)
			if rec.Code != tt.status {
				t.Fatalf("%d %s, want %d", rec.Code, rec.Body, tt.status)
			}
		})
	}
}

// TestMaxBodyBytesBound: a gateway configured above 32 MiB refuses to
// start.
func TestMaxBodyBytesBound(t *testing.T) {
	if _, err := New(Config{MaxBodyBytes: 32<<20 + 1}, &fakeClient{}, nil); err == nil || !strings.Contains(err.Error(), "33554432") {
		t.Fatalf("New = %v, want a refusal naming 33554432", err)
	}
	if _, err := New(Config{MaxBodyBytes: 32 << 20}, &fakeClient{}, nil); err != nil {
		t.Fatalf("New at 32 MiB: %v", err)
	}
}

// TestLargeJSONReadStreamed: a large JSON read is served exactly as the
// JSON array of its messages, with its exact Content-Length, and the
// handler allocates a small part of it (the body is written in pieces,
// never rendered whole).
func TestLargeJSONReadStreamed(t *testing.T) {
	var stored []byte
	msg := `{"k":"` + strings.Repeat("v", 1000) + `"}` + "\n"
	for len(stored) < 4<<20 {
		stored = append(stored, msg...)
	}
	f := &fakeClient{read: func(context.Context, *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
		return &streamv1.ReadResponse{Data: stored, NextOffset: "0000000000000000_0000000004194304", ContentType: "application/json", UpToDate: true}, nil
	}}
	g := newTestGateway(t, f, nil)
	rec := do(t, g, "GET", "/v1/stream/s?offset=-1", "", nil)
	want := appendJSONArray(nil, stored)
	if rec.Code != 200 || !bytes.Equal(rec.Body.Bytes(), want) || rec.Header().Get("Content-Length") != fmt.Sprint(len(want)) {
		t.Fatalf("%d, %d bytes (Content-Length %s), want %d", rec.Code, rec.Body.Len(), rec.Header().Get("Content-Length"), len(want))
	}
	allocs := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			req, _ := http.NewRequest("GET", "http://example.com/v1/stream/s?offset=-1", nil)
			g.Handler().ServeHTTP(&discardWriter{h: http.Header{}}, req)
		}
	})
	if per := allocs.AllocedBytesPerOp(); per > 256<<10 {
		t.Fatalf("%d bytes allocated to serve a %d-byte JSON read", per, len(want))
	}
}

// TestServeCutsStalledBody: the gateway's server cuts off a body that
// makes no progress (408, connection closed) and gives its budget back.
func TestServeCutsStalledBody(t *testing.T) {
	budget := httpserver.NewBudget(0)
	g := newTestGateway(t, &fakeClient{}, func(c *Config) {
		c.BodyBudget = budget
		c.HTTP.BodyReadTimeout = 200 * time.Millisecond
	})
	addr := serveLoopback(t, g)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/stream/s HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 33554432\r\n\r\n0123456789")
	await.True(t, "the body to be read", func() bool { return budget.InUse() > 0 })
	if n := budget.InUse(); n > 64<<10 {
		t.Fatalf("%d bytes of the budget held for 10 bytes received of 32 MiB announced", n)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Minute)) // a bound for a broken server
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v (got %q)", err, got)
	}
	if !strings.HasPrefix(string(got), "HTTP/1.1 408") || !strings.Contains(string(got), "REQUEST_TIMEOUT") {
		t.Fatalf("answer %q", got)
	}
	await.True(t, "the budget to be released", func() bool { return budget.InUse() == 0 })
}

// TestServeCapsConnections: a connection beyond gateway.max_connections
// is answered 503 OVERLOADED (with Retry-After and the CORS headers a
// browser needs to read it) and closed, is counted, and never reaches the
// handler; once a held connection closes, a new one is served.
func TestServeCapsConnections(t *testing.T) {
	g := newTestGateway(t, &fakeClient{}, func(c *Config) { c.MaxConnections = 2 })
	addr := serveLoopback(t, g)
	base := "http://" + addr
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		held = append(held, c)
	}
	await.True(t, "two connections held", func() bool {
		c := g.metrics.conns.Load()
		return c != nil && c.Active() == 2
	})
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
	resp, err := client.Get(base + "/__ursula/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" ||
		resp.Header.Get("Access-Control-Allow-Origin") != "*" || !strings.Contains(string(body), `"OVERLOADED"`) {
		t.Fatalf("beyond the cap: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	if got := g.metrics.conns.Load().Refused(); got != 1 {
		t.Fatalf("refused %d, want 1", got)
	}

	_ = held[0].Close()
	await.True(t, "the closed connection's slot to be free", func() bool { return g.metrics.conns.Load().Active() < 2 })
	resp, err = client.Get(base + "/__ursula/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	err = json.NewDecoder(resp.Body).Decode(&m)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("within the cap: %d %v", resp.StatusCode, err)
	}
	if m["connections_refused"] != float64(1) || m["max_connections"] != float64(2) || m["connections"] != float64(2) {
		t.Fatalf("metrics: connections %v, max %v, refused %v", m["connections"], m["max_connections"], m["connections_refused"])
	}
}

// serveLoopback serves g on a loopback port until the test ends, and
// returns its address.
func serveLoopback(t *testing.T, g *Gateway) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return ln.Addr().String()
}

// TestMayStayOpen: the requests the gateway keeps on net/http (which
// notices a client that left) are the GETs that may be live reads and its
// own routes; appends and plain reads take the lighter path.
func TestMayStayOpen(t *testing.T) {
	for _, tc := range []struct {
		method, target string
		want           bool
	}{
		{"GET", "/v1/stream/s?offset=-1&live=sse", true},
		{"GET", "/v1/stream/s?LIVE=long-poll&offset=1_2", true},
		{"GET", "/v1/stream/s?offset=-1&%6cive=sse", true},
		{"GET", "/__ursula/ui/events", true},
		{"GET", "/__ursula/metrics", true},
		{"GET", "/v1/stream/s?offset=-1", false},
		{"GET", "/v1/stream/live?offset=-1", false},
		{"POST", "/v1/stream/s?live=sse", false},
		{"PUT", "/v1/stream/s", false},
	} {
		r := httptest.NewRequest(tc.method, tc.target, nil)
		if got := mayStayOpen(r); got != tc.want {
			t.Errorf("%s %s: %v, want %v", tc.method, tc.target, got, tc.want)
		}
	}
}
