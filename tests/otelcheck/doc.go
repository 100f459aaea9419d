// Package otelcheck holds what the telemetry tests of several tiers share:
// the Prometheus linter over a text exposition, and an OTLP/HTTP receiver
// that decodes what a process exports (spans by trace, service.version by
// service, the unit of every metric) for the test to inspect.
package otelcheck
