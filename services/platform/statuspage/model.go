package statuspage

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"time"
)

// Observation is one read of one node: its /__ursula/metrics document and
// its /__ursula/ready answer, or why they could not be read.
type Observation struct {
	// Address is where the node was asked (its client-plane address, or
	// "local" for the node serving the page).
	Address string
	// NodeID is the node id configured for Address, when the reader knows
	// it (a node's peers): an unreachable node that never answered is
	// shown under it. 0: unknown until the node answers.
	NodeID uint64
	// Metrics is the metrics document; nil when Err is set.
	Metrics *NodeMetrics
	// Ready is the readiness answer; nil when it could not be read.
	Ready *Readiness
	// Err is why the metrics could not be read: the node is unreachable.
	Err error
}

// NodeMetrics is the part of a node's metrics document the page shows.
type NodeMetrics struct {
	NodeID             uint64 `json:"node_id"`
	ClusterID          string `json:"cluster_id"`
	ProcessIncarnation string `json:"process_incarnation"`
	// ShedState is leadership_shed_state: "normal" or "maintenance-drain".
	ShedState string `json:"leadership_shed_state"`
	// PeerClusterRefusals counts Raft RPCs refused for another cluster id.
	PeerClusterRefusals float64 `json:"raft_grpc_peer_cluster_refusals"`
	// PeerClusterMismatches are the configured peers refused lately.
	PeerClusterMismatches []PeerMismatch `json:"peer_cluster_mismatches"`
	AppendRequests        float64        `json:"append_requests"`
	AppendBytes           float64        `json:"append_bytes"`
	AppendNs              float64        `json:"append_ns"`
	AppendErrors          float64        `json:"append_errors"`
	ReadRequests          float64        `json:"read_requests"`
	ReadNs                float64        `json:"read_ns"`
	// ReadImmediate counts the reads read_ns times (those that do not
	// wait at the tail).
	ReadImmediate        float64        `json:"read_requests_immediate"`
	Streams              float64        `json:"streams"`
	HotBytes             float64        `json:"hot_bytes_awaiting_flush"`
	ColdBytes            float64        `json:"cold_bytes"`
	ColdUploadBytes      float64        `json:"cold_upload_bytes"`
	ColdCacheBytes       float64        `json:"cold_cache_bytes"`
	RecoveryGatesClosed  float64        `json:"recovery_gates_closed"`
	RecoveryGatesStalled float64        `json:"recovery_gates_stalled"`
	Groups               []GroupMetrics `json:"raft_groups"`
}

// PeerMismatch is one entry of peer_cluster_mismatches.
type PeerMismatch struct {
	NodeID    uint64 `json:"node_id"`
	ClusterID string `json:"cluster_id"`
	Address   string `json:"address"`
	Direction string `json:"direction"`
}

// GroupMetrics is one entry of raft_groups: the group as one replica sees it.
type GroupMetrics struct {
	GroupID      uint32   `json:"raft_group_id"`
	LeaderID     uint64   `json:"leader_id"`
	Term         uint64   `json:"term"`
	CommitIndex  uint64   `json:"commit_index"`
	AppliedIndex uint64   `json:"applied_index"`
	Voters       []uint64 `json:"voters"`
	Learners     []uint64 `json:"learners"`
	Streams      uint64   `json:"streams"`
	HotBytes     uint64   `json:"hot_bytes"`
	ColdBytes    uint64   `json:"cold_bytes"`
	IsLeader     bool     `json:"is_leader"`
	// RecoveryGate is "open", or the state of the group's recovery gate.
	RecoveryGate string `json:"recovery_gate"`
}

// Readiness is a node's /__ursula/ready answer.
type Readiness struct {
	Ready  bool   `json:"ready"`
	Reason string `json:"reason"`
}

// DecodeMetrics decodes a node's metrics document (the client plane's
// rendering: integers without exponents). A JSON object without node_id is
// not a node's document and is refused.
func DecodeMetrics(b []byte) (*NodeMetrics, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("statuspage: decode metrics: %w", err)
	}
	if _, ok := raw["node_id"]; !ok {
		return nil, fmt.Errorf("statuspage: decode metrics: no node_id: not a node's metrics document")
	}
	var m NodeMetrics
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("statuspage: decode metrics: %w", err)
	}
	return &m, nil
}

// Snapshot is the cluster view the page renders: sent whole as JSON.
type Snapshot struct {
	// At is when the nodes were read (Unix milliseconds).
	At int64 `json:"at"`
	// Source names what serves the page ("gateway", "node 2").
	Source string `json:"source"`
	// ClusterID is the cluster id the reachable nodes report (several,
	// comma-separated, when they disagree).
	ClusterID string      `json:"cluster_id"`
	Nodes     []NodeView  `json:"nodes"`
	Groups    []GroupView `json:"groups"`
	// GroupsWithoutLeader lists the groups no reachable node leads.
	GroupsWithoutLeader []uint32 `json:"groups_without_leader"`
	// Sample is the newest throughput and latency sample (nil before two
	// reads made a rate).
	Sample *Sample `json:"sample,omitempty"`
	// History is every sample kept, oldest first; set only on the first
	// event of a connection and on /__ursula/ui/snapshot.
	History []Sample `json:"history,omitempty"`
}

