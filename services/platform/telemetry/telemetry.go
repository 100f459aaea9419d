package telemetry

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopePrefix prefixes the instrumentation scope of every tracer of ours.
const ScopePrefix = "github.com/ursula/ursula/"

// Standard OpenTelemetry environment variables that New reads itself (the
// exporters read the rest of OTEL_EXPORTER_OTLP_*).
const (
	EnvEndpoint        = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint  = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvMetricsEndpoint = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
	EnvTracesExporter  = "OTEL_TRACES_EXPORTER"
	EnvMetricsExporter = "OTEL_METRICS_EXPORTER"
	EnvSDKDisabled     = "OTEL_SDK_DISABLED"
	EnvProtocol        = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol  = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	EnvMetricsProtocol = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
)

// OTLP transport protocols, the values of OTEL_EXPORTER_OTLP_*PROTOCOL.
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
)

// ErrProtocol is returned by New for an OTLP protocol it does not speak.
var ErrProtocol = errors.New("telemetry: unsupported OTLP protocol")

// Protocols returns the OTLP protocol of traces and of metrics: the
// signal's own variable, else OTEL_EXPORTER_OTLP_PROTOCOL, else
// http/protobuf, the specification's default (earlier releases defaulted
// to grpc: a collector reached on its gRPC port 4317 now needs
// OTEL_EXPORTER_OTLP_PROTOCOL=grpc). A value other than grpc or http/protobuf (http/json
// included, which the Go exporters do not speak) is an error naming the
// variable.
func Protocols() (traces, metrics string, err error) {
	pick := func(signalVar string) (string, error) {
		name, v := signalVar, strings.TrimSpace(os.Getenv(signalVar))
		if v == "" {
			name, v = EnvProtocol, strings.TrimSpace(os.Getenv(EnvProtocol))
		}
		switch v {
		case "":
			return ProtocolHTTPProtobuf, nil
		case ProtocolGRPC, ProtocolHTTPProtobuf:
			return v, nil
		}
		return "", fmt.Errorf("%w: %s=%q (want %q or %q)", ErrProtocol, name, v, ProtocolGRPC, ProtocolHTTPProtobuf)
	}
	if traces, err = pick(EnvTracesProtocol); err != nil {
		return "", "", err
	}
	if metrics, err = pick(EnvMetricsProtocol); err != nil {
		return "", "", err
	}
	return traces, metrics, nil
}

// Config is the [telemetry] section. Exporters are configured by the
// standard OTEL_* environment variables, not here (see doc.go).
type Config struct {
	// Prometheus serves the process's metrics in the Prometheus text format
	// at GET /__ursula/prometheus, on the gateway's listener and on the
	// node's admin listener.
	Prometheus bool `toml:"prometheus"`
	// ServiceName is the service.name of this process's traces and
	// metrics; empty means the binary's name (ursula, ursula-node, ...).
	// OTEL_SERVICE_NAME overrides it.
	ServiceName string `toml:"service_name"`
}

// RegisterFlags registers the telemetry flags on fs with "telemetry."
// prefixes.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.Prometheus, "telemetry.prometheus", true, "serve metrics in the Prometheus text format at GET /__ursula/prometheus (gateway listener, node admin listener)")
	fs.StringVar(&c.ServiceName, "telemetry.service_name", "", "service.name of traces and metrics (default: the binary's name; OTEL_SERVICE_NAME overrides)")
}

// Identity names this process in the telemetry resource.
type Identity struct {
	// ServiceName is the default service.name (Config.ServiceName and
	// OTEL_SERVICE_NAME override it).
	ServiceName string
	// ClusterID and NodeID are added as ursula.cluster_id and
	// ursula.node_id when set.
	ClusterID string
	NodeID    uint64
	// Build is the binary's build: service.version, and the attributes
	// of ursula.build_info.
	Build Build
}

// Build describes the binary (the fields of internal/buildinfo.Info,
// which the platform packages do not import; convert with Build(info)).
type Build struct {
	Version   string
	Commit    string
	GoVersion string
}

