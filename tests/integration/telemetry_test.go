package integration

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/ursula/ursula/gateway"
	"github.com/ursula/ursula/internal/buildinfo"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/node"
	"github.com/ursula/ursula/services/platform/telemetry"
	"github.com/ursula/ursula/tests/await"
)

// spans records every span of the test process: the global tracer
// provider exports synchronously into it.
var spans = tracetest.NewInMemoryExporter()

func TestMain(m *testing.M) {
	// The process exports its traces (into spans), and says so the way a
	// deployment does: the gRPC stats handlers that make the client and
	// server spans of a node call are installed only when traces are
	// exported. Nothing reads this endpoint: the tests never start the
	// OTLP exporter (TestPrometheusEndpoints clears it for its own).
	if err := os.Setenv(telemetry.EnvTracesEndpoint, "http://127.0.0.1:9"); err != nil {
		panic(err)
	}
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)))
	otel.SetTextMapPropagator(telemetry.Propagator())
	goleak.VerifyTestMain(m)
}

// appendSpanName is the node's span (and the gateway's client span) of an
// append, as otelgrpc names it.
var appendSpanName = strings.TrimPrefix(streamv1.StreamService_Append_FullMethodName, "/")

// gatewayAppendSpanName is the gateway's server span of a Durable Streams
// append.
const gatewayAppendSpanName = "POST /v1/stream/{stream...}"

// appendTrace is the spans of one append.
type appendTrace struct {
	gateway, client, node tracetest.SpanStub
}

// waitAppendTrace waits until the spans of one append have ended: the
// gateway's server and client spans and the node's server span. The node may end its span after the gateway
// answered, so this polls.
func waitAppendTrace(tb testing.TB) appendTrace {
	tb.Helper()
	var tr appendTrace
	found, want := 0, 7
	ended := await.Until(await.DefaultTimeout, func() bool {
		tr, found = appendTrace{}, 0
		for _, s := range spans.GetSpans() {
			switch {
			case s.Name == gatewayAppendSpanName && s.SpanKind == trace.SpanKindServer:
				tr.gateway = s
				found |= 1
			case s.Name == appendSpanName && s.SpanKind == trace.SpanKindServer:
				tr.node = s
				found |= 2
			case s.Name == appendSpanName && s.SpanKind == trace.SpanKindClient:
				tr.client = s
				found |= 4
			}
		}
		return found == want
	})
	if !ended {
		tb.Fatalf("spans of the append did not all end (found mask %b, want %b): %s", found, want, spanList())
	}
	return tr
}

// spanList describes the recorded spans for failure messages.
func spanList() string {
	var b strings.Builder
	for _, s := range spans.GetSpans() {
		fmt.Fprintf(&b, "\n  %s %q trace=%s span=%s parent=%s", s.SpanKind, s.Name, s.SpanContext.TraceID(), s.SpanContext.SpanID(), s.Parent.SpanID())
	}
	return b.String()
}

// attr returns a span attribute's value as a string ("" when absent).
func attr(s tracetest.SpanStub, key string) string {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value.String()
		}
	}
	return ""
}

// checkGatewaySpan checks the gateway span's name-level attributes.
func checkGatewaySpan(tb testing.TB, s tracetest.SpanStub) {
	tb.Helper()
	for k, want := range map[string]string{
		"http.request.method":       "POST",
		"http.route":                "/v1/stream/{stream...}",
		"http.response.status_code": "204",
		"ursula.bucket":             gateway.BuiltinBucket,
	} {
		if got := attr(s, k); got != want {
			tb.Errorf("gateway span %s = %q, want %q", k, got, want)
		}
	}
	for _, kv := range s.Attributes {
		if strings.Contains(kv.Value.String(), "hello") || strings.Contains(kv.Value.String(), "trace-stream") {
			tb.Errorf("gateway span records the body or the stream name: %s=%s", kv.Key, kv.Value.String())
		}
	}
}

// Remote parent of the traceparent test (the W3C specification's example).
const (
	remoteTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	remoteSpanID  = "00f067aa0ba902b7"
)

