package ursulactl

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
)

// Metrics is the part of a node's GET /__ursula/metrics ursulactl reads.
type Metrics struct {
	NodeID             uint64
	ClusterID          string
	ProcessIncarnation string
	// ShedState is leadership_shed_state: "normal" or "maintenance-drain".
	ShedState string
	Groups    []GroupMetrics
}

// GroupMetrics is one entry of raft_groups.
type GroupMetrics struct {
	GroupID      uint32
	LeaderID     uint64
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	Voters       []uint64
	Learners     []uint64
}

// UnmarshalJSON decodes the metrics document. Numbers are read as JSON
// numbers of any spelling (the document is a JSON object of doubles on
// the admin plane's REST mapping).
func (m *Metrics) UnmarshalJSON(b []byte) error {
	var w struct {
		NodeID             float64 `json:"node_id"`
		ClusterID          string  `json:"cluster_id"`
		ProcessIncarnation string  `json:"process_incarnation"`
		ShedState          string  `json:"leadership_shed_state"`
		Groups             []struct {
			GroupID      float64   `json:"raft_group_id"`
			LeaderID     float64   `json:"leader_id"`
			Term         float64   `json:"term"`
			CommitIndex  float64   `json:"commit_index"`
			AppliedIndex float64   `json:"applied_index"`
			Voters       []float64 `json:"voters"`
			Learners     []float64 `json:"learners"`
		} `json:"raft_groups"`
	}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	ids := func(fs []float64) []uint64 {
		out := make([]uint64, len(fs))
		for i, f := range fs {
			out[i] = uint64(f)
		}
		return out
	}
	*m = Metrics{NodeID: uint64(w.NodeID), ClusterID: w.ClusterID, ProcessIncarnation: w.ProcessIncarnation, ShedState: w.ShedState}
	for _, g := range w.Groups {
		m.Groups = append(m.Groups, GroupMetrics{
			GroupID: uint32(g.GroupID), LeaderID: uint64(g.LeaderID), Term: uint64(g.Term),
			CommitIndex: uint64(g.CommitIndex), AppliedIndex: uint64(g.AppliedIndex),
			Voters: ids(g.Voters), Learners: ids(g.Learners),
		})
	}
	return nil
}

// Group returns group g's entry, nil when the node does not report it.
func (m *Metrics) Group(g uint32) *GroupMetrics {
	for i := range m.Groups {
		if m.Groups[i].GroupID == g {
			return &m.Groups[i]
		}
	}
	return nil
}

// Led lists the groups whose leader this node names itself.
func (m *Metrics) Led(self uint64) []uint32 {
	var out []uint32
	for _, g := range m.Groups {
		if g.LeaderID == self {
			out = append(out, g.GroupID)
		}
	}
	return out
}

// IsVoter reports whether node is a voter (and not a learner) of the group.
func (g *GroupMetrics) IsVoter(node uint64) bool {
	return slices.Contains(g.Voters, node) && !slices.Contains(g.Learners, node)
}

// Readiness is a node's GET /__ursula/ready answer.
type Readiness struct {
	// Status is the HTTP status: 200 ready, 503 not.
	Status             int    `json:"-"`
	Ready              bool   `json:"ready"`
	Reason             string `json:"reason"`
	ClusterID          string `json:"cluster_id"`
	ProcessIncarnation string `json:"process_incarnation"`
}

// ShedState is a node's GET /__ursula/leadership-shed answer.
type ShedState struct {
	ClusterID            string `json:"cluster_id"`
	State                string `json:"state"`
	ShouldAcceptTransfer bool   `json:"should_accept_transfer"`
	ShouldCampaign       bool   `json:"should_campaign"`
}

// NodeView is one observation of a node: its metrics and readiness, or
// why they could not be read.
type NodeView struct {
	Node    Node
	Metrics *Metrics
	// Err is why the metrics could not be read: the node is unreachable.
	Err      error
	Ready    *Readiness
	ReadyErr error
}

// Reachable reports whether the node's metrics were read.
func (v *NodeView) Reachable() bool { return v.Err == nil && v.Metrics != nil }

// IsReady reports a 200 from /__ursula/ready.
func (v *NodeView) IsReady() bool {
	return v.ReadyErr == nil && v.Ready != nil && v.Ready.Status == 200 && v.Ready.Ready
}

// NotReadyReason says why the node is not ready ("" when it is).
func (v *NodeView) NotReadyReason() string {
	switch {
	case v.IsReady():
		return ""
	case !v.Reachable():
		return "unreachable: " + v.Err.Error()
	case v.ReadyErr != nil:
		return "readiness unknown: " + v.ReadyErr.Error()
	case v.Ready.Reason != "":
		return v.Ready.Reason
	default:
		return "not ready"
	}
}

// observe reads every manifest node's metrics and readiness, in parallel.
func (c *Controller) observe(ctx context.Context) []*NodeView {
	views := make([]*NodeView, len(c.m.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.m.Nodes {
		wg.Go(func() { views[i] = c.observeNode(ctx, n.ID) })
	}
	wg.Wait()
	return views
}

// observeNode reads one node's metrics, then its readiness.
func (c *Controller) observeNode(ctx context.Context, id uint64) *NodeView {
	cl := c.clients[id]
	v := &NodeView{Node: cl.node}
	v.Metrics, v.Err = cl.Metrics(ctx)
	if v.Err != nil {
		v.Metrics = nil
		return v
	}
	v.Ready, v.ReadyErr = cl.Readiness(ctx)
	return v
}

// viewOf returns the view of node id.
func viewOf(views []*NodeView, id uint64) *NodeView {
	for _, v := range views {
		if v.Node.ID == id {
			return v
		}
	}
	return nil
}

// groupCount is the largest number of groups any reachable node reports.
func groupCount(views []*NodeView) int {
	n := 0
	for _, v := range views {
		if v.Reachable() {
			n = max(n, len(v.Metrics.Groups))
		}
	}
	return n
}

// leaderOf returns the node that claims to lead group g at the highest
// term among the reachable views (0 when none does), and every claimant.
func leaderOf(views []*NodeView, g uint32) (uint64, []uint64) {
	var leader, term uint64
	var claims []uint64
	for _, v := range views {
		if !v.Reachable() {
			continue
		}
		gm := v.Metrics.Group(g)
		if gm == nil || gm.LeaderID != v.Node.ID {
			continue
		}
		claims = append(claims, v.Node.ID)
		if leader == 0 || gm.Term > term {
			leader, term = v.Node.ID, gm.Term
		}
	}
	return leader, claims
}

// leaderCounts counts, for every manifest node, the groups it leads (as
// leaderOf decides), and lists the groups no node leads.
func leaderCounts(m *Manifest, views []*NodeView) (map[uint64]int, []uint32) {
	counts := make(map[uint64]int, len(m.Nodes))
	for _, n := range m.Nodes {
		counts[n.ID] = 0
	}
	var leaderless []uint32
	for g := range uint32(groupCount(views)) {
		if l, _ := leaderOf(views, g); l != 0 {
			counts[l]++
		} else {
			leaderless = append(leaderless, g)
		}
	}
	return counts, leaderless
}
