package gateway

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/tests/await"
)

// fakeStream is one text stream behind Read and Subscribe, with the node's
// semantics: reads return bytes from an offset up to the tail (bounded),
// a subscription sends the catch-up from its offset and then every append.
type fakeStream struct {
	mu     sync.Mutex
	data   []byte
	closed bool
	subs   []chan *streamv1.ReadResponse

	subscribes atomic.Int32
	reads      atomic.Int32
}

func fakeOffset(pos int) string { return fmt.Sprintf("%016d_%016d", 0, pos) }

func (s *fakeStream) client(t testing.TB) *fakeClient {
	return &fakeClient{t: t, read: s.read, subscribe: s.subscribe}
}

// chunk returns data[from:to] as a response; s.mu is held.
func (s *fakeStream) chunk(from, to int) *streamv1.ReadResponse {
	return &streamv1.ReadResponse{
		Data: append([]byte(nil), s.data[from:to]...), StartOffset: fakeOffset(from), NextOffset: fakeOffset(to),
		UpToDate: to == len(s.data), Closed: to == len(s.data) && s.closed, ContentType: "text/plain", Incarnation: 7,
	}
}

func (s *fakeStream) position(off string) int {
	switch off {
	case "-1":
		return 0
	case "now":
		return len(s.data)
	}
	p, _ := offsetPosition(off)
	return int(p)
}

func (s *fakeStream) read(_ context.Context, in *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
	s.reads.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	from := s.position(in.GetOffset())
	return s.chunk(from, min(len(s.data), from+int(in.GetMaxBytes()))), nil
}

func (s *fakeStream) subscribe(ctx context.Context, in *streamv1.SubscribeRequest) (grpc.ServerStreamingClient[streamv1.SubscribeResponse], error) {
	s.subscribes.Add(1)
	s.mu.Lock()
	defer s.mu.Unlock()
	ch := make(chan *streamv1.ReadResponse, 1<<16)
	ch <- s.chunk(s.position(in.GetOffset()), len(s.data))
	s.subs = append(s.subs, ch)
	return &chanSubscription{ctx: ctx, ch: ch}, nil
}

// append adds p (and closes the stream when closing) and tells the
// subscriptions.
func (s *fakeStream) append(p string, closing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	from := len(s.data)
	s.data = append(s.data, p...)
	s.closed = closing
	c := s.chunk(from, len(s.data))
	for _, ch := range s.subs {
		ch <- c
	}
}

type chanSubscription struct {
	grpc.ClientStream
	ctx context.Context
	ch  chan *streamv1.ReadResponse
}

func (s *chanSubscription) Recv() (*streamv1.SubscribeResponse, error) {
	select {
	case c := <-s.ch:
		return &streamv1.SubscribeResponse{Chunk: c}, nil
	case <-s.ctx.Done():
		return nil, s.ctx.Err()
	}
}

// sseData reads an SSE body and returns the concatenated data of its data
// events (text mode: lines joined by "\n") until the closing control event.
func sseData(t testing.TB, r io.Reader) string {
	t.Helper()
	br := bufio.NewReader(r)
	var out, data strings.Builder
	event := ""
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Errorf("SSE body ended early: %v (data so far %d bytes)", err, out.Len())
			return out.String()
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if event == "data" {
				out.WriteString(data.String())
			}
			if event == "control" && strings.Contains(data.String(), `"streamClosed":true`) {
				return out.String()
			}
			event = ""
			data.Reset()
		case strings.HasPrefix(line, "event: "):
			event = line[len("event: "):]
		case strings.HasPrefix(line, "data:"):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(line[len("data:"):])
		}
	}
}

func (g *Gateway) hubOf(stream string) *hub {
	g.hubs.mu.Lock()
	defer g.hubs.mu.Unlock()
	return g.hubs.m[hubKey{BuiltinBucket, stream}]
}

func (h *hub) clientCount() int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return len(h.clients)
}

