package multiraft

import (
	"go.opentelemetry.io/otel/metric"

	"github.com/ursula/ursula/services/platform/telemetry"
)

// latencies are the shard workers' latency histograms (the cumulative
// counters are in shardStats). They are made from the global meter
// provider when the host is, so a process records them once its telemetry
// is set up, and they cost nothing measurable when nothing reads them.
type latencies struct {
	// apply is the time one group takes to apply a Ready's committed
	// entries (recorded when there are some).
	apply metric.Float64Histogram
	// persist is the time a shard worker takes to write, and when the
	// batch needs it fsync, its journal for one Ready batch.
	persist metric.Float64Histogram
}

func newLatencies() latencies {
	m := telemetry.Meter("storage/multiraft")
	return latencies{
		apply:   telemetry.Latency(m, "ursula.raft.apply.duration", "Time a Raft group takes to apply the committed entries of one Ready."),
		persist: telemetry.Latency(m, "ursula.raft.persist.duration", "Time a shard worker takes to persist one Ready batch: the WAL write and, when the batch needs it, its fsync."),
	}
}
