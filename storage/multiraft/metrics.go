package multiraft

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// latencyBuckets are the bucket boundaries, in seconds, of the shard
// workers' histograms: those of every latency histogram of the process
// (services/platform/telemetry.LatencyBuckets, which storage does not
// import).
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// latencies are the shard workers' latency histograms (the cumulative
// counters are in shardStats). They are made from the global meter
// provider when the host is, so a process records them once its telemetry
// is set up; recording allocates nothing.
type latencies struct {
	// apply is the time one group takes to apply a Ready's committed
	// entries (recorded when there are some).
	apply metric.Float64Histogram
	// persist is the time a shard worker takes to write, and when the
	// batch needs it fsync, its journal for one Ready batch.
	persist metric.Float64Histogram
}

func newLatencies() latencies {
	m := otel.Meter("github.com/ursula/ursula/storage/multiraft")
	return latencies{
		apply:   latency(m, "ursula.raft.apply.duration", "Time a Raft group takes to apply the committed entries of one Ready."),
		persist: latency(m, "ursula.raft.persist.duration", "Time a shard worker takes to persist one Ready batch: the WAL write and, when the batch needs it, its fsync."),
	}
}

// latency makes a histogram of seconds; one the SDK refuses records
// nothing (the SDK reports why through otel.Handle).
func latency(m metric.Meter, name, help string) metric.Float64Histogram {
	h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(help), metric.WithExplicitBucketBoundaries(latencyBuckets...))
	if err != nil || h == nil {
		return noop.Float64Histogram{}
	}
	return h
}
