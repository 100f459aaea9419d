// Command bench is Ursula's load generator. It is not part of `make test`;
// run it with `make bench`, or
//
//	go run ./tests/bench -server bin/ursula [-duration 10s] [-streams 500] ...
//
// For each server it runs these workloads (-workloads), each for -duration
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
//   - mixed: multi-stream, fan-out and replay at once, each with its own
//     streams and usual parameters, measured from a common start once all
//     three are set up (a barrier); each part's p99 is reported beside the
//     p99 of the same workload alone against the same server earlier in
//     the run (not against null: it has no SSE);
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
// Two workloads start servers of their own, after the others: backup
// (create and restore, hot-only and cold-heavy) and cardinality, a sweep
// over -cardinality-streams (default 500, 10 k, 100 k, 1 M) against ursula
// fsync=never and, with -peers node, the Node peer in memory. Each stream
// count gets a fresh server, so that no figure depends on the order of the
// sweep: its streams are created with 64 PUTs in flight (time, rate and
// server CPU per create recorded, VmRSS after), then -cardinality-writers
// (500) writers append -payload bytes round-robin over them (writer w to
// streams w, w+500, …), one request in flight each, with producer headers
// and a sequence number per stream, for -duration: ops/s, p50/p99, server
// CPU per append, peak RSS (VmHWM), and the throughput over that of the
// smallest count. Every phase is bounded: creating one count's streams by
// -cardinality-create-timeout (5 min); a count that does not make it (or
// whose server exits) is reported as such, with how many streams were
// created, and larger counts are not tried against that server. At the
// largest count ursula is then stopped gracefully and started again, then
// killed (SIGKILL) and started again: the seconds from each start to ready
// (each bounded by 2 minutes) check the startup target. With
// -cardinality-cluster the same sweep also runs against a fresh 3-node
// cluster per count, through its gateway (CPU of the four processes, RSS
// of the largest node, no restarts); it is off by default, as creating a
// million streams through the gateway takes minutes (raise
// -cardinality-create-timeout for it).
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
//   - with -cluster (the default), a 3-node cluster started with the e2e
//     harness (e2e.StartCluster, as the e2e tests start theirs): three
//     ursula-node processes (16 groups, 2 cores, fsync never, TLS on both
//     planes, a shared local cold directory, as make run-cluster
//     configures them) and an ursula-gateway in front, on free loopback
//     ports, with the binaries next to -server. multi-stream, fan-out,
//     replay and mixed run against the gateway; CPU and RSS are read for
//     every process, reported per process and summed, and every 503 and
//     error is counted. -cluster-url measures a running cluster instead;
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
// 100 ms (summed over a cluster's processes, and per process); VmHWM (peak
// RSS) is read before the server is stopped.
//
// The server's CPU time (utime+stime of /proc/<pid>/stat, of every process
// of a cluster) is read when a workload starts its measured phase (after
// creating and pre-filling its streams; mixed, whose parts run at once,
// from its start) and at its end: server_cpu_s, and cpu_per_op_us per
// operation.
//
// The result is one JSON document on stdout: per server and workload the
// ops/s, latency (count, mean, p50, p90, p99, p999, max in ms), errors,
// server CPU and RSS, the ratios to null, the cardinality sweep, and each
// target below with its measured value:
//
//   - multi-stream at 500 streams: ≥ 0.68 × null with fsync never,
//     ≥ 0.50 × null with fsync always;
//   - server peak RSS ≤ 165 MiB (before the memory workload);
//   - with S3 as the cold store, multi-stream and replay ops/s at least
//     0.90 × the local-directory run's;
//   - RSS after appending 2 GiB ≤ RSS after 20 MiB + the hot cap, for the
//     local directory and for S3;
//   - fan-out to 1000 subscribers: p99 ≤ 25 ms, every event delivered;
//   - replay of 100 clients: p99 ≤ 28 ms;
//
// and those of issue 16: multi-stream with fsync always ≥ 0.90 × fsync
// never; the cluster ≥ 0.45 × null with no 503 or other error; under mixed
// load each p99 ≤ 1.5 × alone; with 1,000,000 streams peak RSS ≤ 1.5 GiB
// and append throughput ≥ 0.80 × that over 500 streams, and a start to
// ready within 30 s after a graceful stop and after a crash. The targets
// this run cannot check (against the official Go server, which is not in
// the run; the gateway's CPU against the all-in-one's HTTP front alone; a
// million streams on the cluster, without -cardinality-cluster) are listed
// as not measured, with the figure that bears on them; -strict ignores
// them. With -cardinality-cluster the cluster's million streams are held
// to the single node's bounds (largest node's peak RSS ≤ 1.5 GiB, ≥ 0.80 ×
// its own throughput over 500 streams) and to no 503 or other error.
//
// With -report FILE.md a run that completed also writes a Markdown report:
// the machine (host, CPU model, cores, memory, kernel, Go and Node
// versions), the configuration (and every flag a shortened run changed),
// per workload a table of each server's ops/s, ratio to null, p50/p99,
// server CPU per operation, RSS and errors, then mixed load, the cluster
// per process, the cardinality sweep and the targets; with hand-written
// SVG plots beside it: img/bench-throughput.svg (ratio to null per
// workload and server; fan-out, which null cannot run, as a ratio to the
// fastest server), img/bench-latency-<workload>.svg (p50 and p99 per
// server, log scale), img/bench-cpu.svg (server CPU per operation),
// img/bench-rss.svg (peak RSS per server) and
// img/bench-cardinality-{throughput,cpu,rss}.svg (against the stream
// count, log scale). make bench passes -report docs/benchmarks.md only
// when BENCH_ARGS is empty: a shortened run prints its JSON and leaves the
// committed report alone.
//
// A full make bench takes about 13 to 20 minutes on 2 cores (19 min 40 s
// for the committed report, on a host about half as fast as the one that
// took 12 min 20 s): about 6 for the single-node servers and the peers, 1
// for the cluster, 2 for mixed load, and the rest for the cardinality sweep (creating a million streams on
// each of ursula and the Node peer, each bounded by
// -cardinality-create-timeout, and ursula's two restarts with them).
// -cardinality-streams 500,10k and a shorter -duration make a run of a few
// minutes.
//
// testdata/ holds a fixed report and its golden renderings
// (go test ./tests/bench -update rewrites them).
//
// With -strict the command exits 1 when a target is missed. With -target URL
// it measures an already running server instead (RSS only with -pid).
package main
