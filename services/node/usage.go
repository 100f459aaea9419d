package node

import (
	"net/http"
	"sort"
	"strings"

	"github.com/ursula/ursula/storage/cold"
	"github.com/ursula/ursula/storage/stream"
)

// usageVersion is the version of the usage document's contract.
const usageVersion = 1

// usageDoc is the document GET /__ursula/usage answers on the client and
// admin planes: committed counters and current gauges from this node's
// replicated state, aggregated by bucket across its groups.
type usageDoc struct {
	Version        int                    `json:"version"`
	NodeID         uint64                 `json:"node_id"`
	WriteUnitBytes uint64                 `json:"write_unit_bytes"`
	Buckets        map[string]bucketUsage `json:"buckets"`
	RaftGroupCount int                    `json:"raft_group_count"`
	// StagedSnapshotParts lists staged snapshot parts no commit has used
	// yet, for every group this node leads (from the leader's in-memory
	// index, counted in the background: counting_finished is false until
	// the term's seed listing ended; a group without parts has no bytes).
	StagedSnapshotParts []stagedParts `json:"staged_snapshot_parts"`
}

type bucketUsage struct {
	CommittedAppendBytes uint64 `json:"committed_append_bytes"`
	CommittedRecords     uint64 `json:"committed_records"`
	CommittedWriteUnits  uint64 `json:"committed_write_units"`
	RetainedBytes        uint64 `json:"retained_bytes"`
	StreamCount          uint64 `json:"stream_count"`
}

type stagedParts struct {
	RaftGroupID      uint32            `json:"raft_group_id"`
	Term             uint64            `json:"term"`
	CountingFinished bool              `json:"counting_finished"`
	Bytes            map[string]uint64 `json:"bytes"`
}

// familyBucket is the built-in bucket that holds the Durable Streams
// family's streams (gateway.BuiltinBucket): clients' data, counted like
// any bucket's.
const familyBucket = "__ds"

// internalBucket reports a bucket the system keeps for itself (every
// reserved "__" name but the family's, such as the subscriptions' state
// in "__system"): no client wrote it, so the usage export leaves it out.
func internalBucket(b string) bool { return strings.HasPrefix(b, "__") && b != familyBucket }

// buildUsage renders the usage document, leaving internal buckets out.
func buildUsage(nodeID uint64, groups int, usage map[string]stream.BucketUsage, staged []cold.StagedUsage) usageDoc {
	doc := usageDoc{
		Version: usageVersion, NodeID: nodeID, WriteUnitBytes: stream.WriteUnitBytes,
		Buckets: make(map[string]bucketUsage, len(usage)), RaftGroupCount: groups,
		StagedSnapshotParts: []stagedParts{},
	}
	for b, u := range usage {
		if !internalBucket(b) {
			doc.Buckets[b] = bucketUsage(u)
		}
	}
	for _, u := range staged {
		bytes := make(map[string]uint64, len(u.Bytes))
		for b, n := range u.Bytes {
			if !internalBucket(b) {
				bytes[b] = n
			}
		}
		doc.StagedSnapshotParts = append(doc.StagedSnapshotParts, stagedParts{
			RaftGroupID: u.GroupID, Term: u.Term, CountingFinished: u.CountingFinished, Bytes: bytes,
		})
	}
	sort.Slice(doc.StagedSnapshotParts, func(i, j int) bool {
		return doc.StagedSnapshotParts[i].RaftGroupID < doc.StagedSnapshotParts[j].RaftGroupID
	})
	return doc
}

// serveUsage answers GET /__ursula/usage.
func (s *Server) serveUsage(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, buildUsage(s.n.Config().NodeID, s.n.Engine.GroupCount(), s.n.Engine.Usage(), s.n.Engine.StagedUsage(r.Context())))
}
