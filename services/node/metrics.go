package node

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/ursula/ursula/services/platform/telemetry"
	"github.com/ursula/ursula/storage/cluster"
	"github.com/ursula/ursula/storage/cold"
	"github.com/ursula/ursula/storage/engine"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/wal"
)

// metrics are the node's counters; snapshot renders the JSON document
// served at /__ursula/metrics.
type metrics struct {
	appends      atomic.Uint64
	appendErrors atomic.Uint64
	appendBytes  atomic.Uint64
	reads        atomic.Uint64
	// readsImmediate counts the reads that do not wait (readNs times
	// them).
	readsImmediate   atomic.Uint64
	subscribers      atomic.Int64
	liveReadsWaiting atomic.Int64
	// Cumulative time in Append and in reads that do not wait, and the
	// live-subscription (SSE upstream) counters.
	appendNs        atomic.Uint64
	readNs          atomic.Uint64
	subscriptions   atomic.Uint64
	subscribeChunks atomic.Uint64
	subscribeBytes  atomic.Uint64
	// Latency histograms of Append and of reads that do not wait
	// (newLatencies).
	appendDuration metric.Float64Histogram
	readDuration   metric.Float64Histogram
}

// newLatencies makes the node's latency histograms from the global meter
// provider (set up by the process's telemetry before the node is built).
func (m *metrics) newLatencies() {
	meter := telemetry.Meter("services/node")
	m.appendDuration = telemetry.Latency(meter, "ursula.node.append.duration", "Time this node takes to serve an Append call (replicated and applied).")
	m.readDuration = telemetry.Latency(meter, "ursula.node.read.duration", "Time this node takes to serve a Read call that does not wait for data.")
}

// gateState is a group's recovery_gate: "open", or the state of its gate.
func gateState(rs multiraft.GroupStatus, gates map[uint32]cluster.GateState) string {
	if st, ok := gates[rs.GroupID]; ok {
		return string(st)
	}
	return "open"
}

// replicaFields adds, to a group's entry under raft_groups, the replica's
// state under the names the seed's recovery runbooks read (the names above
// stay for the dashboards that read them). In etcd Raft a membership takes
// effect when its entry applies, so the voter sets a cut to the committed
// entry keeps (committed_voter_configs) are those in force
// (voter_configs). Fields a replica does not know are null.
func replicaFields(gm map[string]any, nodeID uint64, rs multiraft.GroupStatus, leadsLive bool) {
	configs := []any{ids(rs.Voters)}
	if len(rs.VotersOutgoing) > 0 {
		configs = append(configs, ids(rs.VotersOutgoing))
	}
	nullIfZero := func(v uint64) any {
		if v == 0 {
			return nil
		}
		return float64(v)
	}
	gm["node_id"] = float64(nodeID)
	gm["current_term"] = float64(rs.Term)
	gm["last_log_term"] = nullIfZero(rs.LastTerm)
	gm["last_log_index"] = nullIfZero(rs.LastIndex)
	gm["committed_index"] = nullIfZero(rs.Commit)
	gm["committed_term"] = nullIfZero(rs.CommitTerm)
	gm["committed_node"] = nullIfZero(rs.CommitNode)
	gm["last_applied_index"] = float64(rs.Applied)
	gm["voted_for"] = nullIfZero(rs.Vote)
	gm["leads_live"] = leadsLive
	gm["voter_configs"] = configs
	gm["committed_voter_configs"] = configs
	gm["maintenance"] = map[string]any{"running": true}
	gm["recovery"] = nil
	if p := rs.Recovery; p != nil {
		gm["recovery"] = map[string]any{"leader": float64(p.Leader), "leader_term": float64(p.Term), "point": float64(p.Point),
			"cut": p.Cut, "role": string(p.Role), "taken_at": p.TakenAt.UTC().Format(time.RFC3339Nano), "leader_lost": p.LeaderLost}
	}
	if _, ok := gm["history"]; !ok {
		gm["history"] = nil
	}
}

// ids renders node ids as a JSON array.
func ids(v []uint64) []any {
	out := make([]any, 0, len(v))
	for _, id := range v {
		out = append(out, float64(id))
	}
	return out
}

