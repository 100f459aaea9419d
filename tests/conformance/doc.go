// Package conformance runs the official Durable Streams server conformance
// suite (npm @durable-streams/server-conformance-tests, pinned with its vitest
// in package-lock.json) against Ursula, in both deployments.
//
// TestConformance starts bin/ursula the way `make run` does: no config file
// and no flags except loopback listen addresses on free ports and
// -subscriptions.allow-webhook-hosts=127.0.0.0/8,::1,localhost (the suite's
// webhook receivers listen on this machine, and webhooks to loopback are
// refused by default), in a fresh temporary working directory (so the data
// lands in its ./data). The other two tests pass the same allowance.
// TestConformanceCluster starts a 3-node cluster of ursula-node processes
// behind ursula-gateway with the tests/e2e harness (e2e.StartCluster). Each
// waits for /__ursula/ready, runs
//
//	npx vitest run --reporter=json --outputFile=<tmp>/results.json
//
// in this directory with CONFORMANCE_TEST_URL pointing at the gateway and
// CONFORMANCE_SUBSCRIPTIONS=1, and fails unless all 338 tests ran and passed,
// printing every test that did not. Node 20+ and npm must be on PATH; the
// test fails (it does not skip) without them, and runs `npm ci` when
// node_modules is missing or older than package-lock.json.
//
// The suite's own CLI finds no tests when installed from npm, so
// conformance.test.mjs calls runConformanceTests and vitest.config.mjs
// includes only that file. Against an already running server:
//
//	make conformance CONFORMANCE_TEST_URL=http://127.0.0.1:4437
//
// Environment: URSULA_BIN (or URSULA_BIN_DIR) selects prebuilt binaries,
// otherwise the tests build ./services/cmd/{ursula,ursula-node,ursula-gateway}.
package conformance
