package ursulactl

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// checkCluster lists what keeps the observed cluster from being healthy:
// every manifest node reachable, answering as itself, ready and of the
// same cluster; every group with exactly one leader that every node
// names; every manifest node a voter of every group (in the leader's
// membership, and in its own view) and, in every group, applied within
// maxLag of the leader's commit index; no voter outside the manifest.
// An empty list means healthy.
func checkCluster(m *Manifest, views []*NodeView, maxLag uint64) []string {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	// Nodes.
	clusterID := m.ClusterID
	if clusterID == "" {
		clusterID = majorityClusterID(views)
	}
	for _, v := range views {
		id := v.Node.ID
		if !v.Reachable() {
			add("node %d: unreachable: %v", id, v.Err)
			continue
		}
		if v.Metrics.NodeID != 0 && v.Metrics.NodeID != id {
			add("node %d: its client_url is served by node %d", id, v.Metrics.NodeID)
		}
		if v.Metrics.ClusterID != clusterID {
			add("node %d: cluster_id %q, want %q", id, v.Metrics.ClusterID, clusterID)
		}
		if !v.IsReady() {
			add("node %d: not ready: %s", id, v.NotReadyReason())
		}
	}

	// Groups.
	groups := groupCount(views)
	if groups == 0 {
		if len(problems) == 0 {
			add("no node reports any Raft group")
		}
		return problems
	}
	for _, v := range views {
		if v.Reachable() && len(v.Metrics.Groups) != groups {
			add("node %d: reports %d groups, another node %d", v.Node.ID, len(v.Metrics.Groups), groups)
		}
	}
	for g := range uint32(groups) {
		leader, claims := leaderOf(views, g)
		switch {
		case leader == 0:
			add("group %d: no leader", g)
			continue
		case len(claims) > 1:
			add("group %d: nodes %s all claim to lead it", g, joinIDs(claims))
		}
		lm := viewOf(views, leader).Metrics.Group(g)
		for _, v := range views {
			if !v.Reachable() || v.Node.ID == leader {
				continue
			}
			gm := v.Metrics.Group(g)
			if gm == nil {
				continue // counted above
			}
			if gm.LeaderID != leader {
				add("group %d: node %d names leader %d, node %d leads", g, v.Node.ID, gm.LeaderID, leader)
			}
			if !gm.IsVoter(v.Node.ID) {
				add("group %d: node %d is not a voter in its own membership (voters %s, learners %s)", g, v.Node.ID, joinIDs(gm.Voters), joinIDs(gm.Learners))
			}
			if lm.IsVoter(v.Node.ID) && gm.AppliedIndex+maxLag < lm.CommitIndex {
				add("group %d: node %d applied index %d trails the leader's commit index %d by more than %d", g, v.Node.ID, gm.AppliedIndex, lm.CommitIndex, maxLag)
			}
		}
		for _, n := range m.Nodes {
			if !lm.IsVoter(n.ID) {
				add("group %d: node %d is not a voter (leader %d: voters %s, learners %s)", g, n.ID, leader, joinIDs(lm.Voters), joinIDs(lm.Learners))
			}
		}
		for _, id := range lm.Voters {
			if !m.Has(id) {
				add("group %d: voter %d is not in the manifest", g, id)
			}
		}
	}
	return problems
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
func (c *Controller) Verify(ctx context.Context) []string {
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
		got := c.Verify(ctx)
		if ctx.Err() != nil && problems != nil {
			break // an observation cut short by the deadline says nothing
		}
		problems = got
		if len(problems) == 0 {
			return nil
		}
		p.set(0, 1, fmt.Sprintf("%s: %d problems (%s)", what, len(problems), problems[0]))
		if !c.sleep(ctx) {
			break
		}
	}
	return fmt.Errorf("not healthy when the wait ended (%v): %d problems: %s", ctx.Err(), len(problems), summarize(problems, 5))
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
