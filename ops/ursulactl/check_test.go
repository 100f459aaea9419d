package ursulactl

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// views builds a healthy observation of nodes 1..n with the given leader
// per group; mutate changes it.
func views(n int, leaders []uint64, mutate func([]*NodeView)) (*Manifest, []*NodeView) {
	m := &Manifest{}
	var voters []uint64
	for i := range n {
		voters = append(voters, uint64(i+1))
	}
	var vs []*NodeView
	for _, id := range voters {
		node := Node{ID: id, ClientURL: "http://c", AdminURL: "http://a"}
		m.Nodes = append(m.Nodes, node)
		met := &Metrics{NodeID: id, ClusterID: "c1", ProcessIncarnation: "i"}
		for g, l := range leaders {
			met.Groups = append(met.Groups, GroupMetrics{GroupID: uint32(g), LeaderID: l, Term: 2, CommitIndex: 500, AppliedIndex: 500,
				Voters: slices.Clone(voters), Learners: []uint64{}})
		}
		vs = append(vs, &NodeView{Node: node, Metrics: met, Ready: &Readiness{Status: 200, Ready: true}})
	}
	if mutate != nil {
		mutate(vs)
	}
	return m, vs
}

func TestCheckCluster(t *testing.T) {
	leaders := []uint64{1, 2, 3, 1}
	tests := []struct {
		name   string
		mutate func([]*NodeView)
		want   []string
	}{
		{name: "healthy"},
		{name: "unreachable", mutate: func(v []*NodeView) { v[2].Metrics, v[2].Err = nil, errors.New("connection refused") },
			want: []string{"node 3: unreachable: connection refused", "group 2: no reachable leader: node 3, which the other nodes name, is unreachable"}},
		{name: "no leader", mutate: func(v []*NodeView) {
			for _, nv := range v {
				nv.Metrics.Groups[1].LeaderID = 0
			}
		}, want: []string{"group 1: no leader"}},
		{name: "not ready", mutate: func(v []*NodeView) { v[1].Ready = &Readiness{Status: 503, Reason: "groups_not_ready"} },
			want: []string{"node 2: not ready: groups_not_ready"}},
		{name: "other cluster", mutate: func(v []*NodeView) { v[0].Metrics.ClusterID = "c2" },
			want: []string{`node 1: cluster_id "c2", want "c1"`}},
		{name: "wrong node behind the url", mutate: func(v []*NodeView) { v[0].Metrics.NodeID = 7 },
			want: []string{"node 1: its client_url is served by node 7"}},
		{name: "two leaders", mutate: func(v []*NodeView) { v[1].Metrics.Groups[0].LeaderID = 2 },
			want: []string{"group 0: nodes [1,2] all claim to lead it", "group 0: node 2 names leader 2, node 1 leads"}},
		{name: "disagreement", mutate: func(v []*NodeView) { v[2].Metrics.Groups[0].LeaderID = 0 },
			want: []string{"group 0: node 3 names leader 0, node 1 leads"}},
		{name: "learner", mutate: func(v []*NodeView) {
			for _, nv := range v {
				nv.Metrics.Groups[1].Voters = []uint64{1, 2}
				nv.Metrics.Groups[1].Learners = []uint64{3}
			}
		}, want: []string{
			"group 1: node 3 is not a voter in its own membership (voters [1,2], learners [3])",
			"group 1: node 3 is not a voter (leader 2: voters [1,2], learners [3])",
		}},
		{name: "lagging", mutate: func(v []*NodeView) { v[2].Metrics.Groups[3].AppliedIndex = 10 },
			want: []string{"group 3: node 3 applied index 10 trails the leader's commit index 500 by more than 100"}},
		{name: "stranger voter", mutate: func(v []*NodeView) { v[1].Metrics.Groups[1].Voters = []uint64{1, 2, 3, 4} },
			want: []string{"group 1: voter 4 is not in the manifest"}},
		{name: "group count", mutate: func(v []*NodeView) { v[2].Metrics.Groups = v[2].Metrics.Groups[:3] },
			want: []string{"node 3: reports 3 groups, another node 4"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, vs := views(3, leaders, tt.mutate)
			var got []string
			for _, p := range checkCluster(m, vs, 100) {
				got = append(got, p.Message)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n  %s\nwant:\n  %s", strings.Join(got, "\n  "), strings.Join(tt.want, "\n  "))
			}
		})
	}
}

func TestPickTargetSpreads(t *testing.T) {
	counts := map[uint64]int{1: 6, 2: 5, 3: 5}
	var picks []uint64
	for g := range uint32(6) {
		to := pickTarget([]uint64{2, 3}, counts, g)
		counts[to]++
		counts[1]--
		picks = append(picks, to)
	}
	if counts[2] != 8 || counts[3] != 8 {
		t.Errorf("picks %v leave counts %v, want 8 and 8", picks, counts)
	}
	if got := pickTarget([]uint64{3, 2}, map[uint64]int{2: 4, 3: 1}, 0); got != 3 {
		t.Errorf("pick = %d, want the least loaded 3", got)
	}
	if got := pickTarget(nil, nil, 0); got != 0 {
		t.Errorf("pick from nothing = %d", got)
	}
}

func TestDrainPrecondition(t *testing.T) {
	m, vs := views(3, []uint64{1, 2}, nil)
	if err := drainPrecondition(m, vs, 1); err != nil {
		t.Fatalf("healthy: %v", err)
	}
	// A five-voter group with two others not ready keeps no quorum, even
	// when the manifest lists only three nodes.
	m, vs = views(3, []uint64{1, 2}, func(v []*NodeView) { v[0].Metrics.Groups[1].Voters = []uint64{1, 2, 3, 4, 5} })
	err := drainPrecondition(m, vs, 1)
	if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "group 1 would be left without a quorum") {
		t.Errorf("err = %v", err)
	}
}

func TestNodeCaughtUp(t *testing.T) {
	_, vs := views(3, []uint64{1, 2, 3}, nil)
	if done, total, why := nodeCaughtUp(vs, 3, 10); why != "" || done != 3 || total != 3 {
		t.Errorf("healthy: %d/%d %q", done, total, why)
	}
	_, vs = views(3, []uint64{1, 2, 3}, func(v []*NodeView) { v[2].Metrics.Groups[0].AppliedIndex = 400 })
	if done, _, why := nodeCaughtUp(vs, 3, 10); done != 2 || !strings.Contains(why, "group 0: applied 400, leader 1 committed 500") {
		t.Errorf("lagging: %d %q", done, why)
	}
	_, vs = views(3, []uint64{1, 2, 3}, func(v []*NodeView) { v[0].Metrics.Groups[0].Learners = []uint64{3} })
	if _, _, why := nodeCaughtUp(vs, 3, 10); !strings.Contains(why, "group 0: not a voter yet") {
		t.Errorf("learner: %q", why)
	}
	_, vs = views(3, []uint64{1, 2, 3}, func(v []*NodeView) { v[2].Ready = &Readiness{Status: 503, Reason: "recovery_gate_closed"} })
	if _, _, why := nodeCaughtUp(vs, 3, 10); why != "not ready: recovery_gate_closed" {
		t.Errorf("unready: %q", why)
	}
}