// NodeView is one node's row.
type NodeView struct {
	ID        uint64 `json:"id"`
	Address   string `json:"address"`
	Reachable bool   `json:"reachable"`
	// Error is why the node is unreachable.
	Error string `json:"error,omitempty"`
	Ready bool   `json:"ready"`
	// Reason is why the node is not ready ("unreachable" when it did not
	// answer).
	Reason string `json:"reason,omitempty"`
	// ShedState is the drain state: "normal" or "maintenance-drain".
	ShedState          string `json:"shed_state,omitempty"`
	ClusterID          string `json:"cluster_id,omitempty"`
	ProcessIncarnation string `json:"process_incarnation,omitempty"`
	// PeerRefusals counts Raft RPCs refused for another cluster id.
	PeerRefusals uint64 `json:"peer_refusals"`
	// PeerMismatches describes the peers refused lately.
	PeerMismatches []string `json:"peer_mismatches"`
	// Leads counts the groups this node leads (by the node's own word).
	Leads    int    `json:"leads"`
	Streams  uint64 `json:"streams"`
	HotBytes uint64 `json:"hot_bytes"`
	// ColdBytes is the stream bytes of this node's replicas in the cold
	// tier; ColdUploadBytes is what this node uploaded there.
	ColdBytes            uint64 `json:"cold_bytes"`
	ColdUploadBytes      uint64 `json:"cold_upload_bytes"`
	RecoveryGatesClosed  int    `json:"recovery_gates_closed"`
	RecoveryGatesStalled int    `json:"recovery_gates_stalled"`
	// LastSeen is when the node last answered (Unix milliseconds; 0:
	// never since the page's server started).
	LastSeen int64 `json:"last_seen"`
}

// GroupView is one group's row: its leader's view, with the lag of every
// replica that answered.
type GroupView struct {
	ID       uint32   `json:"id"`
	Leader   uint64   `json:"leader"`
	Term     uint64   `json:"term"`
	Voters   []uint64 `json:"voters"`
	Learners []uint64 `json:"learners"`
	// Commit is the leader's commit index (the highest reported when no
	// leader answered).
	Commit uint64 `json:"commit"`
	// Lag is, per replica that answered, how far its applied index is
	// behind Commit.
	Lag []ReplicaLag `json:"lag"`
	// MaxLag is the largest entry of Lag.
	MaxLag    uint64 `json:"max_lag"`
	Streams   uint64 `json:"streams"`
	HotBytes  uint64 `json:"hot_bytes"`
	ColdBytes uint64 `json:"cold_bytes"`
	// RecoveryGate is "open" when every replica's gate is open, else the
	// worst state with the nodes in it ("stalled on 2", "closed on 1,3").
	RecoveryGate string `json:"recovery_gate"`
}

// ReplicaLag is one replica's applied index behind the group's commit.
type ReplicaLag struct {
	Node uint64 `json:"node"`
	Lag  uint64 `json:"lag"`
}