// TestAppendTrace: an append through the gateway to a node is one trace:
// gateway server span → gateway client span → node server span, the node
// span a child of the client span carried in the gRPC metadata; an
// incoming traceparent makes the gateway span a child of the remote span.
// The same holds whether the gateway reaches the node over loopback gRPC
// (through the upstream router) or in process (the all-in-one binary's
// inproc connection): one code path, one trace shape.
func TestAppendTrace(t *testing.T) {
	t.Run("over gRPC", func(t *testing.T) {
		n := startNode(t)
		n.serve(t)
		_, base := startGateway(t, startRouter(t, n.clientAddr), nil)
		checkAppendTraces(t, base)
	})
	t.Run("in process", func(t *testing.T) {
		n := startNode(t)
		_, base := startGateway(t, streamv1.NewStreamServiceClient(n.srv.Conn()), nil)
		checkAppendTraces(t, base)
	})
}

// checkAppendTraces appends through the gateway at base, without and with
// an incoming traceparent, and checks the trace of each append.
func checkAppendTraces(t *testing.T, base string) {
	hc := httpClient(t)
	if code, body := request(t, hc, http.MethodPut, base+"/v1/stream/trace-stream", "", map[string]string{"Content-Type": "text/plain"}); code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}

	tests := []struct {
		name        string
		traceparent string
	}{
		{"new trace", ""},
		{"incoming traceparent", "00-" + remoteTraceID + "-" + remoteSpanID + "-01"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spans.Reset()
			hdr := map[string]string{"Content-Type": "text/plain"}
			if tc.traceparent != "" {
				hdr["traceparent"] = tc.traceparent
			}
			if code, body := request(t, hc, http.MethodPost, base+"/v1/stream/trace-stream", "hello", hdr); code != http.StatusNoContent {
				t.Fatalf("append: %d %s", code, body)
			}
			tr := waitAppendTrace(t)
			checkGatewaySpan(t, tr.gateway)

			gw := tr.gateway.SpanContext
			if tc.traceparent == "" {
				if tr.gateway.Parent.IsValid() {
					t.Errorf("gateway span has a parent without a traceparent: %v", tr.gateway.Parent.SpanID())
				}
			} else {
				if gw.TraceID().String() != remoteTraceID {
					t.Errorf("gateway span trace %s, want the incoming %s", gw.TraceID(), remoteTraceID)
				}
				if p := tr.gateway.Parent; !p.IsRemote() || p.SpanID().String() != remoteSpanID {
					t.Errorf("gateway span parent %s (remote %v), want the incoming span %s", p.SpanID(), p.IsRemote(), remoteSpanID)
				}
			}
			if tr.client.Parent.SpanID() != gw.SpanID() {
				t.Errorf("client span parent %s, want the gateway span %s%s", tr.client.Parent.SpanID(), gw.SpanID(), spanList())
			}
			if p := tr.node.Parent; p.SpanID() != tr.client.SpanContext.SpanID() || !p.IsRemote() {
				t.Errorf("node span parent %s (remote %v), want the gateway's client span %s%s", p.SpanID(), p.IsRemote(), tr.client.SpanContext.SpanID(), spanList())
			}
			for _, s := range []tracetest.SpanStub{tr.client, tr.node} {
				if s.SpanContext.TraceID() != gw.TraceID() {
					t.Errorf("%s span %q in trace %s, want the gateway's %s", s.SpanKind, s.Name, s.SpanContext.TraceID(), gw.TraceID())
				}
			}
			if got := attr(tr.node, "rpc.response.status_code"); got != "OK" {
				t.Errorf("node span status code %q, want OK", got)
			}
		})
	}
}

