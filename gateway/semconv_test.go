package gateway

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/tests/await"
)

// The SDK providers of this package's tests, installed globally once: the
// gateway's tracer is a package variable, bound to the first global
// provider set.
var (
	sdkOnce   sync.Once
	spans     *tracetest.SpanRecorder
	sdkReader *sdkmetric.ManualReader
)

func installSDK(tb testing.TB) {
	tb.Helper()
	sdkOnce.Do(func() {
		spans = tracetest.NewSpanRecorder()
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)))
		sdkReader = sdkmetric.NewManualReader()
		otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkReader)))
		otel.SetTextMapPropagator(propagation.TraceContext{})
	})
}

// spansOf returns the ended spans of one trace.
func spansOf(id trace.TraceID) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans.Ended() {
		if s.SpanContext().TraceID() == id {
			out = append(out, s)
		}
	}
	return out
}

// newTraceparent makes a sampled remote parent and its header.
func newTraceparent(tb testing.TB) (trace.SpanContext, string) {
	tb.Helper()
	_, span := sdktrace.NewTracerProvider().Tracer("test").Start(tb.Context(), "client")
	span.End()
	sc := span.SpanContext()
	return sc, "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
}

// TestServerSemconv: a request's server span carries the HTTP semantic
// conventions' attributes, and http.server.request.duration records it.
func TestServerSemconv(t *testing.T) {
	installSDK(t)
	fs := &fakeStream{}
	fs.append("hello", false)
	g := newTestGateway(t, fs.client(t), nil)
	parent, tp := newTraceparent(t)
	rec := do(t, g, http.MethodGet, "http://gw.example:8080/v1/stream/semconv-s?offset=-1", "", map[string]string{"traceparent": tp, "User-Agent": "semconv-test"})
	if rec.Code != http.StatusOK {
		t.Fatalf("GET: %d %s", rec.Code, rec.Body.String())
	}
	got := spansOf(parent.TraceID())
	if len(got) != 1 {
		t.Fatalf("%d spans in the request's trace, want 1", len(got))
	}
	sp := got[0]
	if sp.Parent().SpanID() != parent.SpanID() || sp.SpanKind() != trace.SpanKindServer || sp.Name() != "GET /v1/stream/{stream...}" {
		t.Errorf("span %q kind %v parent %v", sp.Name(), sp.SpanKind(), sp.Parent().SpanID())
	}
	attrs := map[attribute.Key]attribute.Value{}
	for _, a := range sp.Attributes() {
		attrs[a.Key] = a.Value
		if strings.Contains(a.Value.String(), "semconv-s") {
			t.Errorf("span attribute %s = %q names the stream", a.Key, a.Value.String())
		}
	}
	for k, want := range map[attribute.Key]string{
		"http.request.method":       "GET",
		"http.route":                "/v1/stream/{stream...}",
		"url.scheme":                "http",
		"server.address":            "gw.example",
		"server.port":               "8080",
		"network.protocol.version":  "1.1",
		"user_agent.original":       "semconv-test",
		"http.response.status_code": "200",
		"client.address":            "192.0.2.1",
	} {
		if v, ok := attrs[k]; !ok || v.String() != want {
			t.Errorf("span attribute %s = %q (set %v), want %q", k, v.String(), ok, want)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := sdkReader.Collect(t.Context(), &rm); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "http.server.request.duration" {
				continue
			}
			if m.Unit != "s" {
				t.Errorf("http.server.request.duration unit %q, want s", m.Unit)
			}
			h, ok := m.Data.(metricdata.Histogram[float64])
			if !ok {
				t.Fatalf("http.server.request.duration is a %T", m.Data)
			}
			for _, dp := range h.DataPoints {
				route, _ := dp.Attributes.Value("http.route")
				status, _ := dp.Attributes.Value("http.response.status_code")
				method, _ := dp.Attributes.Value("http.request.method")
				scheme, _ := dp.Attributes.Value("url.scheme")
				if route.AsString() == "/v1/stream/{stream...}" && status.AsInt64() == 200 && method.AsString() == "GET" && scheme.AsString() == "http" && dp.Count >= 1 {
					found = true
				}
			}
		}
	}
	if !found {
		t.Errorf("no http.server.request.duration point for GET /v1/stream/{stream...} 200 in %+v", rm.ScopeMetrics)
	}
}

