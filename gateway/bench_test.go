package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/httpserver"
)

// BenchmarkAppend measures the gateway's own cost of a POST append (the
// node call is a no-op fake): plain, and as the bench's multi-stream
// workload sends it (producer headers, 256 bytes) behind the HTTP server
// wrapper every listener has (httpserver.Config.Handler).
func BenchmarkAppend(b *testing.B) {
	b.Run("plain", func(b *testing.B) {
		resp := &streamv1.AppendResponse{NextOffset: "0000000000000000_0000000000000100"}
		benchAppend(b, resp, 100, nil, false)
	})
	b.Run("producer", func(b *testing.B) {
		resp := &streamv1.AppendResponse{NextOffset: "0000000000000000_0000000000000100", Incarnation: 1764640000123, ProducerSeq: 41}
		benchAppend(b, resp, 256, map[string]string{"Producer-Id": "bench-7", "Producer-Epoch": "0", "Producer-Seq": "41"}, true)
	})
}

func benchAppend(b *testing.B, resp *streamv1.AppendResponse, size int, headers map[string]string, wrapped bool) {
	f := &fakeClient{appendFn: func(*streamv1.AppendRequest) (*streamv1.AppendResponse, error) { return resp, nil }}
	g := newTestGateway(b, f, nil)
	h := g.Handler()
	if wrapped {
		h = httpserver.Config{}.Handler(h)
	}
	want := http.StatusNoContent
	if len(headers) > 0 {
		want = http.StatusOK
	}
	body := strings.Repeat("x", size)
	req := httptest.NewRequest("POST", "/v1/stream/bench/s1", nil)
	req.Header.Set("Content-Type", "application/octet-stream")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	b.ReportAllocs()
	for b.Loop() {
		req.Body = stringBody(body)
		req.ContentLength = int64(len(body))
		w := discardWriter{h: http.Header{}}
		h.ServeHTTP(&w, req)
		if w.status != want {
			b.Fatalf("status %d", w.status)
		}
	}
}

type discardWriter struct {
	h      http.Header
	status int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(s int)           { w.status = s }

// The server's connection has deadlines; without them the HTTP wrapper
// would measure the errors of a writer that has none.
func (w *discardWriter) SetReadDeadline(time.Time) error  { return nil }
func (w *discardWriter) SetWriteDeadline(time.Time) error { return nil }

type readCloser struct{ *strings.Reader }

func (readCloser) Close() error { return nil }

func stringBody(s string) readCloser { return readCloser{strings.NewReader(s)} }
