package node

import (
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/stats"

	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/telemetry"
)

// serverStatsHandler traces the client plane's RPCs (a server span per
// call, child of the caller's span carried in the gRPC metadata). The
// gateway's once-a-second cluster-info poll is not traced.
func serverStatsHandler() stats.Handler {
	return otelgrpc.NewServerHandler(otelgrpc.WithFilter(filters.Not(filters.MethodName("GetClusterInfo"))))
}

// clientStatsHandler traces the in-process callers' side (Conn) as the
// gateway's router traces its calls over the network: a client span per
// call, whose context the server span continues.
func clientStatsHandler() stats.Handler {
	return otelgrpc.NewClientHandler(otelgrpc.WithFilter(filters.Not(filters.MethodName("GetClusterInfo"))))
}

// MetricsSource reads the metrics document of /__ursula/metrics as
// telemetry samples (see nodeDocument), so the OpenTelemetry instruments
// and the Prometheus endpoint show the same counters as the JSON document.
func (s *Server) MetricsSource() telemetry.Source {
	return func(emit func(telemetry.Sample)) {
		nodeDocument.Emit(s.metricsSnapshot(), emit)
	}
}

// RaftMetricsSource and WALMetricsSource are the instruments the seed's
// runbooks name outside the node's document: ursula.raft.recovery_gates
// (by status: closed, stalled) and ursula.wal.recovering (1 after a start
// that found no clean shutdown).
func (s *Server) RaftMetricsSource() telemetry.Source {
	return func(emit func(telemetry.Sample)) {
		closed, stalled := s.gateLists()
		emit(telemetry.Sample{Name: "recovery_gates", Value: float64(len(closed)), Attrs: []attribute.KeyValue{attribute.String("status", "closed")}})
		emit(telemetry.Sample{Name: "recovery_gates", Value: float64(len(stalled)), Attrs: []attribute.KeyValue{attribute.String("status", "stalled")}})
	}
}

// WALMetricsSource: see RaftMetricsSource.
func (s *Server) WALMetricsSource() telemetry.Source {
	return func(emit func(telemetry.Sample)) {
		v := 0.0
		if s.n.WALRecovery() {
			v = 1
		}
		emit(telemetry.Sample{Name: "recovering", Value: v})
	}
}

func (s *Server) servePrometheus(w http.ResponseWriter, r *http.Request) {
	if s.deps.Prometheus == nil {
		writeAdminError(w, errcode.New(errcode.NotFound, "no Prometheus exporter: telemetry has none configured"))
		return
	}
	s.deps.Prometheus.ServeHTTP(w, r)
}

// nodeDocument describes the metrics document: per-group values carry
// raft_group_id, per-shard values shard, per-peer values peer_node_id.
var nodeDocument = telemetry.Document{
	Lists: map[string]telemetry.List{
		"raft_groups":  {Prefix: "raft_group_", IDKey: "raft_group_id"},
		"shards":       {Prefix: "shard_", IDKey: "shard"},
		"raft_peers":   {Prefix: "raft_peer_", IDKey: "node_id", Attr: "peer_node_id"},
		"deleted_data": {Prefix: "deleted_data_", IDKey: "raft_group_id"},
	},
	Kind: nodeMetricKind,
}

// nodeCounters are the document's monotonic counts (besides *_total and
// cumulative *_ns timings); every other value is a gauge.
var nodeCounters = map[string]bool{
	"append_requests": true, "append_errors": true, "append_bytes": true, "read_requests": true,
	"sse_chunks_sent": true, "sse_bytes_sent": true, "commit_stall_interventions": true,
	// cold tier
	"cold_flushes": true, "cold_flush_rejected": true, "cold_uploads": true, "cold_upload_bytes": true,
	"cold_upload_errors": true, "cold_external_payloads": true, "cold_read_errors": true,
	"cold_backpressure_writes": true, "cold_sealed_pages": true, "cold_compactions": true,
	"cold_gc_acked_entries": true, "cold_cache_hits": true, "cold_cache_misses": true,
	"cold_cache_fetch_errors": true, "cold_corrupt_reads": true, "cold_cache_checksum_failures": true,
	// shard workers and journals, summed and per shard
	"raft_proposals": true, "raft_ready_batches": true, "raft_applied_entries": true,
	"raft_snapshots": true, "raft_snapshot_bytes": true, "wal_writes": true, "wal_bytes_written": true,
	"raft_read_index_reads": true, "raft_read_index_rounds": true,
	"shard_read_index_reads": true, "shard_read_index_rounds": true,
	"wal_fsyncs": true, "wal_segments_started": true, "wal_segments_reclaimed": true, "wal_rewritten_bytes": true, "snapshot_driver_passes": true,
	"shard_proposals": true, "shard_ready_batches": true, "shard_applied_entries": true,
	"shard_snapshots": true, "shard_snapshot_bytes": true, "shard_wal_writes": true,
	"shard_wal_bytes_written": true, "shard_wal_fsyncs": true, "shard_wal_segments_made": true,
	"shard_wal_segments_freed": true, "shard_wal_rewritten_bytes": true,
	// the cold-GC worker in the all-in-one process
	"coldgc_passes": true, "coldgc_reclaimed_entries": true, "coldgc_deleted_objects": true,
	"coldgc_errors": true, "coldgc_compactions": true, "coldgc_compaction_rejected": true,
	"coldgc_orphans_deleted": true, "coldgc_sweeps": true, "coldgc_corrupt_objects": true,
	// the cluster transport
	"raft_grpc_peer_cluster_refusals": true, "raft_grpc_unidentified_peer_refusals": true,
	"raft_grpc_protocol_refusals_received": true, "raft_messages_sent": true, "raft_batches_sent": true,
	"raft_bytes_sent": true, "raft_messages_received": true, "raft_batches_received": true,
	"raft_bytes_received": true, "raft_messages_dropped": true, "raft_bad_messages_received": true,
	"raft_step_errors": true, "raft_snapshots_sent": true, "raft_snapshots_failed": true,
	"raft_snapshots_received": true, "raft_snapshot_bytes_sent": true, "raft_snapshot_bytes_received": true,
	// the planes' authentication
	"raft_grpc_unauthenticated_peer_refusals": true, "raft_grpc_tls_handshake_refusals": true,
	"client_auth_refusals": true, "client_tls_handshake_refusals": true, "admin_auth_refusals": true,
}

func nodeMetricKind(name string) telemetry.Kind {
	if nodeCounters[name] || strings.HasSuffix(name, "_total") || strings.HasSuffix(name, "_ns") {
		return telemetry.Counter
	}
	return telemetry.Gauge
}
