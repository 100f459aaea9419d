// Package app composes Ursula's roles into processes. One root Config
// (defaults < TOML file < flags) configures every role; a target selects
// which roles run: "all" (node + gateway + subscriptions in one process,
// talking to each other over the same gRPC clients as a split deployment),
// "node" or "gateway". Main is what every binary's main calls.
package app
