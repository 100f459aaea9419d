package node

import (
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// TestMetricsDocument checks the fields of /__ursula/metrics the
// operations contract names, after some work went through the node.
func TestMetricsDocument(t *testing.T) {
	eng := startEngine(t)
	s := newServer(t, eng)
	ctx := t.Context()
	ref := &streamv1.StreamRef{Bucket: "__ds", Stream: "metrics/s"}
	if _, err := s.streams.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: ref, ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		if _, err := s.streams.Append(ctx, &streamv1.AppendRequest{Ref: ref, ContentType: "text/plain", Body: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.streams.Read(ctx, &streamv1.ReadRequest{Ref: ref, Offset: "-1"}); err != nil {
		t.Fatal(err)
	}
	m := s.metricsSnapshot()
	positive := []string{"append_requests", "append_bytes", "append_ns", "read_requests", "read_ns", "read_requests_immediate",
		"raft_proposals", "raft_applied_entries", "raft_apply_ns", "raft_persist_ns", "raft_ready_batches",
		"wal_writes", "wal_bytes_written", "wal_write_ns", "wal_segments", "wal_segments_started", "raft_read_index_reads"}
	for _, k := range positive {
		if v, _ := m[k].(float64); v <= 0 {
			t.Errorf("%s = %v, want > 0", k, m[k])
		}
	}
	present := []string{"cluster_id", "process_incarnation", "node_id", "mailbox_depth", "hot_bytes_awaiting_flush", "cold_bytes",
		"sse_subscribers", "live_read_waiters", "sse_chunks_sent", "wal_fsyncs", "wal_fsync_ns", "wal_segments_reclaimed",
		"raft_snapshots", "raft_snapshot_ns", "raft_read_index_rounds", "wal_recovery", "peer_cluster_mismatches", "raft_grpc_peer_cluster_refusals"}
	for _, k := range present {
		if _, ok := m[k]; !ok {
			t.Errorf("metrics lack %s", k)
		}
	}
	shards, _ := m["shards"].([]any)
	if len(shards) != eng.Config().ShardCount {
		t.Fatalf("shards: %v", m["shards"])
	}
	for _, sh := range shards {
		for _, k := range []string{"shard", "mailbox_depth", "proposals", "applied_entries", "apply_ns", "persist_ns", "wal"} {
			if _, ok := sh.(map[string]any)[k]; !ok {
				t.Errorf("shard entry lacks %s: %v", k, sh)
			}
		}
	}
	groups, _ := m["raft_groups"].([]any)
	if len(groups) != eng.Engine.GroupCount() {
		t.Fatalf("raft_groups: %d entries", len(groups))
	}
	for _, g := range groups {
		for _, k := range []string{"raft_group_id", "leader_id", "term", "commit_index", "applied_index", "last_log_index", "snapshot_index", "voters", "learners", "is_leader", "hot_bytes", "cold_bytes",
			// The seed's recovery runbook reads these.
			"node_id", "recovery_gate", "recovery", "last_log_term", "current_term", "committed_index", "committed_term", "committed_node",
			"last_applied_index", "leads_live", "voter_configs", "committed_voter_configs", "maintenance", "history"} {
			if _, ok := g.(map[string]any)[k]; !ok {
				t.Errorf("raft_groups entry lacks %s", k)
			}
		}
	}
	// The single node leads every group with itself as the quorum: its
	// committed entry is one of its own terms, and it leads live.
	g0 := groups[0].(map[string]any)
	want := map[string]any{"node_id": float64(1), "recovery_gate": "open", "recovery": nil, "leads_live": true, "committed_node": float64(1)}
	for k, v := range want {
		if g0[k] != v {
			t.Errorf("group 0 %s = %v, want %v", k, g0[k], v)
		}
	}
	if g0["committed_term"] != g0["current_term"] || g0["last_log_term"] != g0["current_term"] {
		t.Errorf("group 0 terms: committed %v, last log %v, current %v", g0["committed_term"], g0["last_log_term"], g0["current_term"])
	}
	if vc, _ := g0["voter_configs"].([]any); len(vc) != 1 {
		t.Errorf("voter_configs = %v", g0["voter_configs"])
	}
	if running, _ := g0["maintenance"].(map[string]any)["running"].(bool); !running {
		t.Errorf("maintenance = %v", g0["maintenance"])
	}
	if mt, _ := m["raft_maintenance"].(map[string]any); mt == nil || len(mt["group_issues"].([]any)) != 0 {
		t.Errorf("raft_maintenance = %v", m["raft_maintenance"])
	}
}
