package gateway

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// checkSecurityHeaders asserts the headers every response carries.
func checkSecurityHeaders(t testing.TB, h http.Header) {
	t.Helper()
	if got := h.Get("X-Content-Type-Options"); got != "nosniff" {
		t.Errorf("X-Content-Type-Options = %q", got)
	}
	if got := h.Get("Cross-Origin-Resource-Policy"); got != "cross-origin" {
		t.Errorf("Cross-Origin-Resource-Policy = %q", got)
	}
	if got := h.Get("Access-Control-Allow-Origin"); got != "*" {
		t.Errorf("Access-Control-Allow-Origin = %q", got)
	}
}

func TestCreateStream(t *testing.T) {
	var got *streamv1.CreateStreamRequest
	f := &fakeClient{createStream: func(in *streamv1.CreateStreamRequest) (*streamv1.CreateStreamResponse, error) {
		got = in
		return &streamv1.CreateStreamResponse{Created: true, Info: &streamv1.StreamInfo{ContentType: "text/plain", NextOffset: "0_4"}}, nil
	}}
	obs := &recordingObserver{}
	g := newTestGateway(t, f, func(c *Config) { c.Observer = obs })
	rec := do(t, g, "PUT", "http://example.com/v1/stream/a/b", "data", map[string]string{
		"Content-Type": "text/plain", "Stream-TTL": "60", "Stream-Forked-From": "/v1/stream/src/x",
		"Stream-Fork-Offset": "0_2", "Stream-Fork-Sub-Offset": "1",
	})
	if rec.Code != 201 {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	checkSecurityHeaders(t, rec.Header())
	if loc := rec.Header().Get("Location"); loc != "http://example.com/v1/stream/a/b" {
		t.Fatalf("Location = %q", loc)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "text/plain" {
		t.Fatalf("Content-Type = %q", ct)
	}
	if off := rec.Header().Get("Stream-Next-Offset"); off != "0_4" {
		t.Fatalf("Stream-Next-Offset = %q", off)
	}
	for _, h := range []string{"Stream-Forked-From", "Stream-Fork-Offset", "Stream-Fork-Sub-Offset", "Stream-Closed"} {
		if rec.Header().Get(h) != "" {
			t.Fatalf("%s must not be echoed", h)
		}
	}
	if got.GetRef().GetBucket() != BuiltinBucket || got.GetRef().GetStream() != "a/b" {
		t.Fatalf("ref = %v", got.GetRef())
	}
	if got.GetTtlSeconds() != 60 || got.TtlSeconds == nil || string(got.GetBody()) != "data" || !got.GetHasBody() {
		t.Fatalf("request = %v", got)
	}
	fork := got.GetFork()
	if fork.GetSource().GetBucket() != BuiltinBucket || fork.GetSource().GetStream() != "src/x" || fork.GetOffset() != "0_2" || fork.GetSubOffset() != 1 {
		t.Fatalf("fork = %v", fork)
	}
	if obs.events() != "created:a/b" {
		t.Fatalf("observer saw %q", obs.events())
	}
}

func TestCreateStreamVariants(t *testing.T) {
	tests := []struct {
		name    string
		target  string
		hdr     map[string]string
		created bool
		closed  bool
		status  int
		wantLoc string
	}{
		{"exists", "/v1/stream/x", nil, false, false, 200, ""},
		{"closed", "/v1/stream/x", map[string]string{"Stream-Closed": "true"}, true, true, 201, "http://example.com/v1/stream/x"},
		{"forwarded", "/v1/stream/x", map[string]string{"X-Forwarded-Proto": "https", "X-Forwarded-Host": "streams.example.org"}, true, false, 201, "https://streams.example.org/v1/stream/x"},
		{"bad ttl", "/v1/stream/x", map[string]string{"Stream-TTL": "1e3"}, false, false, 400, ""},
		{"ttl and expires", "/v1/stream/x", map[string]string{"Stream-TTL": "1", "Stream-Expires-At": "2030-01-01T00:00:00Z"}, false, false, 400, ""},
		{"sub offset alone", "/v1/stream/x", map[string]string{"Stream-Fork-Sub-Offset": "0"}, false, false, 400, ""},
		{"bad fork source", "/v1/stream/x", map[string]string{"Stream-Forked-From": "/nope"}, false, false, 400, ""},
		{"reserved fork source", "/v1/stream/x", map[string]string{"Stream-Forked-From": "/v1/stream/__ds/x"}, false, false, 400, ""},
		{"bucket family", "/orders/o1", nil, true, false, 201, "http://example.com/orders/o1"},
		{"reserved bucket", "/__ds/o1", nil, false, false, 400, ""},
		{"bad bucket", "/Orders/o1", nil, false, false, 400, ""},
		{"dot segment", "/v1/stream/a/../b", nil, false, false, 400, ""},
		{"no stream", "/v1/stream/", nil, false, false, 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeClient{createStream: func(in *streamv1.CreateStreamRequest) (*streamv1.CreateStreamResponse, error) {
				if in.GetClosed() != tt.closed {
					t.Errorf("closed = %v", in.GetClosed())
				}
				return &streamv1.CreateStreamResponse{Created: tt.created, Info: &streamv1.StreamInfo{NextOffset: "0_0", Closed: tt.closed}}, nil
			}}
			g := newTestGateway(t, f, nil)
			rec := do(t, g, "PUT", "http://example.com"+tt.target, "", tt.hdr)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			checkSecurityHeaders(t, rec.Header())
			if got := rec.Header().Get("Location"); got != tt.wantLoc {
				t.Fatalf("Location = %q, want %q", got, tt.wantLoc)
			}
			if tt.status < 300 {
				if ct := rec.Header().Get("Content-Type"); ct != "application/octet-stream" {
					t.Fatalf("Content-Type = %q", ct)
				}
				if got := rec.Header().Get("Stream-Closed"); (got == "true") != tt.closed {
					t.Fatalf("Stream-Closed = %q", got)
				}
			} else if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Fatalf("error Content-Type = %q", ct)
			}
		})
	}
}

