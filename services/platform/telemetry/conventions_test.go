package telemetry

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"go.opentelemetry.io/otel"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// testBuild is the build the tests' telemetry describes.
var testBuild = Build{Version: "v1.2.3-test", Commit: "abc123", GoVersion: "go1.x"}

// lint runs the Prometheus linter over a text exposition.
func lint(tb testing.TB, text string) []string {
	tb.Helper()
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		tb.Fatalf("promlint: %v", err)
	}
	var out []string
	for _, p := range problems {
		out = append(out, p.Metric+": "+p.Text)
	}
	return out
}

// TestPrometheusConventions: what the sources and histograms export passes
// promlint: descriptions become HELP, units become _seconds and _bytes,
// counters end in _total, ursula_build_info is there; a sample without a
// description is not exported at all.
func TestPrometheusConventions(t *testing.T) {
	noExportEnv(t)
	tel := newTelemetry(t, Config{Prometheus: true})
	if err := tel.RegisterSource("node", func(emit func(Sample)) {
		emit(Sample{Name: "append_bytes", Kind: Counter, Unit: "By", Help: "Bytes appended.", Value: 10})
		emit(Sample{Name: "append_time", Kind: Counter, Unit: "s", Help: "Time in Append.", Value: 0.5})
		emit(Sample{Name: "raft_groups", Unit: "{group}", Help: "Groups.", Value: 3})
		emit(Sample{Name: "hot", Unit: "By", Help: "Hot bytes.", Value: 3})
		emit(Sample{Name: "undescribed", Value: 1})
	}); err != nil {
		t.Fatal(err)
	}
	h := Latency(tel.MeterProvider().Meter("test"), "ursula.node.append.duration", "Latency of Append calls.")
	h.Record(t.Context(), 0.003)

	text := scrape(t, tel.PrometheusHandler())
	if problems := lint(t, text); len(problems) > 0 {
		t.Errorf("promlint found %d problems:\n%s\nin:\n%s", len(problems), strings.Join(problems, "\n"), text)
	}
	bi := testBuild
	for _, c := range []struct {
		name   string
		labels []string
		value  string
	}{
		{"ursula_node_append_bytes_total", nil, "10"},
		{"ursula_node_append_time_seconds_total", nil, "0.5"},
		{"ursula_node_raft_groups", nil, "3"},
		{"ursula_node_hot_bytes", nil, "3"},
		{"ursula_node_append_duration_seconds_bucket", []string{`le="0.005"`}, "1"},
		{"ursula_node_append_duration_seconds_count", nil, "1"},
		{"ursula_build_info", []string{`version="` + bi.Version + `"`, `commit="` + bi.Commit + `"`, `go_version="` + bi.GoVersion + `"`}, "1"},
		{"target_info", []string{`service_version="` + bi.Version + `"`}, "1"},
	} {
		if !hasLine(text, c.name, c.labels, c.value) {
			t.Errorf("no %s%v = %q in:\n%s", c.name, c.labels, c.value, text)
		}
	}
	for _, want := range []string{"# HELP ursula_node_append_bytes_total Bytes appended.", "# TYPE ursula_node_append_duration_seconds histogram"} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in:\n%s", want, text)
		}
	}
	if strings.Contains(text, "undescribed") {
		t.Errorf("a sample without a description was exported:\n%s", text)
	}
}

func TestProtocols(t *testing.T) {
	tests := []struct {
		name                string
		env                 map[string]string
		wantTrace, wantMetr string
		wantErr             string
	}{
		{"default", nil, ProtocolHTTPProtobuf, ProtocolHTTPProtobuf, ""},
		{"common http", map[string]string{EnvProtocol: "http/protobuf"}, ProtocolHTTPProtobuf, ProtocolHTTPProtobuf, ""},
		{"signal overrides common", map[string]string{EnvProtocol: "http/protobuf", EnvTracesProtocol: "grpc"}, ProtocolGRPC, ProtocolHTTPProtobuf, ""},
		{"metrics only", map[string]string{EnvMetricsProtocol: "grpc"}, ProtocolHTTPProtobuf, ProtocolGRPC, ""},
		{"json refused", map[string]string{EnvProtocol: "http/json"}, "", "", EnvProtocol},
		{"unknown signal value", map[string]string{EnvTracesProtocol: "udp"}, "", "", EnvTracesProtocol},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			noExportEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			tr, mt, err := Protocols()
			if tc.wantErr != "" {
				if !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want ErrProtocol naming %s", err, tc.wantErr)
				}
				// New refuses to start, even with nothing to export.
				if _, err := New(t.Context(), Config{Prometheus: true}, Identity{ServiceName: "x"}, nil); !errors.Is(err, ErrProtocol) {
					t.Fatalf("New: %v, want ErrProtocol", err)
				}
				return
			}
			if err != nil || tr != tc.wantTrace || mt != tc.wantMetr {
				t.Fatalf("Protocols() = %q, %q, %v; want %q, %q", tr, mt, err, tc.wantTrace, tc.wantMetr)
			}
		})
	}
}

