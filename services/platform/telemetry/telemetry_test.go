package telemetry

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// noExportEnv clears the variables that turn OTLP export on.
func noExportEnv(tb testing.TB) {
	tb.Helper()
	for _, k := range []string{EnvEndpoint, EnvTracesEndpoint, EnvMetricsEndpoint, EnvTracesExporter, EnvMetricsExporter, EnvSDKDisabled} {
		tb.Setenv(k, "")
	}
}

// newTelemetry sets up telemetry for a test and shuts it down after.
func newTelemetry(tb testing.TB, cfg Config) *Telemetry {
	tb.Helper()
	tel, err := New(tb.Context(), cfg, Identity{ServiceName: "telemetry-test", ClusterID: "c1", NodeID: 7, Build: testBuild}, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := tel.Shutdown(context.Background()); err != nil {
			tb.Errorf("Shutdown: %v", err)
		}
	})
	return tel
}

// scrape GETs h and returns the text exposition.
func scrape(tb testing.TB, h http.Handler) string {
	tb.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/__ursula/prometheus", nil))
	if rec.Code != http.StatusOK {
		tb.Fatalf("scrape: %d %s", rec.Code, rec.Body.String())
	}
	body, _ := io.ReadAll(rec.Body)
	return string(body)
}

// hasLine reports whether text has a sample line for metric name whose
// labels include every one of labels, with the value want ("" for any).
func hasLine(text, name string, labels []string, want string) bool {
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if ok && (want == "" || strings.HasSuffix(line, " "+want)) {
			return true
		}
	}
	return false
}

func TestPrometheusSource(t *testing.T) {
	noExportEnv(t)
	tel := newTelemetry(t, Config{Prometheus: true})
	var appends atomic.Uint64
	appends.Store(3)
	var late atomic.Bool
	src := func(emit func(Sample)) {
		emit(Sample{Name: "append_requests", Kind: Counter, Help: "h", Value: float64(appends.Load())})
		emit(Sample{Name: "streams", Kind: Gauge, Help: "h", Value: 5})
		for g, leader := range []float64{1, 2} {
			emit(Sample{Name: "raft_group_leader_id", Help: "h", Value: leader, Attrs: []attribute.KeyValue{attribute.Int("raft_group_id", g)}})
		}
		if late.Load() {
			emit(Sample{Name: "late_gauge", Help: "h", Value: 9})
		}
	}
	if err := tel.RegisterSource("node", src); err != nil {
		t.Fatal(err)
	}
	h := tel.PrometheusHandler()
	if h == nil {
		t.Fatal("no Prometheus handler")
	}

	text := scrape(t, h)
	for _, c := range []struct {
		name   string
		labels []string
		value  string
	}{
		{"ursula_node_append_requests_total", nil, "3"},
		{"ursula_node_streams", nil, "5"},
		{"ursula_node_raft_group_leader_id", []string{`raft_group_id="0"`}, "1"},
		{"ursula_node_raft_group_leader_id", []string{`raft_group_id="1"`}, "2"},
		{"go_goroutines", nil, ""},
		{"target_info", []string{`service_name="telemetry-test"`, `ursula_node_id="7"`}, "1"},
	} {
		if !hasLine(text, c.name, c.labels, c.value) {
			t.Errorf("no %s%v = %q in:\n%s", c.name, c.labels, c.value, text)
		}
	}
	if !strings.Contains(text, "# TYPE ursula_node_append_requests_total counter") || !strings.Contains(text, "# TYPE ursula_node_streams gauge") {
		t.Errorf("wrong metric types in:\n%s", text)
	}

	// Values are read at each scrape, names that appear later included.
	appends.Store(4)
	late.Store(true)
	text = scrape(t, h)
	if !hasLine(text, "ursula_node_append_requests_total", nil, "4") || !hasLine(text, "ursula_node_late_gauge", nil, "9") {
		t.Errorf("later scrape lacks the new values:\n%s", text)
	}
}

