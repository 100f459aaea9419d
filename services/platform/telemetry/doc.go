// Package telemetry sets up OpenTelemetry for a process: traces, metrics
// and the log handler that ties logs to traces.
//
// # Traces
//
// New always installs the W3C trace-context and baggage propagators as the
// global propagator, so an incoming traceparent header passes from the
// gateway to the node even when this process exports nothing. It installs an
// SDK tracer provider, exporting by OTLP/gRPC, only when
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set
// (and OTEL_TRACES_EXPORTER is not "none", OTEL_SDK_DISABLED not "true");
// otherwise the global tracer provider stays the no-op one and a span costs
// a context value. The exporter reads the standard OTEL_EXPORTER_OTLP_*
// variables (headers, TLS, timeout) and the sampler OTEL_TRACES_SAMPLER.
// Span names are "<pkg>.<Op>" for our own spans, the HTTP route for the
// gateway's server spans, and the gRPC full method for RPC spans.
//
// # Metrics
//
// The process's metrics are counted once, in the owning package's atomic
// counters, and read through a Source: a function that emits Samples from
// one snapshot. RegisterSource turns the samples into asynchronous
// instruments (observable counters for monotonic counts, gauges otherwise)
// observed by one callback per source; a sample of a list element carries
// the element's id as an attribute (raft_group_id, for example). The SDK
// meter provider has a Prometheus reader when Config.Prometheus is set
// (PrometheusHandler serves its text exposition at GET
// /__ursula/prometheus) and a periodic OTLP/gRPC reader when
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set;
// with neither, the meter provider is the no-op one. Instrument names are
// "ursula.<source>.<name>", which Prometheus renders as
// ursula_<source>_<name>, with a _total suffix on counters.
//
// # Logs
//
// NewLogHandler wraps a slog.Handler: it picks each record's level
// threshold by the logger's "component" attribute (the per-component
// levels of [log] levels) and adds trace_id and span_id to records logged
// with a context that carries a span.
package telemetry