// TestSSESubscriptionJoinsTrace: the upstream subscription a live SSE read
// starts (its stream's hub) is traced as part of that request, not as a
// trace of its own.
func TestSSESubscriptionJoinsTrace(t *testing.T) {
	installSDK(t)
	fs := &fakeStream{}
	fs.append("history;", false)
	var (
		mu     sync.Mutex
		subCtx trace.SpanContext
	)
	client := fs.client(t)
	client.subscribe = func(ctx context.Context, in *streamv1.SubscribeRequest) (grpc.ServerStreamingClient[streamv1.SubscribeResponse], error) {
		mu.Lock()
		subCtx = trace.SpanContextFromContext(ctx)
		mu.Unlock()
		return fs.subscribe(ctx, in)
	}
	g := newTestGateway(t, client, nil)
	srv := httptest.NewServer(g.Handler())
	defer srv.Close()
	defer g.Close()
	parent, tp := newTraceparent(t)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/v1/stream/sse-trace?offset=-1&live=sse", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("traceparent", tp)
	hc := &http.Client{Transport: &http.Transport{}}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	await.True(t, "the hub's upstream subscription", func() bool { return fs.subscribes.Load() == 1 })
	mu.Lock()
	got := subCtx
	mu.Unlock()
	if got.TraceID() != parent.TraceID() {
		t.Fatalf("the SSE upstream subscription runs in trace %s, want the request's %s", got.TraceID(), parent.TraceID())
	}
	// A second client joins the running hub: its span says which span
	// the shared subscription descends from.
	parent2, tp2 := newTraceparent(t)
	req2, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+"/v1/stream/sse-trace?offset=-1&live=sse", nil)
	if err != nil {
		t.Fatal(err)
	}
	req2.Header.Set("traceparent", tp2)
	resp2, err := hc.Do(req2)
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	await.True(t, "both clients on the hub", func() bool { h := g.hubOf("sse-trace"); return h != nil && h.clientCount() == 2 })
	fs.append("end", true)
	for _, r := range []*http.Response{resp, resp2} {
		if data := sseData(t, r.Body); data != "history;end" {
			t.Errorf("SSE data %q", data)
		}
	}
	await.True(t, "the first request's server span", func() bool {
		for _, s := range spansOf(parent.TraceID()) {
			if s.SpanKind() == trace.SpanKindServer && s.SpanContext().SpanID() == got.SpanID() {
				return true
			}
		}
		return false
	})
	var joined []sdktrace.ReadOnlySpan
	await.True(t, "the second request's server span", func() bool { joined = spansOf(parent2.TraceID()); return len(joined) == 1 })
	if n := fs.subscribes.Load(); n != 1 {
		t.Fatalf("%d upstream subscriptions, want 1", n)
	}
	var found bool
	for _, ev := range joined[0].Events() {
		if ev.Name != "ursula.sse.hub_joined" {
			continue
		}
		attrs := attribute.NewSet(ev.Attributes...)
		tid, _ := attrs.Value(attrHubTraceID)
		sid, _ := attrs.Value(attrHubSpanID)
		found = tid.AsString() == parent.TraceID().String() && sid.AsString() == got.SpanID().String()
	}
	if !found {
		t.Errorf("the joining request's span has no hub_joined event naming %s/%s: %+v", parent.TraceID(), got.SpanID(), joined[0].Events())
	}
}

// TestRecordDurationAllocs: recording a request's duration allocates
// nothing once its attribute combination was seen.
func TestRecordDurationAllocs(t *testing.T) {
	installSDK(t)
	var m metrics
	m.newDuration()
	ctx := t.Context()
	m.recordDuration(ctx, time.Millisecond, "/{bucket}/{stream}", http.MethodPost, 204, false)
	if n := testing.AllocsPerRun(100, func() {
		m.recordDuration(ctx, time.Millisecond, "/{bucket}/{stream}", http.MethodPost, 204, false)
	}); n != 0 {
		t.Errorf("recordDuration allocates %v times per call", n)
	}
}