func TestNoExporters(t *testing.T) {
	noExportEnv(t)
	tel := newTelemetry(t, Config{})
	if tel.PrometheusHandler() != nil {
		t.Error("Prometheus handler without Config.Prometheus")
	}
	if tel.tp != nil || tel.mp != nil {
		t.Error("providers installed with nothing to export to")
	}
	if err := tel.RegisterSource("node", func(func(Sample)) { t.Error("source read without a meter provider") }); err != nil {
		t.Fatal(err)
	}
}

func TestExportedByEnv(t *testing.T) {
	tests := []struct {
		name                   string
		env                    map[string]string
		wantTraces, wantMetric bool
	}{
		{"nothing", nil, false, false},
		{"common endpoint", map[string]string{EnvEndpoint: "http://collector:4317"}, true, true},
		{"traces only", map[string]string{EnvTracesEndpoint: "http://collector:4317"}, true, false},
		{"metrics only", map[string]string{EnvMetricsEndpoint: "http://collector:4317"}, false, true},
		{"traces exporter none", map[string]string{EnvEndpoint: "http://collector:4317", EnvTracesExporter: "none"}, false, true},
		{"sdk disabled", map[string]string{EnvEndpoint: "http://collector:4317", EnvSDKDisabled: "true"}, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			noExportEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			if got := TracesExported(); got != tc.wantTraces {
				t.Errorf("TracesExported = %v, want %v", got, tc.wantTraces)
			}
			if got := MetricsExported(); got != tc.wantMetric {
				t.Errorf("MetricsExported = %v, want %v", got, tc.wantMetric)
			}
		})
	}
}

// collector is a fake OTLP/gRPC collector that records what it receives.
type collector struct {
	coltracepb.UnimplementedTraceServiceServer
	mu      sync.Mutex
	spans   []string // span names
	metrics []string // metric names
	service string   // service.name of the last export
}

func (c *collector) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, rs := range req.GetResourceSpans() {
		c.service = serviceName(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				c.spans = append(c.spans, sp.GetName())
			}
		}
	}
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

// metricsService adapts collector to the metrics service, whose method is
// also named Export.
type metricsService struct {
	colmetricpb.UnimplementedMetricsServiceServer
	c *collector
}

func (m metricsService) Export(_ context.Context, req *colmetricpb.ExportMetricsServiceRequest) (*colmetricpb.ExportMetricsServiceResponse, error) {
	m.c.mu.Lock()
	defer m.c.mu.Unlock()
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, mt := range sm.GetMetrics() {
				m.c.metrics = append(m.c.metrics, mt.GetName())
			}
		}
	}
	return &colmetricpb.ExportMetricsServiceResponse{}, nil
}

func serviceName(attrs []*commonpb.KeyValue) string {
	for _, kv := range attrs {
		if kv.GetKey() == "service.name" {
			return kv.GetValue().GetStringValue()
		}
	}
	return ""
}

// startCollector serves a fake collector on a loopback port until the test
// ends and returns its endpoint URL.
func startCollector(tb testing.TB) (*collector, string) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	c := &collector{}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, c)
	colmetricpb.RegisterMetricsServiceServer(srv, metricsService{c: c})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	tb.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return c, "http://" + ln.Addr().String()
}