// Telemetry owns the process's tracer and meter providers.
type Telemetry struct {
	logger   *slog.Logger
	tp       *sdktrace.TracerProvider // nil: traces are not exported
	mp       *sdkmetric.MeterProvider // nil: no reader, metrics are no-ops
	registry *prometheus.Registry     // nil unless Config.Prometheus
	prom     http.Handler

	mu       sync.Mutex
	bridges  []*bridge
	shutdown bool
}

// New sets up telemetry as doc.go describes and installs the global
// propagator, and the global tracer and meter providers when they export
// anywhere. It starts nothing that needs stopping before Shutdown.
func New(ctx context.Context, cfg Config, id Identity, logger *slog.Logger) (*Telemetry, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	t := &Telemetry{logger: logger}
	otel.SetTextMapPropagator(Propagator())
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		logger.Warn("opentelemetry error", "err", err)
	}))
	traceProto, metricProto, err := Protocols()
	if err != nil {
		return nil, err
	}
	traces, metrics := TracesExported(), MetricsExported()
	if !traces && !metrics && !cfg.Prometheus {
		return t, nil
	}
	res, err := newResource(ctx, cfg, id)
	if err != nil {
		return nil, err
	}
	if traces {
		var exp sdktrace.SpanExporter
		if traceProto == ProtocolHTTPProtobuf {
			exp, err = otlptracehttp.New(ctx)
		} else {
			exp, err = otlptracegrpc.New(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP trace exporter (%s): %w", traceProto, err)
		}
		t.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		otel.SetTracerProvider(t.tp)
	}
	var readers []sdkmetric.Option
	if cfg.Prometheus {
		t.registry = prometheus.NewRegistry()
		t.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		exp, err := otelprom.New(otelprom.WithRegisterer(t.registry), otelprom.WithoutScopeInfo())
		if err != nil {
			_ = t.Shutdown(ctx)
			return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
		}
		readers = append(readers, sdkmetric.WithReader(exp))
		t.prom = promhttp.HandlerFor(t.registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)})
	}
	if metrics {
		var exp sdkmetric.Exporter
		if metricProto == ProtocolHTTPProtobuf {
			exp, err = otlpmetrichttp.New(ctx)
		} else {
			exp, err = otlpmetricgrpc.New(ctx)
		}
		if err != nil {
			_ = t.Shutdown(ctx)
			return nil, fmt.Errorf("telemetry: OTLP metric exporter (%s): %w", metricProto, err)
		}
		readers = append(readers, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(&syncingExporter{Exporter: exp, t: t})))
	}
	if len(readers) > 0 {
		t.mp = sdkmetric.NewMeterProvider(append(readers, sdkmetric.WithResource(res))...)
		otel.SetMeterProvider(t.mp)
		if err := registerBuildInfo(t.mp, id.Build); err != nil {
			_ = t.Shutdown(ctx)
			return nil, err
		}
	}
	logger.Info("telemetry started", "traces_otlp", traces, "traces_protocol", traceProto,
		"metrics_otlp", metrics, "metrics_protocol", metricProto, "prometheus", cfg.Prometheus)
	return t, nil
}

// registerBuildInfo exports ursula.build_info: 1, with the binary's
// version, commit and Go version as attributes (ursula_build_info in
// Prometheus).
func registerBuildInfo(mp metric.MeterProvider, bi Build) error {
	attrs := metric.WithAttributeSet(attribute.NewSet(
		attribute.String("version", bi.Version),
		attribute.String("commit", bi.Commit),
		attribute.String("go_version", bi.GoVersion),
	))
	_, err := mp.Meter(ScopePrefix+"services/platform/telemetry").Int64ObservableGauge("ursula.build_info",
		metric.WithDescription("The build of this process: always 1, with its version, commit and Go version as labels."),
		metric.WithUnit("{build}"),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			o.Observe(1, attrs)
			return nil
		}))
	if err != nil {
		return fmt.Errorf("telemetry: build_info: %w", err)
	}
	return nil
}

// LatencyBuckets are the explicit bucket boundaries, in seconds, of every
// latency histogram of ours: 100 µs to 10 s.
var LatencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Meter returns the global meter of one of our packages, named by its
// path in the module ("gateway", "storage/wal"). Instruments made before
// New installs the meter provider forward to it once it does; without
// one they record nothing.
func Meter(pkg string) metric.Meter { return otel.Meter(ScopePrefix + pkg) }