func (m *metrics) snapshot(ctx context.Context, n *engine.Node, clusterID, incarnation string) map[string]any {
	nodeID := n.Config().NodeID
	views := n.Groups()
	gates := n.Cluster.GateStates()
	groups := make([]any, 0, len(views))
	var hot, coldBytes int64
	var streams int
	var gcPending uint64
	leaders := 0
	issues := []any{}
	for g, v := range views {
		hot += v.HotBytes
		coldBytes += v.ColdBytes
		streams += v.Streams
		gcPending += v.GCPending
		rs := v.Status
		if rs.IsLeader {
			leaders++
		}
		voters, learners := ids(rs.Voters), ids(rs.Learners)
		gm := map[string]any{
			"raft_group_id":  float64(g),
			"leader_id":      float64(rs.LeaderID),
			"term":           float64(rs.Term),
			"commit_index":   float64(rs.Commit),
			"applied_index":  float64(rs.Applied),
			"voters":         voters,
			"learners":       learners,
			"streams":        float64(v.Streams),
			"hot_bytes":      float64(v.HotBytes),
			"cold_bytes":     float64(v.ColdBytes),
			"gc_pending":     float64(v.GCPending),
			"last_log_index": float64(rs.LastIndex),
			"snapshot_index": float64(rs.SnapshotIndex),
			"is_leader":      rs.IsLeader,
			"recovery_gate":  gateState(rs, gates),
		}
		if h, ok := n.Engine.History(uint32(g)); ok {
			gm["history"] = map[string]any{"event_index": float64(h.EventIndex), "plan_term": float64(h.PlanTerm), "point": float64(h.Point),
				"reason": h.Reason, "at_ms": float64(h.AtMs), "streams": float64(h.Streams)}
		}
		replicaFields(gm, nodeID, rs, n.Cluster.LeadsLive(ctx, uint32(g)))
		if rs.LeaderID == 0 {
			issues = append(issues, map[string]any{"raft_group_id": float64(g), "issue": "leader_unknown"})
		}
		groups = append(groups, gm)
	}
	out := map[string]any{
		"cluster_id":                  clusterID,
		"process_incarnation":         incarnation,
		"append_requests":             float64(m.appends.Load()),
		"append_errors":               float64(m.appendErrors.Load()),
		"append_bytes":                float64(m.appendBytes.Load()),
		"read_requests":               float64(m.reads.Load()),
		"append_ns":                   float64(m.appendNs.Load()),
		"read_ns":                     float64(m.readNs.Load()),
		"read_requests_immediate":     float64(m.readsImmediate.Load()),
		"sse_subscriptions_total":     float64(m.subscriptions.Load()),
		"sse_chunks_sent":             float64(m.subscribeChunks.Load()),
		"sse_bytes_sent":              float64(m.subscribeBytes.Load()),
		"sse_subscribers":             float64(m.subscribers.Load()),
		"live_read_waiters":           float64(m.liveReadsWaiting.Load()),
		"streams":                     float64(streams),
		"ttl_expiry_sweeps":           float64(n.Engine.TTLExpirySweeps()),
		"ttl_expiry_sweep_due_groups": float64(n.Engine.TTLExpirySweepDueGroups()),
		"hot_bytes_awaiting_flush":    float64(hot),
		"cold_bytes":                  float64(coldBytes),
		"raft_group_count":            float64(len(groups)),
		"raft_groups_led":             float64(leaders),
		"raft_groups":                 groups,
		// The seed's raft_maintenance: groups this replica cannot serve.
		"raft_maintenance":        map[string]any{"group_issues": issues},
		"peer_cluster_mismatches": []any{},
	}
	coldMetrics(n.Cold, gcPending, out)
	shardMetrics(n.Cluster.ShardStats(), out)
	erasureMetrics(n.Cluster.Erasure(), out)
	return out
}

// erasureMetrics adds the deleted-data gauges: what each group still
// holds of removed streams, and how old the oldest removal is.
func erasureMetrics(st multiraft.ErasureStats, out map[string]any) {
	groups := make([]any, 0, len(st.Groups))
	for _, d := range st.Groups {
		groups = append(groups, map[string]any{
			"raft_group_id": float64(d.Group), "state": d.State, "bytes": float64(d.Bytes),
			"age_ms": float64(d.AgeMs), "purge_index": float64(d.PurgeIndex),
		})
	}
	out["deleted_data"] = groups
	out["raft_deleted_data_oldest_age_ms"] = float64(st.OldestAgeMs)
	out["raft_deleted_data_overdue_groups"] = float64(st.OverdueGroups)
	out["raft_deleted_data_max_age_ms"] = float64(0) // not enforced
	if st.Enforced {
		out["raft_deleted_data_max_age_ms"] = float64(st.MaxAge.Milliseconds())
	}
	out["wal_lagging_groups"] = float64(st.LaggingGroups)
	out["snapshot_driver_passes"] = float64(st.DriverPasses)
}

