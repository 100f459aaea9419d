// Command bench is Ursula's load generator. It is not part of `make test`;
// run it with `make bench`, or
//
//	go run ./tests/bench -server bin/ursula [-duration 10s] [-streams 500] ...
//
// For each server it runs these workloads, the first four for -duration
// (bootstrap twice: bootstrap, then catch-up):
//
//   - multi-stream: -streams streams, 256-byte appends (-payload), one
//     request in flight per stream, idempotent-producer headers
//     (Producer-Id bench-<i>, epoch 0, seq counting up);
//   - fan-out: one text/plain stream, a writer paced at -writer-rate events/s,
//     -subscribers SSE readers (offset=now&live=sse) measuring end-to-end
//     latency from the send timestamp in each payload, and counting every
//     event each subscriber misses;
//   - replay: -replay-clients clients, each with its own stream pre-filled
//     with -replay-events appends of -replay-event-bytes, reading it from
//     offset -1 to the tail all at once, round after round;
//   - bootstrap: -replay-clients clients, each with its own stream in one
//     bucket of the Ursula URL family: 64 appends of -replay-event-bytes
//     (the history), a 64 KiB snapshot published at their end, then a tail
//     of -replay-events appends; every client GETs /{bucket}/{stream}/bootstrap
//     (the snapshot and the tail as multipart/mixed) round after round for
//     -duration, then, for comparison, catches up on the same stream from
//     offset -1 (history and tail) for -duration (extra.catch_up_*);
//   - memory (fsync=never servers only): 16 writers append 64 KiB bodies to
//     8 streams, -memory-warmup bytes (20 MiB) first, then up to
//     -memory-total (2 GiB), retrying 503s (cold-write backpressure); the
//     server's VmRSS is sampled after each part once the flushes settled.
//
// The servers, each a separate process on loopback and started fresh:
//
//   - null: this binary re-executed with -null.listen, a trivial HTTP server
//     that answers 204 to every request and stores nothing. It bounds what
//     the client and the loopback can do on this machine; Ursula's numbers
//     are reported as ratios to it;
//   - ursula with -raft.wal.fsync=never, then with -raft.wal.fsync=always, each
//     started as `make run` starts it (embedded defaults: the cold store is
//     a local directory; a fresh temporary working and data directory)
//     except for free loopback listen ports and -hot-cap;
//   - with -cold s3 (the default), ursula with -raft.wal.fsync=never once more,
//     its cold tier on a versitygw S3 server the bench starts (bin/versitygw
//     or $VERSITYGW), under a date-stamped prefix.
//   - with -peers node (make bench passes it), the Node reference server
//     (npm @durable-streams/server, pinned by node-peer/package-lock.json,
//     which the binary embeds): installed with npm ci into -peer-dir
//     (bin/node-peer next to -server) when that does not hold the same lock
//     already, and started by node-peer/serve.mjs twice, in memory ("node
//     memory") and on its file store in a fresh directory ("node files").
//     Without node or npm on PATH it is skipped with a note in the report.
//     The Ursula-only workload (bootstrap) is not run against it.
//
// While a workload runs, the server's VmRSS is sampled from /proc every
// 100 ms; VmHWM (peak RSS) is read before the server is stopped.
//
// The server's CPU time (utime+stime of /proc/<pid>/stat) is read before
// and after each workload: server_cpu_s, and cpu_per_op_us per operation.
//
// The result is one JSON document on stdout: per server and workload the
// ops/s, latency (count, mean, p50, p90, p99, p999, max in ms), errors,
// server CPU and RSS, the ratios to null, and each target below with its measured value:
//
//   - multi-stream at 500 streams: ≥ 0.68 × null with fsync never,
//     ≥ 0.50 × null with fsync always;
//   - server peak RSS ≤ 165 MiB (before the memory workload);
//   - with S3 as the cold store, multi-stream and replay ops/s at least
//     0.90 × the local-directory run's;
//   - RSS after appending 2 GiB ≤ RSS after 20 MiB + the hot cap, for the
//     local directory and for S3;
//   - fan-out to 1000 subscribers: p99 ≤ 25 ms, every event delivered;
//   - replay of 100 clients: p99 ≤ 28 ms.
//
// With -report FILE.md (make bench writes docs/benchmarks.md) a run that
// completed also writes a Markdown report: the machine (CPU model, cores,
// memory, Go and Node versions), the configuration, and per workload a
// table of each server's ops/s, ratio to null, p50/p99, server CPU per
// operation, RSS and errors; with hand-written SVG plots beside it in
// img/bench-throughput.svg (ratio to null per workload and server) and
// img/bench-latency-<workload>.svg (p50 and p99 per server, log scale).
// testdata/ holds a fixed report and its golden renderings
// (go test ./tests/bench -update rewrites them).
//
// With -strict the command exits 1 when a target is missed. With -target URL
// it measures an already running server instead (RSS only with -pid).
package main
