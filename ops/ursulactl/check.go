package ursulactl

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// Problem is one finding of verify-cluster.
type Problem struct {
	// Kind names the check that failed: unreachable, wrong_node,
	// cluster_id, not_ready, group_count, no_groups, no_leader,
	// leader_unreachable, leader_claims, leader_disagreement, not_own_voter, lagging,
	// not_voter, stranger_voter.
	Kind string `json:"kind"`
	// Node is the node the finding is about (0: none).
	Node uint64 `json:"node,omitempty"`
	// Group is the Raft group it is about (nil: the node as a whole).
	Group *uint32 `json:"group,omitempty"`
	// Message is the finding on one line, its group first.
	Message string `json:"message"`
	// summary is Message without what differs from group to group:
	// findings with the same summary are shown as one line.
	summary string
}

func (p Problem) String() string { return p.Message }

// checkCluster lists what keeps the observed cluster from being healthy:
// every manifest node reachable, answering as itself, ready and of the
// same cluster; every group with exactly one leader that every node
// names; every manifest node a voter of every group (in the leader's
// membership, and in its own view) and, in every group, applied within
// maxLag of the leader's commit index; no voter outside the manifest.
// An empty list means healthy.
func checkCluster(m *Manifest, views []*NodeView, maxLag uint64) []Problem {
	var problems []Problem
	nodeP := func(kind string, node uint64, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		problems = append(problems, Problem{Kind: kind, Node: node, Message: msg, summary: msg})
	}
	// groupP records a finding about group g; summary is its text
	// without the group and without what differs between groups.
	groupP := func(kind string, g uint32, node uint64, summary, format string, args ...any) {
		problems = append(problems, Problem{Kind: kind, Node: node, Group: &g,
			Message: fmt.Sprintf("group %d: ", g) + fmt.Sprintf(format, args...), summary: summary})
	}

	// Nodes.
	clusterID := m.ClusterID
	if clusterID == "" {
		clusterID = majorityClusterID(views)
	}
	for _, v := range views {
		id := v.Node.ID
		if !v.Reachable() {
			nodeP("unreachable", id, "node %d: unreachable: %v", id, v.Err)
			continue
		}
		if v.Metrics.NodeID != 0 && v.Metrics.NodeID != id {
			nodeP("wrong_node", id, "node %d: its client_url is served by node %d", id, v.Metrics.NodeID)
		}
		if v.Metrics.ClusterID != clusterID {
			nodeP("cluster_id", id, "node %d: cluster_id %q, want %q", id, v.Metrics.ClusterID, clusterID)
		}
		if !v.IsReady() {
			nodeP("not_ready", id, "node %d: not ready: %s", id, v.NotReadyReason())
		}
	}

	// Groups.
	groups := groupCount(views)
	if groups == 0 {
		if len(problems) == 0 {
			nodeP("no_groups", 0, "no node reports any Raft group")
		}
		return problems
	}
	for _, v := range views {
		if v.Reachable() && len(v.Metrics.Groups) != groups {
			nodeP("group_count", v.Node.ID, "node %d: reports %d groups, another node %d", v.Node.ID, len(v.Metrics.Groups), groups)
		}
	}
	for g := range uint32(groups) {
		leader, claims := leaderOf(views, g)
		switch {
		case leader == 0:
			if named := namedLeader(views, g); named != 0 && !viewOf(views, named).Reachable() {
				groupP("leader_unreachable", g, named, fmt.Sprintf("no reachable leader: node %d, which the other nodes name, is unreachable", named),
					"no reachable leader: node %d, which the other nodes name, is unreachable", named)
			} else {
				groupP("no_leader", g, 0, "no leader", "no leader")
			}
			continue
		case len(claims) > 1:
			groupP("leader_claims", g, 0, fmt.Sprintf("nodes %s all claim to lead", joinIDs(claims)), "nodes %s all claim to lead it", joinIDs(claims))
		}
		lm := viewOf(views, leader).Metrics.Group(g)
		for _, v := range views {
			if !v.Reachable() || v.Node.ID == leader {
				continue
			}
			id := v.Node.ID
			gm := v.Metrics.Group(g)
			if gm == nil {
				continue // counted above
			}
			if gm.LeaderID != leader {
				groupP("leader_disagreement", g, id, fmt.Sprintf("node %d names another leader than the group's", id),
					"node %d names leader %d, node %d leads", id, gm.LeaderID, leader)
			}
			if !gm.IsVoter(id) {
				groupP("not_own_voter", g, id, fmt.Sprintf("node %d is not a voter in its own membership", id),
					"node %d is not a voter in its own membership (voters %s, learners %s)", id, joinIDs(gm.Voters), joinIDs(gm.Learners))
			}
			if lm.IsVoter(id) && gm.AppliedIndex+maxLag < lm.CommitIndex {
				groupP("lagging", g, id, fmt.Sprintf("node %d trails the leader's commit index by more than %d", id, maxLag),
					"node %d applied index %d trails the leader's commit index %d by more than %d", id, gm.AppliedIndex, lm.CommitIndex, maxLag)
			}
		}
		for _, n := range m.Nodes {
			if !lm.IsVoter(n.ID) {
				groupP("not_voter", g, n.ID, fmt.Sprintf("node %d is not a voter", n.ID),
					"node %d is not a voter (leader %d: voters %s, learners %s)", n.ID, leader, joinIDs(lm.Voters), joinIDs(lm.Learners))
			}
		}
		for _, id := range lm.Voters {
			if !m.Has(id) {
				groupP("stranger_voter", g, id, fmt.Sprintf("voter %d is not in the manifest", id), "voter %d is not in the manifest", id)
			}
		}
	}
	return problems
}