// httpCollector is an OTLP/HTTP receiver: it decodes the protobuf bodies
// POSTed to /v1/traces and /v1/metrics.
type httpCollector struct {
	mu      sync.Mutex
	spans   []string
	version string            // service.version of the last trace export
	units   map[string]string // metric name -> unit
}

func (c *httpCollector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil || r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch r.URL.Path {
	case "/v1/traces":
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range req.GetResourceSpans() {
			c.version = attrString(rs.GetResource().GetAttributes(), "service.version")
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					c.spans = append(c.spans, sp.GetName())
				}
			}
		}
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	case "/v1/metrics":
		var req colmetricpb.ExportMetricsServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rm := range req.GetResourceMetrics() {
			for _, sm := range rm.GetScopeMetrics() {
				for _, m := range sm.GetMetrics() {
					c.units[m.GetName()] = m.GetUnit()
				}
			}
		}
		out, _ := proto.Marshal(&colmetricpb.ExportMetricsServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	default:
		http.NotFound(w, r)
	}
}

func attrString(attrs []*commonpb.KeyValue, key string) string {
	for _, kv := range attrs {
		if kv.GetKey() == key {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// TestOTLPHTTPExport: OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf exports
// spans and metrics over OTLP/HTTP, with service.version and units.
func TestOTLPHTTPExport(t *testing.T) {
	noExportEnv(t)
	c := &httpCollector{units: map[string]string{}}
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	t.Setenv(EnvEndpoint, srv.URL)
	t.Setenv(EnvProtocol, ProtocolHTTPProtobuf)
	t.Cleanup(func() { otel.SetTracerProvider(tracenoop.NewTracerProvider()) })
	tel, err := New(t.Context(), Config{}, Identity{ServiceName: "otlp-http-test", Build: testBuild}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := tel.RegisterSource("test", func(emit func(Sample)) {
		emit(Sample{Name: "appended", Kind: Counter, Unit: "By", Help: "h", Value: 1})
	}); err != nil {
		t.Fatal(err)
	}
	Latency(tel.MeterProvider().Meter("test"), "ursula.test.duration", "h").Record(t.Context(), 0.1)
	_, span := Tracer("test").Start(t.Context(), "test.Op")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.spans, "test.Op") || c.version != testBuild.Version {
		t.Errorf("spans %v with service.version %q; want test.Op with %q", c.spans, c.version, testBuild.Version)
	}
	for name, unit := range map[string]string{"ursula.test.appended": "By", "ursula.test.duration": "s", "ursula.build_info": "{build}"} {
		if got, ok := c.units[name]; !ok || got != unit {
			t.Errorf("metric %s: unit %q (exported %v), want %q; got %v", name, got, ok, unit, c.units)
		}
	}
}

// TestLatencyRecordAllocs: recording into a latency histogram allocates
// nothing, with a Prometheus reader and without any.
func TestLatencyRecordAllocs(t *testing.T) {
	noExportEnv(t)
	for _, cfg := range []Config{{Prometheus: true}, {}} {
		tel := newTelemetry(t, cfg)
		h := Latency(tel.MeterProvider().Meter("test"), "ursula.test.allocs.duration", "h")
		ctx := t.Context()
		h.Record(ctx, 0.001)
		if n := testing.AllocsPerRun(100, func() { h.Record(ctx, 0.001) }); n != 0 {
			t.Errorf("Prometheus %v: Record allocates %v times", cfg.Prometheus, n)
		}
	}
}
