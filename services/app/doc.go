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
//
// Under a service manager (systemd, Type=notify: $NOTIFY_SOCKET set), Main
// tells it READY=1 once the process serves, STATUS= lines, STOPPING=1 when
// a graceful shutdown begins, and WATCHDOG=1 every half of WatchdogSec
// (notify.go says what "serves" means for each target; package
// services/platform/sdnotify speaks the protocol).
package app
