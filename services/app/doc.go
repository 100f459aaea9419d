// Package app composes Ursula's roles into processes. One root Config
// (defaults < TOML file < flags) configures every role; a target selects
// which roles run: "all" (node + gateway + subscriptions in one process,
// talking to each other over the same gRPC clients as a split deployment),
// "node" or "gateway". Main is what every binary's main calls.
//
// A process that runs the gateway makes one in-flight request-body budget
// of server.http_inflight_body_size (services/platform/httpserver.Budget)
// and gives it to the gateway and the subscription APIs; the start is
// refused (InflightBodyBudgetTooSmall) when it is below the gateway's
// max_body_bytes, or, on a node, below 64 MiB.
package app