// TestSSEFanOutSharesOneSubscription: many clients, one upstream
// subscription; clients that start behind catch up with their own reads
// and then join; everyone gets every byte exactly once.
func TestSSEFanOutSharesOneSubscription(t *testing.T) {
	fs := &fakeStream{}
	fs.append("history-1;", false)
	fs.append("history-2;", false)
	g := newTestGateway(t, fs.client(t), nil)
	srv := httptest.NewServer(g.Handler())
	defer srv.Close()
	defer g.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	const live, behind = 20, 5
	type result struct {
		from string
		got  string
	}
	results := make(chan result, live+behind)
	connect := func(offset string) {
		resp, err := client.Get(srv.URL + "/v1/stream/s?offset=" + offset + "&live=sse")
		if err != nil {
			t.Error(err)
			results <- result{}
			return
		}
		defer resp.Body.Close()
		results <- result{offset, sseData(t, resp.Body)}
	}
	for range live {
		go connect("now")
	}
	await.True(t, "the live clients on the hub", func() bool { h := g.hubOf("s"); return h != nil && h.clientCount() == live })
	var want strings.Builder
	for i := range 30 {
		p := fmt.Sprintf("event-%02d;", i)
		fs.append(p, false)
		want.WriteString(p)
		if i == 10 {
			for range behind {
				go connect("-1")
			}
		}
	}
	await.True(t, "every client on the hub", func() bool { h := g.hubOf("s"); return h != nil && h.clientCount() == live+behind })
	fs.append("last", true)
	want.WriteString("last")
	for range live + behind {
		r := <-results
		exp := want.String()
		if r.from == "-1" {
			exp = "history-1;history-2;" + exp
		}
		if r.got != exp {
			t.Fatalf("client from %s got\n%q\nwant\n%q", r.from, r.got, exp)
		}
	}
	if n := fs.subscribes.Load(); n != 1 {
		t.Fatalf("%d upstream subscriptions, want 1", n)
	}
}

// blockingWriter is a ResponseWriter whose writes wait for release.
type blockingWriter struct {
	h       http.Header
	release chan struct{}
	mu      sync.Mutex
	body    strings.Builder
	writes  atomic.Int32
}

func (w *blockingWriter) Header() http.Header { return w.h }
func (w *blockingWriter) WriteHeader(int)     {}
func (w *blockingWriter) Flush()              {}
func (w *blockingWriter) Write(p []byte) (int, error) {
	if w.writes.Add(1) > 2 { // the first event goes through, then we stall
		<-w.release
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.body.Write(p)
}

// TestSSESlowClientCatchesUp: a client that stalls while the hub moves
// far past what it retains falls back to its own reads and still gets
// every byte once; the fast clients are not held up.
func TestSSESlowClientCatchesUp(t *testing.T) {
	fs := &fakeStream{}
	g := newTestGateway(t, fs.client(t), nil)
	srv := httptest.NewServer(g.Handler())
	defer srv.Close()
	defer g.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	slow := &blockingWriter{h: http.Header{}, release: make(chan struct{})}
	slowDone := make(chan struct{})
	go func() {
		defer close(slowDone)
		req := httptest.NewRequest("GET", "/v1/stream/s?offset=now&live=sse", nil)
		g.Handler().ServeHTTP(slow, req)
	}()
	await.True(t, "the slow client on the hub", func() bool { h := g.hubOf("s"); return h != nil && h.clientCount() == 1 })

	fastDone := make(chan string, 1)
	go func() {
		resp, err := client.Get(srv.URL + "/v1/stream/s?offset=now&live=sse")
		if err != nil {
			t.Error(err)
			fastDone <- ""
			return
		}
		defer resp.Body.Close()
		fastDone <- sseData(t, resp.Body)
	}()
	await.True(t, "the fast client on the hub", func() bool { return g.hubOf("s").clientCount() == 2 })

	var want strings.Builder
	n := hubMaxEvents + 200
	i := 0
	appendEvent := func() {
		p := fmt.Sprintf("e%05d;", i)
		fs.append(p, i == n-1)
		want.WriteString(p)
		i++
	}
	// Stall the slow client before the hub moves on: one event at a time
	// until it is blocked in a write. Otherwise, if its goroutine is late,
	// it first sees the hub already past it, catches up with its own read
	// and has nothing left to read once released.
	for slow.writes.Load() <= 2 {
		before := slow.writes.Load()
		appendEvent()
		await.True(t, "the slow client to write the event", func() bool { return slow.writes.Load() > before })
	}
	for i < n {
		appendEvent()
	}
	// The fast client finishes while the slow one is still stuck.
	select {
	case got := <-fastDone:
		if got != want.String() {
			t.Fatalf("fast client got %d bytes, want %d", len(got), want.Len())
		}
	case <-time.After(await.DefaultTimeout):
		t.Fatal("the fast client was held up by the slow one")
	}
	readsBefore := fs.reads.Load()
	close(slow.release)
	<-slowDone
	if fs.reads.Load() == readsBefore {
		t.Fatal("the slow client did not fall back to its own reads")
	}
	slow.mu.Lock()
	got := sseData(t, strings.NewReader(slow.body.String()))
	slow.mu.Unlock()
	if got != want.String() {
		t.Fatalf("slow client got %d bytes, want %d", len(got), want.Len())
	}
}

// TestHubJoinPositions: a client joins at the event containing its
// position (taking only the part it lacks), after the tail, or not at all
// when its position is older than what the hub retains.
func TestHubJoinPositions(t *testing.T) {
	h := &hub{clients: map[*hubClient]struct{}{}, changed: make(chan struct{}), tail: 10}
	for _, p := range []string{"aaaa", "bbbb", "cccc"} {
		start := h.tail
		next := start + uint64(len(p))
		h.publish(h.encode(&streamv1.ReadResponse{Data: []byte(p), NextOffset: fakeOffset(int(next)), UpToDate: true}, start, next, time.Now()))
	}
	tests := []struct {
		name    string
		pos     uint64
		ok      bool
		wantSeq uint64
	}{
		{"before the window", 9, false, 0},
		{"at the first event", 10, true, 0},
		{"inside the second event", 15, true, 1},
		{"at the third event", 18, true, 2},
		{"at the tail", 22, true, 3},
		{"ahead of the hub", 30, true, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var c hubClient
			if ok := h.join(&c, tt.pos); ok != tt.ok {
				t.Fatalf("join(%d) = %v", tt.pos, ok)
			}
			if tt.ok && c.seq.Load() != tt.wantSeq {
				t.Fatalf("seq = %d, want %d", c.seq.Load(), tt.wantSeq)
			}
			h.leave(&c)
		})
	}
}

