package node

import (
	"maps"
	"net/http"
	"strconv"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc/filters"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc/stats"

	"github.com/ursula/ursula/services/coldgc"
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
// and the Prometheus endpoint show the same counters as the JSON document,
// and adds raft_group_leader_info: 1 per group, with the leader's node id
// as a label (a group without a known leader has none).
func (s *Server) MetricsSource() telemetry.Source {
	return func(emit func(telemetry.Sample)) {
		doc := s.metricsSnapshot()
		nodeDocument.Emit(doc, emit)
		groups, _ := doc["raft_groups"].([]any)
		for _, g := range groups {
			gm, _ := g.(map[string]any)
			id, _ := gm["raft_group_id"].(float64)
			leader, _ := gm["leader_id"].(float64)
			if leader == 0 {
				continue
			}
			emit(telemetry.Sample{Name: "raft_group_leader_info", Unit: "{state}", Help: "1 per group, with the node id of the group's leader as this replica knows it.",
				Value: 1, Attrs: []attribute.KeyValue{
					attribute.String("raft_group_id", strconv.FormatUint(uint64(id), 10)),
					attribute.String("leader_node_id", strconv.FormatUint(uint64(leader), 10)),
				}})
		}
	}
}

// RaftMetricsSource and WALMetricsSource are the instruments the seed's
// runbooks name outside the node's document: ursula.raft.recovery_gates
// (by status: closed, stalled) and ursula.wal.recovering (1 after a start
// that found no clean shutdown).
func (s *Server) RaftMetricsSource() telemetry.Source {
	return func(emit func(telemetry.Sample)) {
		closed, stalled := s.gateLists()
		const help = "Raft groups whose recovery gate is closed, by status (closed, stalled)."
		emit(telemetry.Sample{Name: "recovery_gates", Unit: "{group}", Help: help, Value: float64(len(closed)), Attrs: []attribute.KeyValue{attribute.String("status", "closed")}})
		emit(telemetry.Sample{Name: "recovery_gates", Unit: "{group}", Help: help, Value: float64(len(stalled)), Attrs: []attribute.KeyValue{attribute.String("status", "stalled")}})
	}
}

// WALMetricsSource: see RaftMetricsSource.
func (s *Server) WALMetricsSource() telemetry.Source {
	return func(emit func(telemetry.Sample)) {
		v := 0.0
		if s.n.WALRecovery() {
			v = 1
		}
		emit(telemetry.Sample{Name: "recovering", Unit: "{state}", Help: "1 if this start found no clean shutdown and recovered the WAL.", Value: v})
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
	Metrics: nodeMetrics,
}

// Shorthands for nodeMetrics.
func counter(unit, help string) telemetry.Metric {
	return telemetry.Metric{Kind: telemetry.Counter, Unit: unit, Help: help}
}

func gauge(unit, help string) telemetry.Metric {
	return telemetry.Metric{Kind: telemetry.Gauge, Unit: unit, Help: help}
}

// nanos exports a cumulative count of nanoseconds as a counter of
// seconds named name (Prometheus: <name>_seconds_total).
func nanos(name, help string) telemetry.Metric {
	return telemetry.Metric{Name: name, Kind: telemetry.Counter, Unit: "s", Scale: 1e-9, Help: help}
}

// millis exports a gauge of milliseconds as seconds named name.
func millis(name, help string) telemetry.Metric {
	return telemetry.Metric{Name: name, Kind: telemetry.Gauge, Unit: "s", Scale: 1e-3, Help: help}
}

// omit keeps a document value out of the instruments: node ids (an
// identity is a label, never a value: the leader is raft_group_leader_info),
// duplicates kept in the document for the runbooks, and the last recovery
// event's details.
var omit = telemetry.Metric{Omit: true}

// nodeMetrics gives every numeric value of the node's metrics document its
// instrument (see telemetry.Document): conventional names, base units
// (seconds, bytes), counters for what only grows. A test holds it against
// a live document (TestNodeMetricsDescribed). The values of the
// all-in-one process's cold-GC worker (coldgc_*, Deps.ExtraMetrics) are
// described next to the worker (coldgc.DocumentMetrics), which its own
// target exports too.
var nodeMetrics = withMetrics(coldgc.DocumentMetrics(), map[string]telemetry.Metric{
	// requests
	"append_requests":             counter("{request}", "Append calls served by this node."),
	"append_errors":               counter("{request}", "Append calls that failed."),
	"append_bytes":                counter("By", "Bytes appended by successful Append calls."),
	"append_ns":                   nanos("append_time", "Time spent in Append calls."),
	"read_requests":               counter("{request}", "Read calls served by this node."),
	"read_requests_immediate":     counter("{request}", "Read calls served by this node that did not wait at the tail (the ones the read latency covers)."),
	"cold_bytes":                  gauge("By", "Stream bytes in the cold tier, summed over the groups this node holds."),
	"read_ns":                     nanos("read_time", "Time spent in Read calls that do not wait for data."),
	"sse_subscriptions_total":     counter("{subscription}", "Live subscriptions (SSE upstream) opened."),
	"sse_chunks_sent":             counter("{chunk}", "Chunks sent to live subscriptions."),
	"sse_bytes_sent":              counter("By", "Bytes sent to live subscriptions."),
	"sse_subscribers":             gauge("{subscription}", "Live subscriptions open now."),
	"live_read_waiters":           gauge("{request}", "Reads waiting for data now (long polls)."),
	"streams":                     gauge("{stream}", "Streams in the groups this node holds."),
	"ttl_expiry_sweeps":           counter("{sweep}", "Sweeps for expired streams."),
	"ttl_expiry_sweep_due_groups": gauge("{group}", "Groups whose expiry sweep is due."),
	"hot_bytes_awaiting_flush":    gauge("By", "Hot-tier bytes not yet flushed to the cold tier."),
	"commit_stall_interventions":  counter("{intervention}", "Times a stalled commit was nudged."),
	"node_id":                     omit,
	// raft groups
	"raft_group_count":                 telemetry.Metric{Name: "raft_groups", Kind: telemetry.Gauge, Unit: "{group}", Help: "Raft groups this node holds a replica of."},
	"raft_groups_led":                  gauge("{group}", "Raft groups this node leads."),
	"raft_group_leader_id":             omit,
	"raft_group_node_id":               omit,
	"raft_group_voted_for":             omit,
	"raft_group_committed_node":        omit,
	"raft_group_committed_index":       omit, // = commit_index
	"raft_group_committed_term":        omit,
	"raft_group_current_term":          omit, // = term
	"raft_group_last_applied_index":    omit, // = applied_index
	"raft_group_maintenance_running":   omit, // always 1
	"raft_group_term":                  gauge("{term}", "The group's Raft term as this replica knows it."),
	"raft_group_commit_index":          gauge("{index}", "The group's commit index as this replica knows it."),
	"raft_group_applied_index":         gauge("{index}", "The last index this replica applied."),
	"raft_group_last_log_index":        gauge("{index}", "The last index in this replica's log."),
	"raft_group_last_log_term":         gauge("{term}", "The term of the last entry in this replica's log."),
	"raft_group_snapshot_index":        gauge("{index}", "The index of this replica's latest snapshot."),
	"raft_group_streams":               gauge("{stream}", "Streams in the group."),
	"raft_group_hot_bytes":             gauge("By", "Hot-tier bytes of the group."),
	"raft_group_cold_bytes":            gauge("By", "Stream bytes of the group in the cold tier."),
	"raft_group_gc_pending":            gauge("{entry}", "Cold-tier entries of the group awaiting garbage collection."),
	"raft_group_is_leader":             gauge("{state}", "1 if this node leads the group."),
	"raft_group_leads_live":            gauge("{state}", "1 if this node leads the group and a quorum confirms it."),
	"raft_group_history_event_index":   omit,
	"raft_group_history_plan_term":     omit,
	"raft_group_history_point":         omit,
	"raft_group_history_at_ms":         omit,
	"raft_group_history_streams":       omit,
	"raft_group_recovery_leader":       omit,
	"raft_group_recovery_leader_term":  omit,
	"raft_group_recovery_point":        omit,
	"raft_group_recovery_leader_lost":  omit,
	"recovery_gates_closed":            omit, // ursula.raft.recovery_gates{status}
	"recovery_gates_stalled":           omit,
	"raft_deleted_data_oldest_age_ms":  millis("raft_deleted_data_oldest_age", "Age of the oldest removed stream whose data is not yet purged."),
	"raft_deleted_data_max_age_ms":     millis("raft_deleted_data_max_age", "raft.deleted_data_max_age (0: not enforced)."),
	"raft_deleted_data_overdue_groups": gauge("{group}", "Groups holding removed data older than raft.deleted_data_max_age."),
	"deleted_data_bytes":               gauge("By", "Bytes the group still holds of removed streams."),
	"deleted_data_age_ms":              millis("deleted_data_age", "Age of the group's oldest removal not yet purged."),
	"deleted_data_purge_index":         gauge("{index}", "The index up to which the group's removed data is purged."),
	"wal_lagging_groups":               gauge("{group}", "Groups whose WAL lags behind their snapshots."),
	"snapshot_driver_passes":           counter("{pass}", "Passes of the snapshot driver."),
	"feature_level":                    gauge("{level}", "The lowest feature level of the groups this node holds."),
	"feature_level_max_supported":      gauge("{level}", "The highest feature level this binary supports."),
	"feature_level_halted_groups":      gauge("{group}", "Groups halted at a feature level this binary does not support."),
	"wal_recovery":                     gauge("{state}", "1 if this start found no clean shutdown and replayed the WAL."),
	// shard workers and journals, summed over shards
	"mailbox_depth":            gauge("{message}", "Messages waiting in the shard workers' mailboxes."),
	"raft_proposals":           counter("{proposal}", "Raft proposals."),
	"raft_ready_batches":       counter("{batch}", "Raft Ready batches handled."),
	"raft_applied_entries":     counter("{entry}", "Raft entries applied."),
	"raft_apply_ns":            nanos("raft_apply_time", "Time spent applying committed entries."),
	"raft_persist_ns":          nanos("raft_persist_time", "Time spent persisting Raft state (WAL write and fsync)."),
	"raft_snapshots":           counter("{snapshot}", "Raft snapshots taken."),
	"raft_snapshot_bytes":      counter("By", "Bytes of Raft snapshots taken."),
	"raft_snapshot_ns":         nanos("raft_snapshot_time", "Time spent taking Raft snapshots."),
	"raft_snapshot_capture_ns": nanos("raft_snapshot_capture_time", "Time the shard workers spent capturing snapshot state."),
	"raft_read_index_reads":    counter("{read}", "Linearizable reads served through ReadIndex."),
	"raft_read_index_rounds":   counter("{round}", "ReadIndex rounds (one serves many reads)."),
	"wal_writes":               counter("{write}", "WAL write calls."),
	"wal_bytes_written":        counter("By", "Bytes written to the WAL."),
	"wal_fsyncs":               counter("{fsync}", "WAL fsync calls."),
	"wal_write_ns":             nanos("wal_write_time", "Time spent in WAL write calls."),
	"wal_fsync_ns":             nanos("wal_fsync_time", "Time spent in WAL fsync calls."),
	"wal_segments":             gauge("{segment}", "WAL segment files."),
	"wal_segments_started":     counter("{segment}", "WAL segments started."),
	"wal_segments_reclaimed":   counter("{segment}", "WAL segments deleted after snapshots."),
	"wal_dirty_segments":       gauge("{segment}", "WAL segments holding entries not yet covered by snapshots."),
	"wal_rewritten_bytes":      counter("By", "Bytes rewritten to free old WAL segments."),
	// per shard
	"shard_groups":                 gauge("{group}", "Raft groups of the shard worker."),
	"shard_mailbox_depth":          gauge("{message}", "Messages waiting in the shard worker's mailbox."),
	"shard_proposals":              counter("{proposal}", "Raft proposals of the shard worker."),
	"shard_ready_batches":          counter("{batch}", "Raft Ready batches the shard worker handled."),
	"shard_applied_entries":        counter("{entry}", "Raft entries the shard worker applied."),
	"shard_apply_ns":               nanos("shard_apply_time", "Time the shard worker spent applying entries."),
	"shard_persist_ns":             nanos("shard_persist_time", "Time the shard worker spent persisting Raft state."),
	"shard_snapshots":              counter("{snapshot}", "Raft snapshots the shard worker took."),
	"shard_snapshot_bytes":         counter("By", "Bytes of the shard worker's snapshots."),
	"shard_snapshot_ns":            nanos("shard_snapshot_time", "Time the shard worker spent taking snapshots."),
	"shard_snapshot_capture_ns":    nanos("shard_snapshot_capture_time", "Time the shard worker spent capturing snapshot state."),
	"shard_read_index_reads":       counter("{read}", "Linearizable reads the shard worker served through ReadIndex."),
	"shard_read_index_rounds":      counter("{round}", "ReadIndex rounds of the shard worker."),
	"shard_wal_writes":             counter("{write}", "Write calls of the shard's WAL."),
	"shard_wal_bytes_written":      counter("By", "Bytes written to the shard's WAL."),
	"shard_wal_fsyncs":             counter("{fsync}", "Fsync calls of the shard's WAL."),
	"shard_wal_write_ns":           nanos("shard_wal_write_time", "Time spent in the shard's WAL write calls."),
	"shard_wal_fsync_ns":           nanos("shard_wal_fsync_time", "Time spent in the shard's WAL fsync calls."),
	"shard_wal_segments":           gauge("{segment}", "Segment files of the shard's WAL."),
	"shard_wal_segments_started":   counter("{segment}", "Segments the shard's WAL started."),
	"shard_wal_segments_reclaimed": counter("{segment}", "Segments of the shard's WAL deleted after snapshots."),
	"shard_wal_dirty_segments":     gauge("{segment}", "Segments of the shard's WAL not yet covered by snapshots."),
	"shard_wal_rewritten_bytes":    counter("By", "Bytes rewritten to free old segments of the shard's WAL."),
	"cold_flushes":                 counter("{flush}", "Flushes from the hot tier to the cold tier."),
	"cold_flush_rejected":          counter("{flush}", "Flushes refused."),
	"cold_uploads":                 counter("{object}", "Objects uploaded to the cold store."),
	"cold_upload_bytes":            counter("By", "Bytes uploaded to the cold store."),
	"cold_upload_errors":           counter("{error}", "Failed uploads to the cold store."),
	"cold_external_payloads":       counter("{payload}", "Payloads stored outside the Raft log."),
	"cold_read_errors":             counter("{error}", "Failed reads from the cold store."),
	"cold_corrupt_reads":           counter("{read}", "Cold reads that found a corrupt object."),
	"cold_cache_checksum_failures": counter("{read}", "Cold cache reads that failed their checksum."),
	"cold_backpressure_writes":     counter("{write}", "Writes refused because the hot tier was full."),
	"cold_admit_waits":             counter("{write}", "Writes that waited for cold flushes to make room under the node's hot cap."),
	"cold_sealed_pages":            counter("{page}", "Cold pages sealed."),
	"cold_compactions":             counter("{compaction}", "Cold object compactions."),
	"cold_gc_acked_entries":        counter("{entry}", "Cold-tier entries whose garbage collection was acknowledged."),
	"cold_gc_pending_entries":      gauge("{entry}", "Cold-tier entries awaiting garbage collection."),
	"cold_cache_hits":              counter("{read}", "Cold cache hits."),
	"cold_cache_misses":            counter("{read}", "Cold cache misses."),
	"cold_cache_fetch_errors":      counter("{error}", "Failed fetches into the cold cache."),
	"cold_cache_bytes":             gauge("By", "Bytes in the cold cache."),
	"cold_hot_cap_bytes_per_group": gauge("By", "The hot tier's cap per group."),
	"cold_hot_cap_bytes_per_node":  gauge("By", "The hot tier's cap per node, all groups together."),
	// the cluster transport
	"raft_grpc_peer_cluster_refusals":         counter("{connection}", "Peers refused for belonging to another cluster."),
	"raft_grpc_unidentified_peer_refusals":    counter("{connection}", "Peers refused for not saying which node they are."),
	"raft_grpc_protocol_refusals_received":    counter("{connection}", "Refusals received from peers."),
	"raft_grpc_unauthenticated_peer_refusals": counter("{connection}", "Peers refused for failing authentication."),
	"raft_grpc_tls_handshake_refusals":        counter("{connection}", "Failed TLS handshakes on the cluster plane."),
	"raft_messages_sent":                      counter("{message}", "Raft messages sent."),
	"raft_batches_sent":                       counter("{batch}", "Raft message batches sent."),
	"raft_bytes_sent":                         counter("By", "Bytes of Raft messages sent."),
	"raft_messages_received":                  counter("{message}", "Raft messages received."),
	"raft_batches_received":                   counter("{batch}", "Raft message batches received."),
	"raft_bytes_received":                     counter("By", "Bytes of Raft messages received."),
	"raft_messages_dropped":                   counter("{message}", "Raft messages dropped."),
	"raft_bad_messages_received":              counter("{message}", "Malformed Raft messages received."),
	"raft_step_errors":                        counter("{message}", "Raft messages a group refused."),
	"raft_snapshots_sent":                     counter("{snapshot}", "Raft snapshots sent."),
	"raft_snapshots_failed":                   counter("{snapshot}", "Raft snapshots that failed to send."),
	"raft_snapshots_received":                 counter("{snapshot}", "Raft snapshots received."),
	"raft_snapshot_bytes_sent":                counter("By", "Bytes of Raft snapshots sent."),
	"raft_snapshot_bytes_received":            counter("By", "Bytes of Raft snapshots received."),
	"raft_peer_connected":                     gauge("{state}", "1 if the link to the peer is up."),
	"raft_peer_refused":                       gauge("{state}", "1 if the peer refused this node."),
	"raft_peer_queued":                        gauge("{message}", "Messages queued for the peer."),
	"raft_peer_snapshots_in_flight":           gauge("{snapshot}", "Snapshots being sent to the peer."),
	// the planes' authentication
	"client_auth_refusals":               counter("{request}", "Client plane calls refused for their credentials."),
	"client_tls_handshake_refusals":      counter("{connection}", "Failed TLS handshakes on the client plane."),
	"admin_auth_refusals":                counter("{request}", "Admin plane requests refused for their credentials."),
	"client_connections":                 gauge("{connection}", "Client plane connections held now (at most server.max_connections)."),
	"client_connections_refused":         counter("{connection}", "Client plane connections closed on accept because server.max_connections were held."),
	"admin_connections":                  gauge("{connection}", "Admin plane connections held now (at most server.max_connections)."),
	"admin_connections_refused":          counter("{connection}", "Admin plane connections closed on accept because server.max_connections were held."),
	"metrics_connections":                gauge("{connection}", "Metrics plane connections held now (at most server.max_connections)."),
	"metrics_connections_refused":        counter("{connection}", "Metrics plane connections closed on accept because server.max_connections were held."),
	"cluster_connections":                gauge("{connection}", "Cluster plane connections held now (at most server.max_connections)."),
	"cluster_connections_refused":        counter("{connection}", "Cluster plane connections closed on accept because server.max_connections were held."),
	"max_connections_per_plane":          gauge("{connection}", "server.max_connections: the most connections each plane holds."),
	"cluster_tls_cert_not_after_seconds": gauge("s", "When the cluster plane's certificate expires (Unix time; 0 without TLS)."),
	"client_tls_cert_not_after_seconds":  gauge("s", "When the client plane's certificate expires (Unix time; 0 without TLS)."),
	"admin_tls_cert_not_after_seconds":   gauge("s", "When the admin plane's certificate expires (Unix time; 0 without TLS)."),
})

// withMetrics adds the descriptions of more to m and returns it.
func withMetrics(more, m map[string]telemetry.Metric) map[string]telemetry.Metric {
	maps.Copy(m, more)
	return m
}