// shardMetrics adds each shard worker's mailbox depth, counters and
// cumulative *_ns timings (its WAL's included) under "shards", and their
// sums at the top level.
func shardMetrics(stats []multiraft.ShardStats, out map[string]any) {
	var sum struct {
		proposals, batches, applied, applyNs, persistNs, snaps, snapBytes, snapNs, captureNs uint64
		reads, readRounds                                                                    uint64
		mailbox                                                                              int
		wal                                                                                  wal.Stats
	}
	var shards []any
	for _, st := range stats {
		raw, err := json.Marshal(st)
		if err != nil {
			continue
		}
		var m map[string]any
		if json.Unmarshal(raw, &m) == nil {
			shards = append(shards, m)
		}
		sum.mailbox += st.MailboxDepth
		sum.proposals += st.Proposals
		sum.batches += st.ReadyBatches
		sum.applied += st.AppliedEntries
		sum.applyNs += st.ApplyNs
		sum.persistNs += st.PersistNs
		sum.snaps += st.Snapshots
		sum.snapBytes += st.SnapshotBytes
		sum.snapNs += st.SnapshotNs
		sum.captureNs += st.SnapshotCaptureNs
		sum.reads += st.ReadIndexReads
		sum.readRounds += st.ReadIndexRounds
		w := st.WAL
		sum.wal.Writes += w.Writes
		sum.wal.BytesWritten += w.BytesWritten
		sum.wal.Fsyncs += w.Fsyncs
		sum.wal.WriteNs += w.WriteNs
		sum.wal.FsyncNs += w.FsyncNs
		sum.wal.SegmentsMade += w.SegmentsMade
		sum.wal.SegmentsFreed += w.SegmentsFreed
		sum.wal.Segments += w.Segments
		sum.wal.DirtySegments += w.DirtySegments
		sum.wal.RewrittenBytes += w.RewrittenBytes
	}
	out["shards"] = shards
	for k, v := range map[string]uint64{
		"mailbox_depth":            uint64(sum.mailbox),
		"raft_proposals":           sum.proposals,
		"raft_ready_batches":       sum.batches,
		"raft_applied_entries":     sum.applied,
		"raft_apply_ns":            sum.applyNs,
		"raft_persist_ns":          sum.persistNs,
		"raft_snapshots":           sum.snaps,
		"raft_snapshot_bytes":      sum.snapBytes,
		"raft_snapshot_ns":         sum.snapNs,
		"raft_snapshot_capture_ns": sum.captureNs,
		"raft_read_index_reads":    sum.reads,
		"raft_read_index_rounds":   sum.readRounds,
		"wal_writes":               sum.wal.Writes,
		"wal_bytes_written":        sum.wal.BytesWritten,
		"wal_fsyncs":               sum.wal.Fsyncs,
		"wal_write_ns":             sum.wal.WriteNs,
		"wal_fsync_ns":             sum.wal.FsyncNs,
		"wal_segments":             sum.wal.Segments,
		"wal_segments_started":     sum.wal.SegmentsMade,
		"wal_segments_reclaimed":   sum.wal.SegmentsFreed,
		"wal_dirty_segments":       sum.wal.DirtySegments,
		"wal_rewritten_bytes":      sum.wal.RewrittenBytes,
	} {
		out[k] = float64(v)
	}
}

// coldMetrics adds the cold tier's counters: flushes and uploads, their
// errors, cold-write backpressure, cold reads and the GC queue.
func coldMetrics(t *cold.Tier, pending uint64, out map[string]any) {
	if !t.Enabled() {
		return
	}
	cs := t.Stats()
	cache := t.CacheStats()
	for k, v := range map[string]uint64{
		"cold_flushes":                 cs.Flushes.Load(),
		"cold_flush_rejected":          cs.FlushRejected.Load(),
		"cold_uploads":                 cs.Uploads.Load(),
		"cold_upload_bytes":            cs.UploadBytes.Load(),
		"cold_upload_errors":           cs.UploadErrors.Load(),
		"cold_external_payloads":       cs.ExternalPayloads.Load(),
		"cold_read_errors":             cs.ReadErrors.Load(),
		"cold_corrupt_reads":           cs.CorruptReads.Load(),
		"cold_cache_checksum_failures": cache.ChecksumFailures,
		"cold_backpressure_writes":     cs.BackpressureWrites.Load(),
		"cold_admit_waits":             cs.AdmitWaits.Load(),
		"cold_sealed_pages":            cs.SealedPages.Load(),
		"cold_compactions":             cs.Compactions.Load(),
		"cold_gc_acked_entries":        cs.GCAcked.Load(),
		"cold_gc_pending_entries":      pending,
		"cold_cache_hits":              cache.Hits,
		"cold_cache_misses":            cache.Misses,
		"cold_cache_fetch_errors":      cache.FetchErrors,
		"cold_cache_bytes":             uint64(cache.Bytes),
		"cold_hot_cap_bytes_per_group": t.Config().HotCapBytes,
		"cold_hot_cap_bytes_per_node":  t.Config().NodeHotCapBytes,
	} {
		out[k] = float64(v)
	}
}
