// Package coldgc is the cold-GC and compaction worker (ursula-coldgc; the
// all-in-one binary runs it in process). It talks to a storage node
// through ColdGCService and to the object store directly, and never to
// Raft: everything it changes in the replicated state goes through the
// node as a command.
//
// Three jobs, each idempotent so that two workers, a crash or a retry do
// no harm:
//
//   - Reclaim: drain each group's replicated GC queue (deleted streams'
//     prefixes, chunks retired by retention or replaced by compaction,
//     sealed index pages with everything they index), deleting the
//     objects and then acknowledging the entries, never before their
//     not_before time.
//   - Compact: merge runs of small adjacent chunks of a stream into one
//     chunk, upload it, and commit the swap through the node; the replaced
//     chunks enter the GC queue with a grace period, so reads planned
//     before the swap still complete. A swap the state machine refuses
//     (the index changed meanwhile) deletes the new chunk again.
//   - Sweep: delete objects no state references (a flush or external
//     payload whose proposal failed, a compaction whose swap was lost) once
//     they are older than OrphanAge, so that an upload whose command is
//     still in flight is never taken for an orphan.
//
// A backup may hold a group's cold GC (HoldColdGC) while it copies the
// objects an export references, or a restore while it copies objects that
// nothing references until its import: the node then hands out none of
// that group's queue (GetGCQueueResponse.held) and answers the sweep's
// calls COLD_GC_HELD while any group is held. The worker skips such a
// group or sweep quietly (coldgc_held_skips counts them), not as an error.
//
// Metrics (metrics.go): one table describes the worker's counters for
// both exports: its own source (MetricsSource, ursula_coldgc_*_total in
// the coldgc target) and the all-in-one node's document (AddMetrics,
// DocumentMetrics: coldgc_*). In the coldgc target, MetricsPlane serves
// them read-only on server.metrics_listen with the worker's readiness.
package coldgc
