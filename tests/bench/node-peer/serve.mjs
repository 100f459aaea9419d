#!/usr/bin/env node
// Starts the Node reference server (@durable-streams/server) for the load
// generator: -listen=host:port, and -data-dir=path for its file store (in
// memory without it). It stops on SIGTERM or SIGINT.
import { DurableStreamTestServer } from "@durable-streams/server"

const opts = { host: "127.0.0.1", port: 4437 }
for (const arg of process.argv.slice(2)) {
  const m = /^--?([a-z.-]+)=(.*)$/.exec(arg)
  if (!m) {
    console.error(`serve.mjs: unknown argument ${arg}`)
    process.exit(2)
  }
  if (m[1] === "listen") {
    const i = m[2].lastIndexOf(":")
    opts.host = m[2].slice(0, i)
    opts.port = Number(m[2].slice(i + 1))
  } else if (m[1] === "data-dir") {
    opts.dataDir = m[2]
  } else {
    console.error(`serve.mjs: unknown flag -${m[1]}`)
    process.exit(2)
  }
}

const server = new DurableStreamTestServer(opts)
await server.start()
console.log(`node reference server listening on http://${opts.host}:${opts.port}` + (opts.dataDir ? ` (files in ${opts.dataDir})` : " (in memory)"))
for (const sig of ["SIGTERM", "SIGINT"]) {
  process.on(sig, async () => {
    await server.stop()
    process.exit(0)
  })
}
