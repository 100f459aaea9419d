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
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
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
)

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
	traces, metrics := TracesExported(), MetricsExported()
	if !traces && !metrics && !cfg.Prometheus {
		return t, nil
	}
	res, err := newResource(ctx, cfg, id)
	if err != nil {
		return nil, err
	}
	if traces {
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP trace exporter: %w", err)
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
		exp, err := otlpmetricgrpc.New(ctx)
		if err != nil {
			_ = t.Shutdown(ctx)
			return nil, fmt.Errorf("telemetry: OTLP metric exporter: %w", err)
		}
		readers = append(readers, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(&syncingExporter{Exporter: exp, t: t})))
	}
	if len(readers) > 0 {
		t.mp = sdkmetric.NewMeterProvider(append(readers, sdkmetric.WithResource(res))...)
		otel.SetMeterProvider(t.mp)
	}
	logger.Info("telemetry started", "traces_otlp", traces, "metrics_otlp", metrics, "prometheus", cfg.Prometheus)
	return t, nil
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
