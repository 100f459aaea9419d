// Package integration tests components wired together in one process: a
// real storage engine, node server, upstream router and gateway, talking
// real gRPC and HTTP on loopback ports chosen at run time. It sits between
// the unit tests beside each package and the spawned-binary tests of
// tests/e2e; `make test-integration` runs it with the race detector.
//
// telemetry_test.go checks the OpenTelemetry wiring end to end: one HTTP
// append produces connected spans in the gateway and the node (over gRPC
// and over the all-in-one in-process client), an incoming W3C traceparent
// is honoured, and the Prometheus endpoints of the gateway and of the
// node's admin plane expose the metrics documents' values.
package integration
