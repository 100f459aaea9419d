package gateway

import (
	"bufio"
	"context"
	"flag"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/tests/await"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestServeSSEAndShutdown serves over a real listener: SSE headers arrive
// before any event, events are flushed as they come, and ending the Run
// context ends the live response and returns promptly.
func TestServeSSEAndShutdown(t *testing.T) {
	f := &fakeClient{
		subscribe: func(ctx context.Context, in *streamv1.SubscribeRequest) (grpc.ServerStreamingClient[streamv1.SubscribeResponse], error) {
			return &fakeSubscription{ctx: ctx, chunks: []*streamv1.ReadResponse{
				{NextOffset: "0_0", UpToDate: true, ContentType: "text/plain"},
			}}, nil
		},
		read: func(ctx context.Context, in *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
			if in.GetWaitMs() == 0 { // the SSE connection's first read
				return &streamv1.ReadResponse{NextOffset: "0_0", UpToDate: true, ContentType: "text/plain"}, nil
			}
			<-ctx.Done() // a long-poll that never gets data
			return nil, ctx.Err()
		},
	}
	g := newTestGateway(t, f, func(c *Config) { c.LongPollTimeout = time.Hour })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- g.Serve(ctx, ln) }()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	base := "http://" + ln.Addr().String()

	resp, err := client.Get(base + "/v1/stream/s?offset=-1&live=sse")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" || resp.ContentLength != -1 {
		t.Fatalf("SSE response: %d %v len=%d", resp.StatusCode, resp.Header, resp.ContentLength)
	}
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "event: control\n" {
		t.Fatalf("first line %q, %v", line, err)
	}

	lpDone := make(chan *http.Response, 1)
	go func() {
		r, err := client.Get(base + "/v1/stream/s?offset=0_0&live=long-poll")
		if err != nil {
			lpDone <- nil
			return
		}
		r.Body.Close()
		lpDone <- r
	}()
	await.True(t, "the long-poll to be waiting", func() bool { return g.metrics.longPolls.Load() == 1 })

	start := time.Now()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(await.DefaultTimeout):
		t.Fatal("Serve did not return after cancel")
	}
	// Promptly means the live reads were ended before the HTTP server's
	// Shutdown, which otherwise waits for them until shutdownTimeout.
	if d := time.Since(start); d >= shutdownTimeout {
		t.Fatalf("shutdown took %v: Serve waited out its shutdown timeout instead of ending the live reads", d)
	}
	rest, _ := readAll(br)
	if !strings.Contains(rest, "upToDate") {
		t.Fatalf("rest of SSE body %q", rest)
	}
	if r := <-lpDone; r == nil || r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Fatalf("long-poll during shutdown: %+v", r)
	}
}

func TestRunListenError(t *testing.T) {
	g := newTestGateway(t, &fakeClient{}, func(c *Config) { c.Listen = "256.0.0.1:bad" })
	if err := g.Run(t.Context()); err == nil {
		t.Fatal("Run with a bad address succeeded")
	}
}

func TestConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"zero", Config{}, true},
		{"root", Config{StreamRoot: "/streams/"}, true},
		{"root without slash", Config{StreamRoot: "/streams"}, false},
		{"root slash", Config{StreamRoot: "/"}, false},
		{"reserved root", Config{StreamRoot: "/__ursula/x/"}, false},
		{"negative timeout", Config{LongPollTimeout: -1}, false},
		{"negative body", Config{MaxBodyBytes: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); (err == nil) != tt.ok {
				t.Fatalf("Validate = %v", err)
			}
		})
	}
	g, err := New(Config{}, &fakeClient{t: t}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	c := g.Config()
	if c.Listen != DefaultListen || c.StreamRoot != DefaultStreamRoot || c.LongPollTimeout != DefaultLongPollTimeout ||
		c.SSEReconnectInterval != DefaultSSEReconnectInterval || c.MaxBodyBytes != DefaultMaxBodyBytes || c.ReadChunkBytes != DefaultReadChunkBytes {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if _, err := New(Config{}, nil, nil); err == nil {
		t.Fatal("New with a nil client succeeded")
	}
}

func readAll(br *bufio.Reader) (string, error) {
	var b strings.Builder
	_, err := br.WriteTo(&b)
	return b.String(), err
}

func TestRegisterFlags(t *testing.T) {
	var c Config
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"-gateway.listen=:9999", "-gateway.long_poll_timeout=500ms", "-gateway.max_body_bytes=10",
		"-gateway.stream_root=/s/", "-gateway.sse_reconnect_interval=5s", "-gateway.read_chunk_bytes=4096"}); err != nil {
		t.Fatal(err)
	}
	want := Config{Listen: ":9999", StreamRoot: "/s/", LongPollTimeout: 500 * time.Millisecond, SSEReconnectInterval: 5 * time.Second,
		MaxBodyBytes: 10, ReadChunkBytes: 4096}
	if c.Listen != want.Listen || c.StreamRoot != want.StreamRoot || c.LongPollTimeout != want.LongPollTimeout ||
		c.SSEReconnectInterval != want.SSEReconnectInterval || c.MaxBodyBytes != want.MaxBodyBytes || c.ReadChunkBytes != want.ReadChunkBytes {
		t.Fatalf("flags gave %+v", c)
	}
}

func TestListening(t *testing.T) {
	g, err := New(Config{Listen: "127.0.0.1:0"}, &fakeClient{t: t}, nil)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.Listening():
		t.Fatal("Listening closed before Run")
	default:
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	<-g.Listening() // the test's deadline bounds it
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run = %v", err)
	}
}