// TestHubTrim: consumed events are dropped beyond the recent few; a
// client whose next event was dropped is told it lags.
func TestHubTrim(t *testing.T) {
	h := &hub{clients: map[*hubClient]struct{}{}, changed: make(chan struct{})}
	var idle, busy hubClient
	h.join(&idle, 0)
	h.join(&busy, 0)
	pub := func(n int) {
		for range n {
			start := h.tail
			h.publish(h.encode(&streamv1.ReadResponse{Data: []byte("x"), NextOffset: fakeOffset(int(start + 1)), UpToDate: true}, start, start+1, time.Now()))
		}
	}
	pub(100)
	if len(h.events) != 100 {
		t.Fatalf("retained %d events while a client needs all of them", len(h.events))
	}
	for {
		b, _, lagging, _ := h.take(&busy, nil)
		if lagging || len(b) == 0 {
			break
		}
	}
	h.leave(&idle)
	pub(1)
	if len(h.events) != hubKeepRecent {
		t.Fatalf("retained %d events after all were taken, want %d", len(h.events), hubKeepRecent)
	}
	pub(1)
	if _, _, lagging, _ := h.take(&idle, nil); !lagging {
		t.Fatal("a client whose events were dropped is not lagging")
	}
	if len(h.events) != hubKeepRecent {
		t.Fatalf("retained %d events, want %d", len(h.events), hubKeepRecent)
	}
}

// directClients counts the clients hub writers write to.
func directClients(h *hub) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, w := range h.writers {
		n += len(w.clients)
	}
	return n
}

// TestSSEDirectWritesAndBackedUpClient serves over a real listener, where
// hub writers write to caught-up clients directly. A client that stops
// reading (a tiny receive buffer, so its connection backs up at once) is
// handed back to its own goroutine; the others finish without waiting for
// it, and it still gets every byte once when it reads again.
func TestSSEDirectWritesAndBackedUpClient(t *testing.T) {
	fs := &fakeStream{}
	g := newTestGateway(t, fs.client(t), nil)
	addr := serveLoopback(t, g)
	url := "http://" + addr + "/v1/stream/s?offset=now&live=sse"

	const fast = 5
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	fastDone := make(chan string, fast)
	for range fast {
		go func() {
			resp, err := client.Get(url)
			if err != nil {
				t.Error(err)
				fastDone <- ""
				return
			}
			defer resp.Body.Close()
			fastDone <- sseData(t, resp.Body)
		}()
	}
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	slow, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	req, _ := http.NewRequest("GET", url, nil)
	if err := req.Write(slow); err != nil {
		t.Fatal(err)
	}
	await.True(t, "every client on the hub", func() bool { h := g.hubOf("s"); return h != nil && h.clientCount() == fast+1 })
	// Caught-up clients are handed to hub writers once they find nothing
	// to take; wait for that (at least the fast ones, whatever the backed-up
	// one does), or the appends below may all be taken by the clients'
	// own goroutines before any goes direct.
	await.True(t, "the fast clients handed to hub writers", func() bool { return directClients(g.hubOf("s")) >= fast })

	var want strings.Builder
	chunk := strings.Repeat("x", 4000)
	n := 300
	for i := range n {
		p := fmt.Sprintf("%05d%s;", i, chunk)
		fs.append(p, i == n-1)
		want.WriteString(p)
	}
	for range fast {
		select {
		case got := <-fastDone:
			if got != want.String() {
				t.Fatalf("fast client got %d bytes, want %d", len(got), want.Len())
			}
		case <-time.After(await.DefaultTimeout):
			t.Fatal("the fast clients were held up by the backed-up one")
		}
	}
	if g.metrics.sseDirect.Load() == 0 {
		t.Fatal("no event was written directly by a hub writer")
	}
	resp, err := http.ReadResponse(bufio.NewReader(slow), req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if got := sseData(t, resp.Body); got != want.String() {
		t.Fatalf("backed-up client got %d bytes, want %d", len(got), want.Len())
	}
}