// namedLeader is the leader most reachable nodes name for group g (0 when
// none names one), whether or not it answered.
func namedLeader(views []*NodeView, g uint32) uint64 {
	counts := map[uint64]int{}
	best := uint64(0)
	for _, v := range views {
		if !v.Reachable() {
			continue
		}
		gm := v.Metrics.Group(g)
		if gm == nil || gm.LeaderID == 0 {
			continue
		}
		counts[gm.LeaderID]++
		if best == 0 || counts[gm.LeaderID] > counts[best] {
			best = gm.LeaderID
		}
	}
	if viewOf(views, best) == nil {
		return 0
	}
	return best
}

// ProblemGroup is findings that differ only in their group, shown as one
// line.
type ProblemGroup struct {
	Kind string `json:"kind"`
	Node uint64 `json:"node,omitempty"`
	// Summary is the findings' text without the group.
	Summary string `json:"summary"`
	// Groups are the Raft groups affected, ascending (none for a node's
	// finding).
	Groups []uint32 `json:"groups,omitempty"`
	// Count is the number of findings.
	Count int `json:"count"`
	// Line is the group on one line, as verify-cluster prints it.
	Line string `json:"line"`
	// Problems are the findings themselves.
	Problems []Problem `json:"-"`
}

// groupProblems folds findings with the same summary into one group each,
// in the order of their first finding.
func groupProblems(ps []Problem) []ProblemGroup {
	var out []ProblemGroup
	at := map[string]int{}
	for _, p := range ps {
		i, ok := at[p.summary]
		if !ok {
			i = len(out)
			at[p.summary] = i
			out = append(out, ProblemGroup{Kind: p.Kind, Node: p.Node, Summary: p.summary})
		}
		pg := &out[i]
		pg.Count++
		pg.Problems = append(pg.Problems, p)
		if p.Group != nil {
			pg.Groups = append(pg.Groups, *p.Group)
		}
	}
	for i := range out {
		pg := &out[i]
		slices.Sort(pg.Groups)
		pg.Groups = slices.Compact(pg.Groups)
		if pg.Count == 1 {
			pg.Line = pg.Problems[0].Message
		} else {
			pg.Line = fmt.Sprintf("%s: %d groups affected (groups %s)", pg.Summary, len(pg.Groups), compactRanges(pg.Groups))
		}
	}
	return out
}

// groupLines are the groups' lines.
func groupLines(gs []ProblemGroup) []string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = g.Line
	}
	return out
}

// compactRanges renders sorted ids with runs folded: "0-63", "1, 4-6, 9".
func compactRanges(ids []uint32) string {
	var b strings.Builder
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		if j > i {
			fmt.Fprintf(&b, "%d-%d", ids[i], ids[j])
		} else {
			fmt.Fprintf(&b, "%d", ids[i])
		}
		i = j + 1
	}
	return b.String()
}