// Latency makes a histogram of durations in seconds (unit "s", buckets
// LatencyBuckets) on m: Prometheus shows it as <name>_seconds_bucket,
// _sum and _count. It never fails: an instrument the SDK refuses records
// nothing.
func Latency(m metric.Meter, name, help string) metric.Float64Histogram {
	h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(help),
		metric.WithExplicitBucketBoundaries(LatencyBuckets...))
	if err != nil {
		otel.Handle(fmt.Errorf("telemetry: histogram %s: %w", name, err))
	}
	if h == nil {
		return noop.Float64Histogram{}
	}
	return h
}

// Propagator is the W3C trace-context plus baggage propagator New installs
// globally.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// Tracer returns the global tracer of one of our packages, named by its
// path in the module ("gateway", "services/node").
func Tracer(pkg string) trace.Tracer { return otel.Tracer(ScopePrefix + pkg) }

// TracesExported reports whether the environment asks for OTLP trace
// export.
func TracesExported() bool {
	return exported(EnvTracesEndpoint, EnvTracesExporter)
}

// MetricsExported reports whether the environment asks for OTLP metric
// export.
func MetricsExported() bool {
	return exported(EnvMetricsEndpoint, EnvMetricsExporter)
}

func exported(signalEndpoint, exporterVar string) bool {
	if disabled, _ := strconv.ParseBool(os.Getenv(EnvSDKDisabled)); disabled {
		return false
	}
	if strings.EqualFold(strings.TrimSpace(os.Getenv(exporterVar)), "none") {
		return false
	}
	return os.Getenv(EnvEndpoint) != "" || os.Getenv(signalEndpoint) != ""
}

func newResource(ctx context.Context, cfg Config, id Identity) (*resource.Resource, error) {
	name := cfg.ServiceName
	if name == "" {
		name = id.ServiceName
	}
	attrs := []attribute.KeyValue{semconv.ServiceName(name)}
	if id.Build.Version != "" {
		attrs = append(attrs, semconv.ServiceVersion(id.Build.Version))
	}
	if id.ClusterID != "" {
		attrs = append(attrs, attribute.String("ursula.cluster_id", id.ClusterID))
	}
	if id.NodeID != 0 {
		attrs = append(attrs, attribute.Int64("ursula.node_id", int64(id.NodeID)))
	}
	// Later options win: the environment overrides our defaults.
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && res == nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, nil
}

// MeterProvider returns the process's meter provider (a no-op one when
// metrics go nowhere).
func (t *Telemetry) MeterProvider() metric.MeterProvider {
	if t.mp == nil {
		return noop.NewMeterProvider()
	}
	return t.mp
}

// PrometheusHandler serves the text exposition of every registered source
// (and the Go runtime's and process's collectors); nil unless
// Config.Prometheus.
func (t *Telemetry) PrometheusHandler() http.Handler {
	if t.prom == nil {
		return nil
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.syncSources(true)
		t.prom.ServeHTTP(w, r)
	})
}

// Shutdown flushes and stops the providers. It is idempotent.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	t.mu.Lock()
	if t.shutdown {
		t.mu.Unlock()
		return nil
	}
	t.shutdown = true
	bridges := t.bridges
	t.bridges = nil
	t.mu.Unlock()
	var errs []error
	if t.tp != nil {
		errs = append(errs, t.tp.Shutdown(ctx))
	}
	if t.mp != nil {
		// The last export reads the sources: unregister them after it.
		errs = append(errs, t.mp.Shutdown(ctx))
	}
	for _, b := range bridges {
		errs = append(errs, b.close())
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("telemetry: shutdown: %w", err)
	}
	return nil
}

// syncingExporter re-reads the sources' metric names after each periodic
// OTLP export (outside the SDK's collection, where instruments cannot be
// registered).
type syncingExporter struct {
	sdkmetric.Exporter
	t *Telemetry
}

func (e *syncingExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	err := e.Exporter.Export(ctx, rm)
	e.t.syncSources(false)
	return err
}
