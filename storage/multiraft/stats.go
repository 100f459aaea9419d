package multiraft

import (
	"sync/atomic"

	"github.com/ursula/ursula/storage/wal"
)

// shardStats are a shard worker's cumulative counters, written by the
// worker and read by metrics.
type shardStats struct {
	proposals      atomic.Uint64
	readyBatches   atomic.Uint64
	appliedEntries atomic.Uint64
	applyNs        atomic.Uint64
	persistNs      atomic.Uint64
	snapshots      atomic.Uint64
	snapshotBytes  atomic.Uint64
	snapshotNs     atomic.Uint64
	// snapshotCaptureNs is the part of snapshotting spent on the shard
	// worker (the capture); the rest runs on the snapshot worker.
	snapshotCaptureNs atomic.Uint64
	// readIndexReads counts ReadIndex callers; readIndexRounds the raft
	// ReadIndex requests (heartbeat rounds) that answered them.
	readIndexReads  atomic.Uint64
	readIndexRounds atomic.Uint64
}

// ShardStats is one shard worker's view for metrics: its mailbox depth
// (operations waiting for the worker) and cumulative counters and
// timings, its journal's included.
type ShardStats struct {
	Shard          int    `json:"shard"`
	MailboxDepth   int    `json:"mailbox_depth"`
	Groups         int    `json:"groups"`
	Proposals      uint64 `json:"proposals"`
	ReadyBatches   uint64 `json:"ready_batches"`
	AppliedEntries uint64 `json:"applied_entries"`
	ApplyNs        uint64 `json:"apply_ns"`
	PersistNs      uint64 `json:"persist_ns"`
	Snapshots      uint64 `json:"snapshots"`
	SnapshotBytes  uint64 `json:"snapshot_bytes"`
	SnapshotNs     uint64 `json:"snapshot_ns"`
	// SnapshotCaptureNs is the shard worker's share of SnapshotNs.
	SnapshotCaptureNs uint64 `json:"snapshot_capture_ns"`
	// ReadIndexReads counts the readers that asked for a read index, and
	// ReadIndexRounds the raft ReadIndex requests issued for them: readers
	// waiting together share one round.
	ReadIndexReads  uint64    `json:"read_index_reads"`
	ReadIndexRounds uint64    `json:"read_index_rounds"`
	WAL             wal.Stats `json:"wal"`
}

// ShardStats returns every shard worker's counters.
func (h *Host) ShardStats() []ShardStats {
	out := make([]ShardStats, 0, len(h.shards))
	for _, s := range h.shards {
		s.mu.Lock()
		depth := len(s.inbox)
		s.mu.Unlock()
		st := &s.stats
		out = append(out, ShardStats{
			Shard: s.id, MailboxDepth: depth, Groups: len(s.groups),
			Proposals: st.proposals.Load(), ReadyBatches: st.readyBatches.Load(),
			AppliedEntries: st.appliedEntries.Load(), ApplyNs: st.applyNs.Load(), PersistNs: st.persistNs.Load(),
			Snapshots: st.snapshots.Load(), SnapshotBytes: st.snapshotBytes.Load(), SnapshotNs: st.snapshotNs.Load(),
			SnapshotCaptureNs: st.snapshotCaptureNs.Load(),
			ReadIndexReads:    st.readIndexReads.Load(), ReadIndexRounds: st.readIndexRounds.Load(),
			WAL: s.journal.Stats(),
		})
	}
	return out
}