// aggregate builds the cluster view from one observation of each node.
// known maps addresses to the node ids seen there before, so that a node
// that stops answering keeps its id; aggregate updates it. lastSeen maps
// node ids to when they last answered; aggregate updates it too.
func aggregate(obs []Observation, now time.Time, known map[string]uint64, lastSeen map[uint64]int64) Snapshot {
	snap := Snapshot{At: now.UnixMilli(), GroupsWithoutLeader: []uint32{}}
	clusters := map[string]bool{}
	type replica struct {
		node uint64
		g    GroupMetrics
	}
	byGroup := map[uint32][]replica{}
	for _, o := range obs {
		nv := NodeView{Address: o.Address, PeerMismatches: []string{}}
		if o.Err != nil || o.Metrics == nil {
			nv.ID = known[o.Address]
			if nv.ID == 0 {
				nv.ID = o.NodeID
			}
			nv.Reason = "unreachable"
			if o.Err != nil {
				nv.Error = o.Err.Error()
			}
			nv.LastSeen = lastSeen[nv.ID]
			snap.Nodes = append(snap.Nodes, nv)
			continue
		}
		m := o.Metrics
		nv.ID = m.NodeID
		known[o.Address] = m.NodeID
		lastSeen[m.NodeID] = snap.At
		nv.LastSeen = snap.At
		nv.Reachable = true
		nv.ClusterID = m.ClusterID
		if m.ClusterID != "" {
			clusters[m.ClusterID] = true
		}
		nv.ProcessIncarnation = m.ProcessIncarnation
		nv.ShedState = m.ShedState
		nv.PeerRefusals = uint64(m.PeerClusterRefusals)
		for _, p := range m.PeerClusterMismatches {
			nv.PeerMismatches = append(nv.PeerMismatches, fmt.Sprintf("node %d (%s) is in cluster %q (%s)", p.NodeID, p.Address, p.ClusterID, p.Direction))
		}
		nv.Streams = uint64(m.Streams)
		nv.HotBytes = uint64(m.HotBytes)
		nv.ColdUploadBytes = uint64(m.ColdUploadBytes)
		nv.ColdBytes = uint64(m.ColdBytes)
		nv.RecoveryGatesClosed = int(m.RecoveryGatesClosed)
		nv.RecoveryGatesStalled = int(m.RecoveryGatesStalled)
		switch {
		case o.Ready == nil:
			nv.Reason = "readiness unknown"
		case o.Ready.Ready:
			nv.Ready = true
		case o.Ready.Reason != "":
			nv.Reason = o.Ready.Reason
		default:
			nv.Reason = "not ready"
		}
		for _, g := range m.Groups {
			if g.LeaderID == m.NodeID {
				nv.Leads++
			}
			byGroup[g.GroupID] = append(byGroup[g.GroupID], replica{node: m.NodeID, g: g})
		}
		snap.Nodes = append(snap.Nodes, nv)
	}
	sort.SliceStable(snap.Nodes, func(i, j int) bool {
		a, b := snap.Nodes[i], snap.Nodes[j]
		if a.ID != b.ID {
			// Nodes never seen (id 0) go last.
			return b.ID == 0 || (a.ID != 0 && a.ID < b.ID)
		}
		return a.Address < b.Address
	})
	ids := make([]string, 0, len(clusters))
	for c := range clusters {
		ids = append(ids, c)
	}
	slices.Sort(ids)
	for i, c := range ids {
		if i > 0 {
			snap.ClusterID += ", "
		}
		snap.ClusterID += c
	}

	groups := make([]uint32, 0, len(byGroup))
	for g := range byGroup {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	for _, id := range groups {
		reps := byGroup[id]
		gv := GroupView{ID: id, Lag: []ReplicaLag{}}
		// The leader is the replica that names itself leader at the
		// highest term; without one, the highest term's view stands in.
		var best *GroupMetrics
		for i := range reps {
			r := &reps[i]
			if r.g.LeaderID != r.node {
				continue
			}
			if best == nil || r.g.Term > best.Term {
				best = &r.g
			}
		}
		if best != nil {
			gv.Leader = best.LeaderID
		} else {
			for i := range reps {
				if best == nil || reps[i].g.Term > best.Term {
					best = &reps[i].g
				}
			}
			snap.GroupsWithoutLeader = append(snap.GroupsWithoutLeader, id)
		}
		gv.Term, gv.Voters, gv.Learners = best.Term, sortedIDs(best.Voters), sortedIDs(best.Learners)
		gv.Streams, gv.HotBytes, gv.ColdBytes = best.Streams, best.HotBytes, best.ColdBytes
		for _, r := range reps {
			gv.Commit = max(gv.Commit, r.g.CommitIndex)
		}
		if gv.Leader != 0 {
			gv.Commit = best.CommitIndex
		}
		gates := map[string][]uint64{}
		for _, r := range reps {
			var lag uint64
			if gv.Commit > r.g.AppliedIndex {
				lag = gv.Commit - r.g.AppliedIndex
			}
			gv.Lag = append(gv.Lag, ReplicaLag{Node: r.node, Lag: lag})
			gv.MaxLag = max(gv.MaxLag, lag)
			if st := r.g.RecoveryGate; st != "" && st != "open" {
				gates[st] = append(gates[st], r.node)
			}
		}
		slices.SortFunc(gv.Lag, func(a, b ReplicaLag) int { return cmpU64(a.Node, b.Node) })
		gv.RecoveryGate = gateSummary(gates)
		snap.Groups = append(snap.Groups, gv)
	}
	if snap.Groups == nil {
		snap.Groups = []GroupView{}
	}
	if snap.Nodes == nil {
		snap.Nodes = []NodeView{}
	}
	return snap
}

// gateSummary renders the replicas' gate states: "open" when none is
// gated, else each state with its nodes, stalled first.
func gateSummary(gates map[string][]uint64) string {
	if len(gates) == 0 {
		return "open"
	}
	states := make([]string, 0, len(gates))
	for st := range gates {
		states = append(states, st)
	}
	slices.SortFunc(states, func(a, b string) int {
		// "stalled" is the worst state: it comes first.
		if (a == "stalled") != (b == "stalled") {
			if a == "stalled" {
				return -1
			}
			return 1
		}
		if a < b {
			return -1
		}
		if a > b {
			return 1
		}
		return 0
	})
	out := ""
	for i, st := range states {
		if i > 0 {
			out += "; "
		}
		nodes := gates[st]
		slices.Sort(nodes)
		out += st + " on "
		for j, n := range nodes {
			if j > 0 {
				out += ","
			}
			out += fmt.Sprint(n)
		}
	}
	return out
}

// sortedIDs returns a sorted copy of ids, never nil (JSON [], not null).
func sortedIDs(ids []uint64) []uint64 {
	out := append(make([]uint64, 0, len(ids)), ids...)
	slices.Sort(out)
	return out
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
