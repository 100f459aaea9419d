// The official Durable Streams server conformance suite, pointed at a running
// server. The suite's own CLI finds no tests when installed from npm, so it is
// called from this file instead.
//
//   CONFORMANCE_TEST_URL=http://127.0.0.1:4437 CONFORMANCE_SUBSCRIPTIONS=1 npx vitest run
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.CONFORMANCE_TEST_URL
if (!baseUrl) {
  throw new Error("set CONFORMANCE_TEST_URL to the server's origin, e.g. http://127.0.0.1:4437")
}

runConformanceTests({
  baseUrl: baseUrl.replace(/\/+$/, ""),
  subscriptions: process.env.CONFORMANCE_SUBSCRIPTIONS === "1",
})