// TestOTLPExport: with OTEL_EXPORTER_OTLP_ENDPOINT set, spans and metrics
// reach the collector by OTLP/gRPC, flushed by Shutdown.
func TestOTLPExport(t *testing.T) {
	noExportEnv(t)
	c, endpoint := startCollector(t)
	t.Setenv(EnvEndpoint, endpoint)
	t.Setenv(EnvProtocol, ProtocolGRPC)
	t.Setenv("OTEL_SERVICE_NAME", "otlp-test")
	t.Cleanup(func() { otel.SetTracerProvider(tracenoop.NewTracerProvider()) })
	tel, err := New(t.Context(), Config{}, Identity{ServiceName: "default-name"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tel.tp == nil || tel.mp == nil {
		t.Fatal("OTLP endpoint set but no SDK providers")
	}
	if otel.GetTracerProvider() != tel.tp {
		t.Error("the SDK tracer provider is not the global one")
	}
	if err := tel.RegisterSource("test", func(emit func(Sample)) {
		emit(Sample{Name: "appends", Kind: Counter, Help: "h", Value: 1})
	}); err != nil {
		t.Fatal(err)
	}
	_, span := Tracer("test").Start(t.Context(), "test.Op")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tel.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := tel.Shutdown(ctx); err != nil {
		t.Errorf("second Shutdown: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Contains(c.spans, "test.Op") || c.service != "otlp-test" {
		t.Errorf("collector got spans %v of service %q, want test.Op of otlp-test", c.spans, c.service)
	}
	if !slices.Contains(c.metrics, "ursula.test.appends") {
		t.Errorf("collector got metrics %v, want ursula.test.appends", c.metrics)
	}
}

func TestDocumentEmit(t *testing.T) {
	doc := map[string]any{
		"cluster_id":       "c1",
		"append_requests":  float64(10),
		"wal_recovery":     true,
		"peer_mismatches":  []any{},
		"nested":           map[string]any{"a": float64(1), "BytesWritten": float64(2)},
		"raft_group_count": float64(2),
		"raft_groups": []any{
			map[string]any{"raft_group_id": float64(0), "leader_id": float64(1), "is_leader": true, "voters": []any{float64(1)}},
			map[string]any{"raft_group_id": float64(1), "leader_id": float64(2), "is_leader": false},
		},
	}
	d := Document{
		Lists: map[string]List{"raft_groups": {Prefix: "raft_group_", IDKey: "raft_group_id"}},
		Metrics: map[string]Metric{
			"append_requests":      {Kind: Counter, Help: "h"},
			"nested_a":             {Help: "h"},
			"nested_bytes_written": {Help: "h"},
			"raft_group_count":     {Name: "raft_groups", Help: "h"},
			"raft_group_is_leader": {Help: "h"},
			"raft_group_leader_id": {Omit: true},
			"wal_recovery":         {Help: "h"},
			"append_ns":            {Name: "append_time", Kind: Counter, Unit: "s", Scale: 1e-9, Help: "h"},
		},
	}
	doc["append_ns"] = float64(2.5e9)
	doc["undescribed"] = float64(1)
	var got []string
	d.Emit(doc, func(s Sample) {
		line := s.Name
		for _, a := range s.Attrs {
			line += "{" + string(a.Key) + "=" + a.Value.String() + "}"
		}
		if s.Kind == Counter {
			line += " counter"
		}
		got = append(got, line+" "+strconv.FormatFloat(s.Value, 'g', -1, 64))
	})
	slices.Sort(got)
	want := []string{
		"append_requests counter 10",
		"append_time counter 2.5",
		"nested_a 1",
		"nested_bytes_written 2",
		"raft_group_is_leader{raft_group_id=0} 1",
		"raft_group_is_leader{raft_group_id=1} 0",
		"raft_groups 2",
		"wal_recovery 1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("samples:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := d.Undescribed(doc); !slices.Equal(got, []string{"undescribed"}) {
		t.Errorf("Undescribed = %v, want [undescribed]", got)
	}
}

// TestSourceNamesAfterExport: a name a collection meets first is exported
// from the collection after the next sync on (the OTLP export path).
func TestSourceNamesAfterExport(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	tel := &Telemetry{logger: slog.New(slog.DiscardHandler), mp: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	var late atomic.Bool
	if err := tel.RegisterSource("test", func(emit func(Sample)) {
		emit(Sample{Name: "early", Kind: Counter, Help: "h", Value: 1})
		if late.Load() {
			emit(Sample{Name: "late", Help: "h", Value: 2})
		}
	}); err != nil {
		t.Fatal(err)
	}
	names := func() []string {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(t.Context(), &rm); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				out = append(out, m.Name)
			}
		}
		slices.Sort(out)
		return out
	}
	if got := names(); !slices.Equal(got, []string{"ursula.test.early"}) {
		t.Fatalf("first collection: %v", got)
	}
	late.Store(true)
	if got := names(); !slices.Equal(got, []string{"ursula.test.early"}) {
		t.Fatalf("collection meeting a new name: %v", got)
	}
	tel.syncSources(false)
	if got := names(); !slices.Equal(got, []string{"ursula.test.early", "ursula.test.late"}) {
		t.Fatalf("collection after the sync: %v", got)
	}
}