// TestPrometheusEndpoints: the gateway's listener and the node's admin
// plane serve the metrics documents' values in the Prometheus text format.
func TestPrometheusEndpoints(t *testing.T) {
	for _, k := range []string{telemetry.EnvEndpoint, telemetry.EnvTracesEndpoint, telemetry.EnvMetricsEndpoint} {
		t.Setenv(k, "")
	}
	tel, err := telemetry.New(t.Context(), telemetry.Config{Prometheus: true}, telemetry.Identity{ServiceName: "ursula", ClusterID: testClusterID, NodeID: 1, Build: telemetry.Build(buildinfo.Get())}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tel.Shutdown(context.Background()); err != nil {
			t.Errorf("telemetry Shutdown: %v", err)
		}
	})
	prom := tel.PrometheusHandler()
	n := startNodeWith(t, node.Deps{Prometheus: prom})
	n.serve(t)
	router := startRouter(t, n.clientAddr)
	gw, base := startGateway(t, router, func(c *gateway.Config) { c.Prometheus = prom })
	for name, src := range map[string]telemetry.Source{"node": n.srv.MetricsSource(), "raft": n.srv.RaftMetricsSource(), "wal": n.srv.WALMetricsSource(), "gateway": gw.MetricsSource(), "upstream": router.MetricsSource()} {
		if err := tel.RegisterSource(name, src); err != nil {
			t.Fatalf("RegisterSource %s: %v", name, err)
		}
	}

	hc := httpClient(t)
	if code, body := request(t, hc, http.MethodPut, base+"/v1/stream/prom-stream", "", map[string]string{"Content-Type": "text/plain"}); code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	for i := range 3 {
		if code, body := request(t, hc, http.MethodPost, base+"/v1/stream/prom-stream", fmt.Sprintf("m%d", i), map[string]string{"Content-Type": "text/plain"}); code != http.StatusNoContent {
			t.Fatalf("append: %d %s", code, body)
		}
	}

	for _, ep := range []struct{ name, url string }{
		{"gateway", base + "/__ursula/prometheus"},
		{"node admin", "http://" + n.adminAddr + "/__ursula/prometheus"},
	} {
		t.Run(ep.name, func(t *testing.T) {
			code, text := request(t, hc, http.MethodGet, ep.url, "", nil)
			if code != http.StatusOK {
				t.Fatalf("GET: %d %s", code, text)
			}
			for _, want := range []struct {
				name   string
				labels []string
				value  string
			}{
				{"ursula_node_append_requests_total", nil, "3"},
				{"ursula_node_append_errors_total", nil, "0"},
				{"ursula_node_raft_groups", nil, "4"},
				{"ursula_node_raft_group_leader_info", []string{`raft_group_id="0"`, `leader_node_id="1"`}, "1"},
				{"ursula_node_raft_group_leader_info", []string{`raft_group_id="3"`, `leader_node_id="1"`}, "1"},
				{"ursula_node_raft_group_is_leader", []string{`raft_group_id="0"`}, "1"},
				// The seed's gauges outside the node's document.
				{"ursula_raft_recovery_gates", []string{`status="stalled"`}, "0"},
				{"ursula_raft_recovery_gates", []string{`status="closed"`}, "0"},
				{"ursula_wal_recovering", nil, "0"},
				{"ursula_gateway_requests_total", []string{`http_request_method="POST"`, `http_response_status_code="204"`}, "3"},
				{"ursula_gateway_requests_total", []string{`http_request_method="PUT"`, `http_response_status_code="201"`}, "1"},
				{"ursula_upstream_known_nodes", nil, "1"},
				{"ursula_build_info", []string{`version="` + buildinfo.Get().Version + `"`, `commit="` + buildinfo.Get().Commit + `"`, `go_version="` + runtime.Version() + `"`}, "1"},
				{"target_info", []string{`service_version="` + buildinfo.Get().Version + `"`}, "1"},
				{"http_server_request_duration_seconds_count", []string{`http_route="/v1/stream/{stream...}"`, `http_request_method="POST"`, `http_response_status_code="204"`}, "3"},
				{"ursula_node_append_duration_seconds_count", nil, "3"},
				{"target_info", []string{`service_name="ursula"`, `ursula_cluster_id="` + testClusterID + `"`}, "1"},
			} {
				if !hasSample(text, want.name, want.labels, want.value) {
					t.Errorf("no %s%v %s in:\n%s", want.name, want.labels, want.value, text)
				}
			}
			if !strings.Contains(text, "# TYPE ursula_node_append_requests_total counter") || !strings.Contains(text, "# TYPE ursula_node_raft_group_leader_info gauge") {
				t.Errorf("wrong metric types")
			}
		})
	}
}

// hasSample reports whether the text exposition has a sample of name whose
// labels include every one of labels, with value want.
func hasSample(text, name string, labels []string, want string) bool {
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := strings.HasSuffix(line, " "+want)
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if ok {
			return true
		}
	}
	return false
}
