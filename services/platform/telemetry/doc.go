// Package telemetry sets up OpenTelemetry for a process: traces, metrics
// and the log handler that ties logs to traces.
//
// # Traces
//
// New always installs the W3C trace-context and baggage propagators as the
// global propagator, so an incoming traceparent header passes from the
// gateway to the node even when this process exports nothing. It installs an
// SDK tracer provider, exporting by OTLP, only when
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set
// (and OTEL_TRACES_EXPORTER is not "none", OTEL_SDK_DISABLED not "true");
// otherwise the global tracer provider stays the no-op one and a span costs
// a context value. The exporter reads the standard OTEL_EXPORTER_OTLP_*
// variables (headers, TLS, timeout) and the sampler OTEL_TRACES_SAMPLER.
// OTEL_EXPORTER_OTLP_PROTOCOL, or the signal's own _TRACES_PROTOCOL /
// _METRICS_PROTOCOL, picks the transport of each signal: http/protobuf (the
// specification's default) or grpc; New refuses any other value with ErrProtocol, so a
// wrong setting stops the process at start instead of failing every
// export. The resource has service.name, service.version (the build's
// version, internal/buildinfo) and the node's identity.
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
// the element's id as an attribute (raft_group_id, for example). A sample
// carries its instrument's description and UCUM unit; one without a
// description is not exported. A component that serves a JSON document
// exports it through a Document whose Metrics catalog names, scales
// (nanoseconds and milliseconds to seconds) and describes each value, or
// omits it (identities, duplicates): the JSON keys are an operator
// contract, the instruments follow the conventions. The SDK meter
// provider has a Prometheus reader when Config.Prometheus is set
// (PrometheusHandler serves its text exposition at GET
// /__ursula/prometheus) and a periodic OTLP reader when
// OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set;
// with neither, the meter provider is the no-op one. Instrument names are
// "ursula.<source>.<name>", which Prometheus renders as
// ursula_<source>_<name> with the unit's suffix (_seconds for "s", _bytes
// for "By"; annotations such as "{request}" add none) and _total on
// counters. Every process with a meter provider exports ursula.build_info
// (1, with version, commit and go_version attributes).
//
// Latency histograms are synchronous instruments a component makes with
// Latency from Meter (the global meter provider, set by New before the
// components are built): unit "s", buckets LatencyBuckets (100 µs to
// 10 s).
//
// # Logs
//
// NewLogHandler wraps a slog.Handler: it picks each record's level
// threshold by the logger's "component" attribute (the per-component
// levels of [log] levels) and adds trace_id and span_id to records logged
// with a context that carries a span.
package telemetry