func TestAppend(t *testing.T) {
	tests := []struct {
		name      string
		body      string
		hdr       map[string]string
		resp      *streamv1.AppendResponse
		respErr   error
		status    int
		headers   map[string]string
		noCall    bool
		wantClose bool
	}{
		{"plain", "x", map[string]string{"Content-Type": "text/plain"}, &streamv1.AppendResponse{NextOffset: "0_1"}, nil, 204,
			map[string]string{"Stream-Next-Offset": "0_1"}, false, false},
		{"producer new", "x", map[string]string{"Content-Type": "text/plain", "Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"},
			&streamv1.AppendResponse{NextOffset: "0_1"}, nil, 200,
			map[string]string{"Producer-Epoch": "0", "Producer-Seq": "0"}, false, false},
		{"producer duplicate", "x", map[string]string{"Content-Type": "text/plain", "Producer-Id": "p", "Producer-Epoch": "1", "Producer-Seq": "3"},
			&streamv1.AppendResponse{NextOffset: "0_1", Duplicate: true, ProducerEpoch: 1, ProducerSeq: 5}, nil, 204,
			map[string]string{"Producer-Epoch": "1", "Producer-Seq": "5"}, false, false},
		{"close only", "", map[string]string{"Stream-Closed": "true"}, &streamv1.AppendResponse{NextOffset: "0_1", Closed: true}, nil, 204,
			map[string]string{"Stream-Closed": "true", "Stream-Next-Offset": "0_1"}, false, true},
		{"close only producer", "", map[string]string{"Stream-Closed": "true", "Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "1"},
			&streamv1.AppendResponse{NextOffset: "0_1", Closed: true, ProducerSeq: 1}, nil, 204,
			map[string]string{"Stream-Closed": "true", "Producer-Seq": "1"}, false, true},
		{"append and close producer", "x", map[string]string{"Content-Type": "text/plain", "Stream-Closed": "true", "Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"},
			&streamv1.AppendResponse{NextOffset: "0_1", Closed: true}, nil, 200,
			map[string]string{"Stream-Closed": "true"}, false, true},
		{"empty body", "", map[string]string{"Content-Type": "text/plain"}, nil, nil, 400, nil, true, false},
		{"closed false is absent", "", map[string]string{"Stream-Closed": "false"}, nil, nil, 400, nil, true, false},
		{"no content type", "x", nil, nil, nil, 400, nil, true, false},
		{"partial producer", "x", map[string]string{"Content-Type": "text/plain", "Producer-Id": "p"}, nil, nil, 400, nil, true, false},
		{"stream closed", "x", map[string]string{"Content-Type": "text/plain"}, nil,
			grpcerr.ToStatus(errcode.New(errcode.StreamClosed, "closed").With(errcode.KeyNextOffset, "0_9")), 409,
			map[string]string{"Stream-Closed": "true", "Stream-Next-Offset": "0_9"}, false, false},
		{"stale epoch", "x", map[string]string{"Content-Type": "text/plain", "Producer-Id": "p", "Producer-Epoch": "0", "Producer-Seq": "0"}, nil,
			grpcerr.ToStatus(errcode.New(errcode.ProducerStaleEpoch, "stale").With(errcode.KeyProducerEpoch, "2")), 403,
			map[string]string{"Producer-Epoch": "2"}, false, false},
		{"epoch closed by a new history", "x", map[string]string{"Content-Type": "text/plain", "Producer-Id": "p", "Producer-Epoch": "2", "Producer-Seq": "6"}, nil,
			grpcerr.ToStatus(errcode.New(errcode.ProducerStaleEpoch, "closed").With(errcode.KeyProducerEpoch, "2").
				With(errcode.KeyProducerSeq, "4").With(errcode.KeyProducerOutcome, "epoch-closed;by=history")), 403,
			map[string]string{"Producer-Epoch": "2", "Producer-Seq": "4", "Producer-Outcome": "epoch-closed;by=history"}, false, false},
		{"not found", "x", map[string]string{"Content-Type": "text/plain"}, nil,
			grpcerr.ToStatus(errcode.New(errcode.StreamNotFound, "nope")), 404, nil, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called := false
			f := &fakeClient{appendFn: func(in *streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
				called = true
				if in.GetClose() != tt.wantClose && tt.respErr == nil {
					t.Errorf("close = %v", in.GetClose())
				}
				if string(in.GetBody()) != tt.body {
					t.Errorf("body = %q", in.GetBody())
				}
				return tt.resp, tt.respErr
			}}
			g := newTestGateway(t, f, nil)
			rec := do(t, g, "POST", "/v1/stream/s", tt.body, tt.hdr)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			if called == tt.noCall {
				t.Fatalf("node called = %v", called)
			}
			checkSecurityHeaders(t, rec.Header())
			for k, v := range tt.headers {
				if got := rec.Header().Get(k); got != v {
					t.Fatalf("%s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestBodyLimit(t *testing.T) {
	f := &fakeClient{appendFn: func(in *streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
		return &streamv1.AppendResponse{NextOffset: "0_1"}, nil
	}}
	g := newTestGateway(t, f, func(c *Config) { c.MaxBodyBytes = 8 })
	tests := []struct {
		name    string
		body    string
		chunked bool
		status  int
	}{
		{"fits", "12345678", false, 204},
		{"content length too big", "123456789", false, 413},
		{"chunked fits", "12345678", true, 204},
		{"chunked too big", "123456789", true, 413},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest("POST", "http://example.com/v1/stream/s", strings.NewReader(tt.body))
			req.Header.Set("Content-Type", "text/plain")
			if tt.chunked {
				req.ContentLength = -1
				req.Body = io.NopCloser(strings.NewReader(tt.body))
			}
			rec := newRecorder()
			g.Handler().ServeHTTP(rec, req)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			checkSecurityHeaders(t, rec.Header())
		})
	}
}

func TestCatchUpRead(t *testing.T) {
	tests := []struct {
		name    string
		query   string
		hdr     map[string]string
		resp    *streamv1.ReadResponse
		status  int
		body    string
		headers map[string]string
		absent  []string
	}{
		{"text", "", nil, &streamv1.ReadResponse{Data: []byte("hello"), StartOffset: "0_0", NextOffset: "0_5", UpToDate: true, ContentType: "text/plain", Incarnation: 1},
			200, "hello", map[string]string{"Content-Type": "text/plain", "Stream-Next-Offset": "0_5", "Stream-Up-To-Date": "true",
				"ETag": `"1:0_0:0_5"`, "Cache-Control": "public, max-age=60, stale-while-revalidate=300"}, []string{"Stream-Closed"}},
		{"json", "offset=0_0", nil, &streamv1.ReadResponse{Data: []byte("{\"a\":1}\n[2]\n"), NextOffset: "0_2", ContentType: "application/json"},
			200, `[{"a":1},[2]]`, map[string]string{"Content-Type": "application/json"}, []string{"Stream-Up-To-Date"}},
		{"json empty now", "offset=now", nil, &streamv1.ReadResponse{NextOffset: "0_2", UpToDate: true, ContentType: "application/json; charset=utf-8"},
			200, `[]`, map[string]string{"Cache-Control": "no-store", "Content-Type": "application/json; charset=utf-8"}, nil},
		{"closed at tail", "offset=0_5", nil, &streamv1.ReadResponse{StartOffset: "0_5", NextOffset: "0_5", UpToDate: true, Closed: true, ContentType: "text/plain"},
			200, "", map[string]string{"Stream-Closed": "true", "ETag": `"0:0_5:0_5:c"`}, nil},
		{"not modified", "", map[string]string{"If-None-Match": `"1:0_0:0_5"`}, &streamv1.ReadResponse{Data: []byte("hello"), StartOffset: "0_0", NextOffset: "0_5", Incarnation: 1, ContentType: "text/plain"},
			304, "", map[string]string{"ETag": `"1:0_0:0_5"`}, nil},
		{"etag mismatch", "", map[string]string{"If-None-Match": `"wrong"`}, &streamv1.ReadResponse{Data: []byte("hello"), StartOffset: "0_0", NextOffset: "0_5", Incarnation: 1, ContentType: "text/plain"},
			200, "hello", nil, nil},
		{"empty offset", "offset=", nil, nil, 400, "", nil, nil},
		{"repeated offset", "offset=0_0&offset=0_1", nil, nil, 400, "", nil, nil},
		{"bad offset", "offset=0%2C1", nil, nil, 400, "", nil, nil},
		{"live needs offset", "live=sse", nil, nil, 400, "", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeClient{read: func(_ context.Context, in *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
				if in.GetWaitMs() != 0 {
					t.Errorf("catch-up read waits %d ms", in.GetWaitMs())
				}
				if in.GetMaxBytes() != DefaultReadChunkBytes {
					t.Errorf("max_bytes = %d", in.GetMaxBytes())
				}
				return tt.resp, nil
			}}
			g := newTestGateway(t, f, nil)
			target := "/v1/stream/s"
			if tt.query != "" {
				target += "?" + tt.query
			}
			rec := do(t, g, "GET", target, "", tt.hdr)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			checkSecurityHeaders(t, rec.Header())
			if tt.status == 200 && rec.Body.String() != tt.body {
				t.Fatalf("body = %q, want %q", rec.Body, tt.body)
			}
			for k, v := range tt.headers {
				if got := rec.Header().Get(k); got != v {
					t.Fatalf("%s = %q, want %q", k, got, v)
				}
			}
			for _, k := range tt.absent {
				if got := rec.Header().Get(k); got != "" {
					t.Fatalf("%s = %q, want absent", k, got)
				}
			}
		})
	}
}

func TestLongPoll(t *testing.T) {
	tests := []struct {
		name    string
		resp    *streamv1.ReadResponse
		status  int
		headers map[string]string
		absent  []string
	}{
		{"timeout", &streamv1.ReadResponse{NextOffset: "0_5", UpToDate: true, TimedOut: true}, 204,
			map[string]string{"Stream-Next-Offset": "0_5", "Stream-Up-To-Date": "true", "Cache-Control": "no-store"}, []string{"Stream-Closed"}},
		{"closed", &streamv1.ReadResponse{NextOffset: "0_5", UpToDate: true, Closed: true}, 204,
			map[string]string{"Stream-Closed": "true", "Stream-Up-To-Date": "true"}, []string{"Stream-Cursor"}},
		{"data", &streamv1.ReadResponse{Data: []byte("new"), NextOffset: "0_8", UpToDate: true, ContentType: "text/plain"}, 200,
			map[string]string{"Stream-Next-Offset": "0_8", "Stream-Up-To-Date": "true"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeClient{read: func(_ context.Context, in *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
				if in.GetWaitMs() != 1500 {
					t.Errorf("wait_ms = %d", in.GetWaitMs())
				}
				return tt.resp, nil
			}}
			g := newTestGateway(t, f, func(c *Config) { c.LongPollTimeout = 1500 * time.Millisecond })
			rec := do(t, g, "GET", "/v1/stream/s?offset=0_5&live=long-poll&cursor=1", "", nil)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			checkSecurityHeaders(t, rec.Header())
			for k, v := range tt.headers {
				if got := rec.Header().Get(k); got != v {
					t.Fatalf("%s = %q, want %q", k, got, v)
				}
			}
			for _, k := range tt.absent {
				if got := rec.Header().Get(k); got != "" {
					t.Fatalf("%s = %q, want absent", k, got)
				}
			}
			if !tt.resp.GetClosed() && !isDigits(rec.Header().Get("Stream-Cursor")) {
				t.Fatalf("Stream-Cursor = %q", rec.Header().Get("Stream-Cursor"))
			}
		})
	}
}

func TestSSEHandler(t *testing.T) {
	tests := []struct {
		name     string
		ct       string
		read     *streamv1.ReadResponse   // the connection's own first read
		chunks   []*streamv1.ReadResponse // then the hub's subscription
		encoding string
		want     string
	}{
		{"text closed", "text/plain",
			&streamv1.ReadResponse{Data: []byte("a\nb"), StartOffset: "0_0", NextOffset: "0_3", UpToDate: true, ContentType: "text/plain"},
			[]*streamv1.ReadResponse{
				{NextOffset: "0_3", UpToDate: true, ContentType: "text/plain"},
				{NextOffset: "0_3", UpToDate: true, Closed: true, ContentType: "text/plain"},
			}, "", "event: data\ndata:a\ndata:b\n\nevent: control\ndata:{\"streamNextOffset\":\"0_3\",\"streamCursor\":\"C\",\"upToDate\":true}\n\n" +
				"event: control\ndata:{\"streamNextOffset\":\"0_3\",\"upToDate\":true,\"streamClosed\":true}\n\n"},
		{"binary", "application/octet-stream",
			&streamv1.ReadResponse{Data: []byte("Hello"), NextOffset: "0_5", UpToDate: true, Closed: true, ContentType: "application/octet-stream"},
			nil, "base64", "event: data\ndata:SGVsbG8=\n\nevent: control\ndata:{\"streamNextOffset\":\"0_5\",\"upToDate\":true,\"streamClosed\":true}\n\n"},
		{"json live", "application/json",
			&streamv1.ReadResponse{NextOffset: "0_0", UpToDate: true, ContentType: "application/json", RecordFirst: 4, RecordNext: 4},
			[]*streamv1.ReadResponse{
				{NextOffset: "0_0", UpToDate: true, ContentType: "application/json", RecordFirst: 4, RecordNext: 4},
				{Data: []byte("{\"a\":1}\n2\n"), StartOffset: "0_0", NextOffset: "0_10", UpToDate: true, ContentType: "application/json", RecordFirst: 4, RecordNext: 6},
				{StartOffset: "0_10", NextOffset: "0_10", UpToDate: true, Closed: true, ContentType: "application/json", RecordFirst: 6, RecordNext: 6},
			}, "", "event: control\ndata:{\"streamNextOffset\":\"0_0\",\"streamFirstRecord\":4,\"streamNextRecord\":4,\"streamCursor\":\"C\",\"upToDate\":true}\n\n" +
				"event: data\ndata:[{\"a\":1},2]\n\nevent: control\ndata:{\"streamNextOffset\":\"0_10\",\"streamFirstRecord\":4,\"streamNextRecord\":6,\"streamCursor\":\"C\",\"upToDate\":true}\n\n" +
				"event: control\ndata:{\"streamNextOffset\":\"0_10\",\"streamFirstRecord\":6,\"streamNextRecord\":6,\"upToDate\":true,\"streamClosed\":true}\n\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeClient{
				read: func(ctx context.Context, in *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
					if in.GetOffset() != "-1" {
						t.Errorf("read offset = %q", in.GetOffset())
					}
					return tt.read, nil
				},
				subscribe: func(ctx context.Context, in *streamv1.SubscribeRequest) (grpc.ServerStreamingClient[streamv1.SubscribeResponse], error) {
					if in.GetOffset() != tt.read.GetNextOffset() {
						t.Errorf("subscribe offset = %q, want %q", in.GetOffset(), tt.read.GetNextOffset())
					}
					return &fakeSubscription{ctx: ctx, chunks: tt.chunks}, nil
				},
			}
			g := newTestGateway(t, f, nil)
			rec := do(t, g, "GET", "/v1/stream/s?offset=-1&live=sse", "", nil)
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			checkSecurityHeaders(t, rec.Header())
			h := rec.Header()
			if h.Get("Content-Type") != "text/event-stream" || h.Get("Cache-Control") != "no-cache" || h.Get("Content-Length") != "" {
				t.Fatalf("headers = %v", h)
			}
			if got := h.Get("Stream-SSE-Data-Encoding"); got != tt.encoding {
				t.Fatalf("Stream-SSE-Data-Encoding = %q", got)
			}
			got := cursorPattern.ReplaceAllString(rec.Body.String(), `"streamCursor":"C"`)
			if got != tt.want {
				t.Fatalf("body =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

// TestSSERecordStart: an SSE read takes the record parameters of plain
// reads for its first read, then goes on by offset; its control events
// carry the record range.
func TestSSERecordStart(t *testing.T) {
	tests := []struct {
		name, query string
		check       func(*streamv1.ReadRequest) bool
	}{
		{"record", "record=7", func(in *streamv1.ReadRequest) bool { return in.Record != nil && in.GetRecord() == 7 }},
		{"record now", "record=now", func(in *streamv1.ReadRequest) bool { return in.GetRecordNow() }},
		{"tail records", "tail_records=2", func(in *streamv1.ReadRequest) bool { return in.GetTailRecords() == 2 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &fakeClient{
				read: func(ctx context.Context, in *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
					if !tt.check(in) {
						t.Errorf("first read %v", in)
					}
					return &streamv1.ReadResponse{Data: []byte("1\n2\n"), StartOffset: "0_20", NextOffset: "0_24", UpToDate: true, Closed: true,
						ContentType: "application/json", RecordFirst: 7, RecordNext: 9}, nil
				},
			}
			g := newTestGateway(t, f, nil)
			rec := do(t, g, "GET", "/bk/s?live=sse&"+tt.query, "", nil)
			if rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			want := "event: data\ndata:[1,2]\n\nevent: control\ndata:{\"streamNextOffset\":\"0_24\",\"streamFirstRecord\":7,\"streamNextRecord\":9,\"upToDate\":true,\"streamClosed\":true}\n\n"
			if got := rec.Body.String(); got != want {
				t.Fatalf("body =\n%q\nwant\n%q", got, want)
			}
		})
	}
}

func TestSSEErrorBeforeStart(t *testing.T) {
	f := &fakeClient{read: func(ctx context.Context, in *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
		return nil, grpcerr.ToStatus(errcode.New(errcode.StreamNotFound, "nope"))
	}}
	g := newTestGateway(t, f, nil)
	rec := do(t, g, "GET", "/v1/stream/s?offset=now&live=sse", "", nil)
	if rec.Code != 404 || rec.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	checkSecurityHeaders(t, rec.Header())
}

func TestHeadAndDelete(t *testing.T) {
	ttl := uint64(3600)
	f := &fakeClient{
		head: func(in *streamv1.HeadRequest) (*streamv1.HeadResponse, error) {
			switch in.GetRef().GetStream() {
			case "closed":
				return &streamv1.HeadResponse{Info: &streamv1.StreamInfo{ContentType: "text/plain", NextOffset: "0_1", Closed: true, ExpiresAt: "2030-01-01T00:00:00Z"}}, nil
			case "rewritten":
				return &streamv1.HeadResponse{Info: &streamv1.StreamInfo{ContentType: "text/plain", NextOffset: "0000000000000000_0000000000000012",
					Incarnation: 40, PreviousIncarnation: 7, InheritedOffset: "0000000000000000_0000000000000009"}}, nil
			}
			return &streamv1.HeadResponse{Info: &streamv1.StreamInfo{ContentType: "text/plain", NextOffset: "0_1", TtlSeconds: &ttl}}, nil
		},
		deleteStream: func(in *streamv1.DeleteStreamRequest) (*streamv1.DeleteStreamResponse, error) {
			return &streamv1.DeleteStreamResponse{}, nil
		},
	}
	obs := &recordingObserver{}
	g := newTestGateway(t, f, func(c *Config) { c.Observer = obs })

	rec := do(t, g, "HEAD", "/v1/stream/open", "", nil)
	h := rec.Header()
	if rec.Code != 200 || rec.Body.Len() != 0 || h.Get("Stream-TTL") != "3600" || h.Get("Stream-Closed") != "" ||
		h.Get("Cache-Control") != "no-store" || h.Get("Content-Type") != "text/plain" || h.Get("Stream-Next-Offset") != "0_1" {
		t.Fatalf("HEAD open: %d %v", rec.Code, h)
	}
	if _, ok := h["Stream-Previous-Incarnation"]; ok {
		t.Fatalf("HEAD of a stream without a new history names a previous incarnation: %v", h)
	}
	if _, ok := h["Stream-Inherited-Offset"]; ok {
		t.Fatalf("HEAD of a stream without a new history names an inherited offset: %v", h)
	}
	// A stream whose group started a new history (a recovery plan, a
	// restore) names the token before it and the offset it kept.
	rec = do(t, g, "HEAD", "/v1/stream/rewritten", "", nil)
	h = rec.Header()
	if rec.Code != 200 || h.Get("Stream-Incarnation") != "40" || h.Get("Stream-Previous-Incarnation") != "7" ||
		h.Get("Stream-Inherited-Offset") != "0000000000000000_0000000000000009" {
		t.Fatalf("HEAD rewritten: %d %v", rec.Code, h)
	}
	rec = do(t, g, "HEAD", "/v1/stream/closed", "", nil)
	if rec.Header().Get("Stream-Closed") != "true" || rec.Header().Get("Stream-Expires-At") != "2030-01-01T00:00:00Z" {
		t.Fatalf("HEAD closed: %v", rec.Header())
	}
	rec = do(t, g, "DELETE", "/v1/stream/open", "", nil)
	if rec.Code != 204 {
		t.Fatalf("DELETE: %d", rec.Code)
	}
	if obs.events() != "deleted:open" {
		t.Fatalf("observer saw %q", obs.events())
	}
	rec = do(t, g, "PATCH", "/v1/stream/open", "", nil)
	if rec.Code != 405 {
		t.Fatalf("PATCH: %d", rec.Code)
	}
	checkSecurityHeaders(t, rec.Header())
}

func TestPreflight(t *testing.T) {
	g := newTestGateway(t, &fakeClient{}, nil)
	rec := do(t, g, "OPTIONS", "/v1/stream/missing", "", map[string]string{
		"Origin": "https://example.com", "Access-Control-Request-Method": "GET",
		"Access-Control-Request-Headers": "if-none-match, x-custom",
	})
	if rec.Code != 204 {
		t.Fatalf("status %d", rec.Code)
	}
	checkSecurityHeaders(t, rec.Header())
	allow := strings.ToLower(rec.Header().Get("Access-Control-Allow-Headers"))
	for _, want := range []string{"if-none-match", "content-type", "producer-id", "stream-fork-sub-offset", "x-custom"} {
		if !strings.Contains(allow, want) {
			t.Fatalf("Allow-Headers %q lacks %q", allow, want)
		}
	}
	if got := rec.Header().Get("Access-Control-Allow-Methods"); got != "GET, POST, PUT, DELETE, HEAD, OPTIONS" {
		t.Fatalf("Allow-Methods = %q", got)
	}
	expose := rec.Header().Get("Access-Control-Expose-Headers")
	for _, want := range []string{"Stream-Next-Offset", "Stream-Cursor", "Stream-SSE-Data-Encoding", "ETag", "Location", "Producer-Seq",
		"Stream-Incarnation", "Stream-Previous-Incarnation", "Stream-Inherited-Offset", "Producer-Outcome"} {
		if !strings.Contains(expose, want) {
			t.Fatalf("Expose-Headers %q lacks %q", expose, want)
		}
	}
}

func TestSubscriptionRouting(t *testing.T) {
	t.Run("nil handler", func(t *testing.T) {
		g := newTestGateway(t, &fakeClient{}, nil)
		rec := do(t, g, "PUT", "/v1/stream/__ds/subscriptions/x", "{}", nil)
		if rec.Code != 404 || rec.Header().Get("Content-Type") != "application/json" {
			t.Fatalf("status %d", rec.Code)
		}
	})
	t.Run("handler", func(t *testing.T) {
		var gotPath string
		sub := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			gotPath = r.URL.Path
			w.WriteHeader(201)
		})
		g := newTestGateway(t, &fakeClient{}, func(c *Config) { c.Subscriptions = sub })
		for _, p := range []string{"/v1/stream/__ds/subscriptions/x", "/v1/stream/__ds"} {
			rec := do(t, g, "PUT", p, "{}", nil)
			if rec.Code != 201 || gotPath != p {
				t.Fatalf("%s: status %d path %q", p, rec.Code, gotPath)
			}
			checkSecurityHeaders(t, rec.Header())
		}
	})
}

func TestBuckets(t *testing.T) {
	f := &fakeClient{createBucket: func(in *streamv1.CreateBucketRequest) (*streamv1.CreateBucketResponse, error) {
		return &streamv1.CreateBucketResponse{Created: in.GetBucket() == "fresh"}, nil
	}}
	g := newTestGateway(t, f, nil)
	tests := []struct {
		method, target string
		status         int
	}{
		{"PUT", "/fresh", 201},
		{"PUT", "/existing", 200},
		{"PUT", "/existing/", 200},
		{"PUT", "/__ds", 400},
		{"PUT", "/x", 400},
		{"POST", "/fresh", 405}, // GET /{bucket} is in TestBucketRoutes
		{"GET", "/", 404},
		{"GET", "/a1/b/c", 404},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.target, func(t *testing.T) {
			rec := do(t, g, tt.method, tt.target, "", nil)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.status, rec.Body)
			}
			checkSecurityHeaders(t, rec.Header())
		})
	}
}

func TestOwnEndpoints(t *testing.T) {
	t.Run("ready", func(t *testing.T) {
		f := &fakeClient{head: func(*streamv1.HeadRequest) (*streamv1.HeadResponse, error) {
			return nil, grpcerr.ToStatus(errcode.New(errcode.StreamNotFound, "no"))
		}}
		g := newTestGateway(t, f, nil)
		rec := do(t, g, "GET", "/__ursula/ready", "", nil)
		if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"ready":true}` {
			t.Fatalf("ready: %d %s", rec.Code, rec.Body)
		}
	})
	t.Run("not ready", func(t *testing.T) {
		f := &fakeClient{head: func(*streamv1.HeadRequest) (*streamv1.HeadResponse, error) {
			return nil, grpcerr.ToStatus(errcode.New(errcode.Unavailable, "down"))
		}}
		g := newTestGateway(t, f, nil)
		rec := do(t, g, "GET", "/__ursula/ready", "", nil)
		if rec.Code != 503 || !strings.Contains(rec.Body.String(), `"ready":false`) {
			t.Fatalf("not ready: %d %s", rec.Code, rec.Body)
		}
	})
	t.Run("metrics", func(t *testing.T) {
		g := newTestGateway(t, &fakeClient{}, nil)
		do(t, g, "GET", "/nope/x/y", "", nil)
		rec := do(t, g, "GET", "/__ursula/metrics", "", nil)
		if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"GET":{"404":1}`) {
			t.Fatalf("metrics: %d %s", rec.Code, rec.Body)
		}
	})
}