// majorityClusterID is the cluster id most reachable nodes report (the
// first node's among equals).
func majorityClusterID(views []*NodeView) string {
	counts := map[string]int{}
	best, bestN := "", 0
	for _, v := range views {
		if !v.Reachable() {
			continue
		}
		id := v.Metrics.ClusterID
		counts[id]++
		if counts[id] > bestN {
			best, bestN = id, counts[id]
		}
	}
	return best
}

func joinIDs[T uint32 | uint64](ids []T) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return "[" + strings.Join(s, ",") + "]"
}

// Verify observes the cluster once and returns its problems (see
// checkCluster); none means healthy.
func (c *Controller) Verify(ctx context.Context) []Problem {
	return checkCluster(c.m, c.observe(ctx), c.opts.MaxLag)
}

// WaitReady waits, up to Options.Timeout, until Verify finds no problem:
// every node ready, every group led by a leader all nodes agree on, every
// configured voter a voter of every group and caught up.
func (c *Controller) WaitReady(ctx context.Context) error {
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	if err := c.waitHealthy(ctx, "cluster"); err != nil {
		return fmt.Errorf("wait-ready: %w", err)
	}
	c.printf("cluster ready: %d nodes ready, every group led, every node a caught-up voter of every group", len(c.m.Nodes))
	return nil
}

// waitHealthy polls Verify until it finds no problem or ctx ends.
func (c *Controller) waitHealthy(ctx context.Context, what string) error {
	p := c.newProgress(what, false)
	defer p.finish()
	var problems []string
	for {
		got := groupLines(groupProblems(c.Verify(ctx)))
		if ctx.Err() != nil && problems != nil {
			break // an observation cut short by the deadline says nothing
		}
		problems = got
		if len(problems) == 0 {
			return nil
		}
		p.set(0, 1, fmt.Sprintf("%s: %s", what, summarize(problems, 2)))
		if !c.sleep(ctx) {
			break
		}
	}
	return fmt.Errorf("not healthy when the wait ended (%v): %s", ctx.Err(), summarize(problems, 5))
}

// summarize joins up to n problems on one line.
func summarize(problems []string, n int) string {
	if len(problems) <= n {
		return strings.Join(problems, "; ")
	}
	return strings.Join(problems[:n], "; ") + fmt.Sprintf("; and %d more", len(problems)-n)
}

// eligibleVoters lists the voters of a group, other than self, that may
// take its leadership in the views: listed in the manifest, reachable,
// ready, not draining, of the same cluster; and why each other voter may
// not.
func eligibleVoters(gm *GroupMetrics, self uint64, views []*NodeView, sheds map[uint64]*ShedState, clusterID string) ([]uint64, []string) {
	var out []uint64
	var why []string
	for _, v := range gm.Voters {
		if v == self {
			continue
		}
		if slices.Contains(gm.Learners, v) {
			why = append(why, fmt.Sprintf("node %d is a learner", v))
			continue
		}
		nv := viewOf(views, v)
		sh := sheds[v]
		switch {
		case nv == nil:
			why = append(why, fmt.Sprintf("node %d is not in the manifest", v))
		case !nv.IsReady():
			why = append(why, fmt.Sprintf("node %d is not ready (%s)", v, nv.NotReadyReason()))
		case clusterID != "" && nv.Metrics.ClusterID != clusterID:
			why = append(why, fmt.Sprintf("node %d is of cluster %q", v, nv.Metrics.ClusterID))
		case sh == nil:
			why = append(why, fmt.Sprintf("node %d: shed state unknown", v))
		case !sh.ShouldAcceptTransfer:
			why = append(why, fmt.Sprintf("node %d is draining (%s)", v, sh.State))
		case clusterID != "" && sh.ClusterID != "" && sh.ClusterID != clusterID:
			why = append(why, fmt.Sprintf("node %d's shed state names cluster %q", v, sh.ClusterID))
		default:
			out = append(out, v)
		}
	}
	return out, why
}

// pickTarget chooses, among eligible voters, the one leading the fewest
// groups; ties go round-robin by group so that handoffs spread.
func pickTarget(eligible []uint64, counts map[uint64]int, g uint32) uint64 {
	if len(eligible) == 0 {
		return 0
	}
	sorted := slices.Clone(eligible)
	slices.Sort(sorted)
	best := uint64(0)
	for i := range sorted {
		v := sorted[(int(g)+i)%len(sorted)]
		if best == 0 || counts[v] < counts[best] {
			best = v
		}
	}
	return best
}
