// Package e2e tests Ursula as an operator runs it: real binaries spawned as
// separate processes, each in its own temporary directory with free loopback
// ports, talked to over HTTP, killed with SIGKILL or stopped with SIGTERM and
// restarted on the same data directory.
//
// The non-test files are the harness, shared with the other test tiers
// (tests/conformance, tests/bench):
//
//   - Binary locates a server binary: $URSULA_BIN for ursula, else
//     $URSULA_BIN_DIR/<name> (the Makefile sets both to bin/), else it runs
//     go build once per test process into a temporary directory.
//   - Server is one spawned process and the addresses it was given. Start,
//     WaitReady, Kill (SIGKILL), Terminate (SIGTERM) and Restart act on that
//     process only, by its pid; the data directory survives restarts.
//   - Client speaks the Durable Streams protocol (PUT create, POST append with
//     idempotent-producer headers, GET catch-up paged by Stream-Next-Offset).
//
// The tests here:
//
//   - TestDurability: acknowledged appends survive SIGKILL (fsync "always"
//     and "never") and SIGTERM byte-exact at their offsets, and producers
//     retrying after the restart are deduplicated; in the all-in-one
//     deployment, and in the split one (ursula-node behind ursula-gateway,
//     the node killed while the gateway stays up);
//   - TestExampleConfig: every binary accepts deploy/ursula.example.toml.
//
// Run with `make test-e2e`, or `go test ./tests/e2e` (which builds the
// binaries itself when URSULA_BIN / URSULA_BIN_DIR are unset).
package e2e