// recordingObserver records observer calls.
type recordingObserver struct {
	mu  sync.Mutex
	log []string
}

func (o *recordingObserver) add(s string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.log = append(o.log, s)
}

func (o *recordingObserver) events() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Join(o.log, ",")
}

func (o *recordingObserver) StreamCreated(_ context.Context, p string) { o.add("created:" + p) }
func (o *recordingObserver) StreamWritten(_ context.Context, p string) { o.add("written:" + p) }
func (o *recordingObserver) StreamDeleted(_ context.Context, p string) { o.add("deleted:" + p) }

func TestRetention(t *testing.T) {
	var got *streamv1.SetRetentionRequest
	f := &fakeClient{
		setRetention: func(in *streamv1.SetRetentionRequest) (*streamv1.SetRetentionResponse, error) {
			got = in
			if in.GetOffset() == "0000000000000000_0000000000000099" {
				return nil, grpcerr.ToStatus(errcode.New(errcode.OffsetOutOfRange, "beyond the tail"))
			}
			return &streamv1.SetRetentionResponse{RetainedOffset: "0000000000000000_0000000000000010"}, nil
		},
	}
	g := newTestGateway(t, f, nil)
	rec := do(t, g, "PUT", "/tenant-a/events/retention/0000000000000000_0000000000000004", "", nil)
	if rec.Code != 204 || rec.Header().Get("Stream-Retained-Offset") != "0000000000000000_0000000000000010" {
		t.Fatalf("PUT retention: %d %v", rec.Code, rec.Header())
	}
	if got.GetRef().GetBucket() != "tenant-a" || got.GetRef().GetStream() != "events" || got.GetOffset() != "0000000000000000_0000000000000004" {
		t.Fatalf("node saw %v", got)
	}
	if rec := do(t, g, "PUT", "/tenant-a/events/retention/0000000000000000_0000000000000099", "", nil); rec.Code != 400 {
		t.Fatalf("retention beyond the tail: %d", rec.Code)
	}
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/tenant-a/events/retention/0000000000000000_0000000000000004", 405},
		{"PUT", "/tenant-a/events/retention/", 404},
		{"PUT", "/tenant-a/events/retention/a/b", 404},
		{"PUT", "/tenant-a/events/nothing/x", 404},
	} {
		if rec := do(t, g, c.method, c.path, "", nil); rec.Code != c.want {
			t.Errorf("%s %s: %d, want %d", c.method, c.path, rec.Code, c.want)
		}
	}
}
