package gateway

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// BenchmarkAppend measures the gateway's own cost of a POST append (the
// node call is a no-op fake).
func BenchmarkAppend(b *testing.B) {
	resp := &streamv1.AppendResponse{NextOffset: "0000000000000000_0000000000000100"}
	f := &fakeClient{appendFn: func(*streamv1.AppendRequest) (*streamv1.AppendResponse, error) { return resp, nil }}
	g := newTestGateway(b, f, nil)
	h := g.Handler()
	body := strings.Repeat("x", 100)
	req := httptest.NewRequest("POST", "/v1/stream/bench/s1", nil)
	req.Header.Set("Content-Type", "text/plain")
	b.ReportAllocs()
	for b.Loop() {
		req.Body = stringBody(body)
		req.ContentLength = int64(len(body))
		w := discardWriter{h: http.Header{}}
		h.ServeHTTP(&w, req)
		if w.status != 204 {
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

type readCloser struct{ *strings.Reader }

func (readCloser) Close() error { return nil }

func stringBody(s string) readCloser { return readCloser{strings.NewReader(s)} }
