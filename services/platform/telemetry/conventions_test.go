package telemetry

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/ursula/ursula/tests/otelcheck"
)

// testBuild is the build the tests' telemetry describes.
var testBuild = Build{Version: "v1.2.3-test", Commit: "abc123", GoVersion: "go1.x"}

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
	if problems := otelcheck.Lint(t, text); len(problems) > 0 {
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

// TestOTLPHTTPExport: OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf exports
// spans and metrics over OTLP/HTTP, with service.version and units.
func TestOTLPHTTPExport(t *testing.T) {
	noExportEnv(t)
	recv, endpoint := otelcheck.NewReceiver(t)
	t.Setenv(EnvEndpoint, endpoint)
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
	got := recv.Received()
	var spans []string
	for _, trace := range got.Traces {
		spans = append(spans, trace...)
	}
	if !slices.Contains(spans, "otlp-http-test test.Op") || got.Versions["otlp-http-test"] != testBuild.Version {
		t.Errorf("spans %v with service.version %v; want test.Op of otlp-http-test with %q", spans, got.Versions, testBuild.Version)
	}
	for name, unit := range map[string]string{"ursula.test.appended": "By", "ursula.test.duration": "s", "ursula.build_info": "{build}"} {
		if u, ok := got.Units[name]; !ok || u != unit {
			t.Errorf("metric %s: unit %q (exported %v), want %q; got %v", name, u, ok, unit, got.Units)
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
