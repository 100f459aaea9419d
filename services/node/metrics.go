package node

import (
	"sync/atomic"

	"github.com/ursula/ursula/storage/engine"
)

// metrics are the node's counters; snapshot renders the JSON document
// served at /__ursula/metrics.
type metrics struct {
	appends          atomic.Uint64
	appendErrors     atomic.Uint64
	appendBytes      atomic.Uint64
	reads            atomic.Uint64
	subscribers      atomic.Int64
	liveReadsWaiting atomic.Int64
}

func (m *metrics) snapshot(eng *engine.Engine, clusterID, incarnation string) map[string]any {
	groups := make([]any, 0, len(eng.Machines()))
	var hot int64
	var streams int
	leaders := 0
	for g, mach := range eng.Machines() {
		st := mach.Stats()
		hot += st.HotBytes
		streams += st.Streams
		rs := eng.Host().Status(uint32(g))
		if rs.IsLeader {
			leaders++
		}
		voters := make([]any, 0, len(rs.Voters))
		for _, v := range rs.Voters {
			voters = append(voters, float64(v))
		}
		learners := make([]any, 0, len(rs.Learners))
		for _, v := range rs.Learners {
			learners = append(learners, float64(v))
		}
		groups = append(groups, map[string]any{
			"raft_group_id": float64(g),
			"leader_id":     float64(rs.LeaderID),
			"term":          float64(rs.Term),
			"commit_index":  float64(rs.Commit),
			"applied_index": float64(rs.Applied),
			"voters":        voters,
			"learners":      learners,
			"streams":       float64(st.Streams),
			"hot_bytes":     float64(st.HotBytes),
			"gc_pending":    float64(mach.GCPending("")),
		})
	}
	out := map[string]any{
		"cluster_id":               clusterID,
		"process_incarnation":      incarnation,
		"append_requests":          float64(m.appends.Load()),
		"append_errors":            float64(m.appendErrors.Load()),
		"append_bytes":             float64(m.appendBytes.Load()),
		"read_requests":            float64(m.reads.Load()),
		"sse_subscribers":          float64(m.subscribers.Load()),
		"live_read_waiters":        float64(m.liveReadsWaiting.Load()),
		"streams":                  float64(streams),
		"hot_bytes_awaiting_flush": float64(hot),
		"raft_group_count":         float64(len(groups)),
		"raft_groups_led":          float64(leaders),
		"raft_groups":              groups,
		"peer_cluster_mismatches":  []any{},
	}
	coldMetrics(eng, out)
	return out
}

// coldMetrics adds the cold tier's counters: flushes and uploads, their
// errors, cold-write backpressure, cold reads and the GC queue.
func coldMetrics(eng *engine.Engine, out map[string]any) {
	cs := eng.ColdStats()
	if cs == nil {
		return
	}
	var pending uint64
	for _, m := range eng.Machines() {
		pending += m.GCPending("")
	}
	cache := eng.ColdCacheStats()
	for k, v := range map[string]uint64{
		"cold_flushes":                 cs.Flushes.Load(),
		"cold_flush_rejected":          cs.FlushRejected.Load(),
		"cold_uploads":                 cs.Uploads.Load(),
		"cold_upload_bytes":            cs.UploadBytes.Load(),
		"cold_upload_errors":           cs.UploadErrors.Load(),
		"cold_external_payloads":       cs.ExternalPayloads.Load(),
		"cold_read_errors":             cs.ReadErrors.Load(),
		"cold_backpressure_writes":     cs.BackpressureWrites.Load(),
		"cold_sealed_pages":            cs.SealedPages.Load(),
		"cold_compactions":             cs.Compactions.Load(),
		"cold_gc_acked_entries":        cs.GCAcked.Load(),
		"cold_gc_pending_entries":      pending,
		"cold_cache_hits":              cache.Hits,
		"cold_cache_misses":            cache.Misses,
		"cold_cache_fetch_errors":      cache.FetchErrors,
		"cold_cache_bytes":             uint64(cache.Bytes),
		"cold_hot_cap_bytes_per_group": eng.ColdConfig().HotCapBytes,
	} {
		out[k] = float64(v)
	}
}
