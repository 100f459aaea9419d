// Package chaos tests a 3-node Ursula cluster under faults and checks what
// clients saw: real ursula-node processes and an ursula-gateway on loopback
// (the tests/e2e harness), the cluster plane of every node routed through
// one TCP proxy per directed link (e2e.Proxy), so that links can be
// blackholed, delayed and reset while the processes run unmodified.
//
// TestChaos:
//
//   - workload: 6 streams, 3 idempotent producers and 1 reader each, all
//     through the gateway; every 2 minutes the workers move to 6 new streams,
//     which keeps each stream's history small enough to check in a long
//     run. A producer appends unique newline-terminated
//     records, one in flight, and retries each with the same (id, epoch,
//     seq) until it has a definite answer (200 with Stream-Next-Offset, or
//     204 duplicate); after 20 s its outcome is unknown and the producer
//     moves to a new epoch, which fences the old tuple. A reader reads from
//     where its last read ended, sometimes from an offset it was given
//     earlier, rarely from the start (reads are recorded as length and
//     hash, so long runs do not keep their bytes).
//   - nemesis, one fault at a time, each followed by a wait until every
//     node is ready and every group has an agreed leader (a cluster that
//     does not recover within 90 s fails the test for liveness): SIGKILL
//     the leader of a group holding one of the streams and restart it on
//     its data directory; the same with a power loss (before the restart,
//     up to half of each of its active journal segments is cut, as a lost
//     page cache would be: it comes back behind the recovery gate); SIGTERM
//     a node and restart it; isolate a node
//     (blackhole every link from and to it; its client plane stays
//     reachable, so the gateway may still send it requests); delay a node's
//     links by 20-170 ms; reset a node's connections.
//   - after the faults: every link healed, every node running; every stream
//     must acknowledge appends again; producers finish their in-flight
//     append.
//   - history: every operation is recorded with invoke and return times
//     (History) and each stream's history is checked for linearizability
//     with porcupine against Model, an append-only log of unique records:
//     a 200 lands exactly at the tail it names, a 204 means the record is
//     in the log, an append of unknown outcome is there at most once or
//     not at all, a read returns exactly the log between its offsets, and
//     all of the rest of the log when it says it is up to date. An illegal
//     history is written as porcupine's HTML visualization (with the faults
//     as annotations) to $URSULA_TEST_ARTIFACTS or a temporary directory.
//   - read-back: each stream is read through the gateway and parsed into
//     records: no record twice, none that was never sent, every 200 at its
//     acknowledged offset, no acknowledged (200 or 204) record missing.
//     Then every node is read over gRPC (StreamService.Read on its client
//     plane: followers serve history): each must hold the same bytes with
//     the same incarnation, and every acknowledged append is read back at
//     its offset from every node.
//
// TestModel and TestHistoryCheck check the checker itself on small
// histories, lost, duplicated, misplaced and stale results included.
//
// Duration: make test runs the short run (faults for 40 s, about 90 s in
// all; `go test -short` halves the faults). make test-chaos runs faults for
// CHAOS_DURATION (default 10m). Environment: URSULA_CHAOS_DURATION (or
// -chaos.duration), URSULA_CHAOS_SEED (or -chaos.seed) to repeat a run's
// random choices, URSULA_CHAOS_NODES (default 3; 5 for a larger cluster, 1
// to exercise the harness and checker without a cluster plane),
// URSULA_BIN_DIR for prebuilt binaries, URSULA_TEST_ARTIFACTS to keep the
// logs, configuration files and visualizations of a failed run.
package chaos
