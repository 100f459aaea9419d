package statuspage

import (
	"errors"
	"reflect"
	"testing"
	"time"
)

func metricsDoc(t testing.TB, doc string) *NodeMetrics {
	t.Helper()
	m, err := DecodeMetrics([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDecodeMetrics(t *testing.T) {
	m := metricsDoc(t, `{"node_id": 2, "cluster_id": "c1", "process_incarnation": "abc", "leadership_shed_state": "maintenance-drain",
		"raft_grpc_peer_cluster_refusals": 3, "peer_cluster_mismatches": [{"node_id": 4, "cluster_id": "other", "address": "10.0.0.4:4439", "direction": "inbound"}],
		"append_requests": 10, "append_bytes": 1000, "append_ns": 5000000, "cold_upload_bytes": 77, "cold_bytes": 99, "recovery_gates_closed": 1,
		"raft_groups": [{"raft_group_id": 0, "leader_id": 2, "term": 5, "commit_index": 9, "applied_index": 8, "voters": [3, 1, 2], "learners": [],
		"streams": 4, "hot_bytes": 512, "cold_bytes": 2048, "is_leader": true, "recovery_gate": "open", "unknown_field": {"x": 1}}], "other": [1, 2]}`)
	want := &NodeMetrics{
		NodeID: 2, ClusterID: "c1", ProcessIncarnation: "abc", ShedState: "maintenance-drain", PeerClusterRefusals: 3,
		PeerClusterMismatches: []PeerMismatch{{NodeID: 4, ClusterID: "other", Address: "10.0.0.4:4439", Direction: "inbound"}},
		AppendRequests:        10, AppendBytes: 1000, AppendNs: 5e6, ColdUploadBytes: 77, ColdBytes: 99, RecoveryGatesClosed: 1,
		Groups: []GroupMetrics{{GroupID: 0, LeaderID: 2, Term: 5, CommitIndex: 9, AppliedIndex: 8, Voters: []uint64{3, 1, 2}, Learners: []uint64{},
			Streams: 4, HotBytes: 512, ColdBytes: 2048, IsLeader: true, RecoveryGate: "open"}},
	}
	if !reflect.DeepEqual(m, want) {
		t.Fatalf("decoded\n%+v\nwant\n%+v", m, want)
	}
	for name, doc := range map[string]string{
		"not json":      `{"node_id": `,
		"no node id":    `{"ready": true}`,
		"wrong type":    `{"node_id": "two"}`,
		"array":         `[1, 2]`,
		"negative term": `{"node_id": 1, "raft_groups": [{"term": -1}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			if m, err := DecodeMetrics([]byte(doc)); err == nil {
				t.Fatalf("decoded %+v, want an error", m)
			}
		})
	}
}

// group is one replica's view of a group for the table below.
func group(id uint32, leader, term, commit, applied uint64, gate string) GroupMetrics {
	return GroupMetrics{GroupID: id, LeaderID: leader, Term: term, CommitIndex: commit, AppliedIndex: applied,
		Voters: []uint64{1, 2, 3}, Learners: []uint64{}, RecoveryGate: gate}
}

func TestAggregate(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	ready := &Readiness{Ready: true}
	node := func(id uint64, shed string, groups ...GroupMetrics) *NodeMetrics {
		return &NodeMetrics{NodeID: id, ClusterID: "c1", ShedState: shed, PeerClusterMismatches: []PeerMismatch{}, Groups: groups}
	}
	tests := []struct {
		name   string
		obs    []Observation
		known  map[string]uint64
		nodes  []NodeView // compared on ID, Address, Reachable, Ready, Reason, ShedState, Leads
		groups []GroupView
		noLead []uint32
	}{
		{
			name: "three nodes agree",
			obs: []Observation{
				{Address: "b", Metrics: node(2, "normal", group(0, 1, 3, 10, 10, "open"), group(1, 2, 4, 20, 20, "open")), Ready: ready},
				{Address: "a", Metrics: node(1, "normal", group(0, 1, 3, 10, 9, "open"), group(1, 2, 4, 18, 18, "open")), Ready: ready},
				{Address: "c", Metrics: node(3, "maintenance-drain", group(0, 1, 3, 10, 7, "open"), group(1, 2, 4, 20, 15, "open")), Ready: ready},
			},
			nodes: []NodeView{
				{ID: 1, Address: "a", Reachable: true, Ready: true, ShedState: "normal", Leads: 1},
				{ID: 2, Address: "b", Reachable: true, Ready: true, ShedState: "normal", Leads: 1},
				{ID: 3, Address: "c", Reachable: true, Ready: true, ShedState: "maintenance-drain"},
			},
			groups: []GroupView{
				// The leader's commit is the reference: node 1 reports 10.
				{ID: 0, Leader: 1, Term: 3, Commit: 10, MaxLag: 3, Lag: []ReplicaLag{{1, 1}, {2, 0}, {3, 3}}, RecoveryGate: "open"},
				{ID: 1, Leader: 2, Term: 4, Commit: 20, MaxLag: 5, Lag: []ReplicaLag{{1, 2}, {2, 0}, {3, 5}}, RecoveryGate: "open"},
			},
			noLead: []uint32{},
		},
		{
			name:  "a node stops answering and keeps its id",
			known: map[string]uint64{"c": 3},
			obs: []Observation{
				{Address: "a", Metrics: node(1, "normal", group(0, 1, 5, 10, 10, "open")), Ready: &Readiness{Reason: "raft_replica_unready"}},
				{Address: "c", Err: errors.New("connection refused")},
				{Address: "new", Err: errors.New("timeout")},
				// A configured peer that never answered shows its id.
				{Address: "peer", NodeID: 7, Err: errors.New("connection refused")},
			},
			nodes: []NodeView{
				{ID: 1, Address: "a", Reachable: true, Reason: "raft_replica_unready", ShedState: "normal", Leads: 1},
				{ID: 3, Address: "c", Reason: "unreachable"},
				{ID: 7, Address: "peer", Reason: "unreachable"},
				{ID: 0, Address: "new", Reason: "unreachable"},
			},
			groups: []GroupView{{ID: 0, Leader: 1, Term: 5, Commit: 10, Lag: []ReplicaLag{{1, 0}}, RecoveryGate: "open"}},
			noLead: []uint32{},
		},
		{
			name: "no leader, a stale claim and gates",
			obs: []Observation{
				// Node 1 still claims group 0 at term 2; node 2 leads at term 3.
				{Address: "a", Metrics: node(1, "normal", group(0, 1, 2, 5, 5, "closed"), group(1, 0, 7, 30, 30, "stalled"))},
				{Address: "b", Metrics: node(2, "normal", group(0, 2, 3, 8, 8, "open"), group(1, 0, 7, 31, 29, "closed")), Ready: ready},
			},
			nodes: []NodeView{
				{ID: 1, Address: "a", Reachable: true, Reason: "readiness unknown", ShedState: "normal", Leads: 1},
				{ID: 2, Address: "b", Reachable: true, Ready: true, ShedState: "normal", Leads: 1},
			},
			groups: []GroupView{
				{ID: 0, Leader: 2, Term: 3, Commit: 8, MaxLag: 3, Lag: []ReplicaLag{{1, 3}, {2, 0}}, RecoveryGate: "closed on 1"},
				// Without a leader the highest commit is the reference.
				{ID: 1, Leader: 0, Term: 7, Commit: 31, MaxLag: 2, Lag: []ReplicaLag{{1, 1}, {2, 2}}, RecoveryGate: "stalled on 1; closed on 2"},
			},
			noLead: []uint32{1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			known := tt.known
			if known == nil {
				known = map[string]uint64{}
			}
			lastSeen := map[uint64]int64{}
			snap := aggregate(tt.obs, now, known, lastSeen)
			var nodes []NodeView
			for _, n := range snap.Nodes {
				nodes = append(nodes, NodeView{ID: n.ID, Address: n.Address, Reachable: n.Reachable, Ready: n.Ready, Reason: n.Reason, ShedState: n.ShedState, Leads: n.Leads})
				if n.Reachable && n.LastSeen != now.UnixMilli() {
					t.Errorf("node %d last seen %d, want %d", n.ID, n.LastSeen, now.UnixMilli())
				}
			}
			if !reflect.DeepEqual(nodes, tt.nodes) {
				t.Errorf("nodes\n%+v\nwant\n%+v", nodes, tt.nodes)
			}
			var groups []GroupView
			for _, g := range snap.Groups {
				if g.Voters == nil || g.Learners == nil {
					t.Errorf("group %d: voters %v learners %v: nil renders as null", g.ID, g.Voters, g.Learners)
				}
				g.Voters, g.Learners = nil, nil
				groups = append(groups, g)
			}
			if !reflect.DeepEqual(groups, tt.groups) {
				t.Errorf("groups\n%+v\nwant\n%+v", groups, tt.groups)
			}
			if !reflect.DeepEqual(snap.GroupsWithoutLeader, tt.noLead) {
				t.Errorf("groups without a leader %v, want %v", snap.GroupsWithoutLeader, tt.noLead)
			}
			for _, o := range tt.obs {
				if o.Metrics != nil && known[o.Address] != o.Metrics.NodeID {
					t.Errorf("known[%s] = %d, want %d", o.Address, known[o.Address], o.Metrics.NodeID)
				}
			}
		})
	}
}

func TestRates(t *testing.T) {
	prev := map[uint64]counters{}
	c := func(inc string, at int64, appends, bytes, ns, reads float64) counters {
		return counters{incarnation: inc, at: at, appends: appends, appendBytes: bytes, appendNs: ns, reads: reads}
	}
	if _, ok := rates(map[uint64]counters{1: c("a", 1000, 10, 100, 1e6, 0)}, prev, 1000); ok {
		t.Fatal("a sample from one read")
	}
	s, ok := rates(map[uint64]counters{1: c("a", 3000, 30, 300, 5e6, 4), 2: c("b", 3000, 1, 1, 1, 1)}, prev, 3000)
	if !ok {
		t.Fatal("no sample from two reads")
	}
	// Node 1: 20 appends and 200 bytes in 2 s, 4e6 ns → 0.2 ms each; node 2
	// was not read before.
	want := Sample{At: 3000, AppendsPerSec: 10, AppendBytesPerSec: 100, ReadsPerSec: 2, AppendMs: 0.2}
	if s != want {
		t.Fatalf("sample %+v, want %+v", s, want)
	}
	// Node 1 restarted (another incarnation, counters from zero): it
	// contributes nothing; node 2 does.
	s, ok = rates(map[uint64]counters{1: c("a2", 4000, 1, 1, 1, 0), 2: c("b", 4000, 3, 1, 1, 1)}, prev, 4000)
	if !ok || s.AppendsPerSec != 2 {
		t.Fatalf("after a restart: %+v %v, want 2 appends/s from node 2 alone", s, ok)
	}
	// Read latency is over the reads that did not wait: 2 of the 10
	// reads in a second took 3 ms in all.
	prev3 := map[uint64]counters{}
	rates(map[uint64]counters{5: {incarnation: "x", at: 0}}, prev3, 0)
	s, _ = rates(map[uint64]counters{5: {incarnation: "x", at: 1000, reads: 10, readsTimed: 2, readNs: 3e6}}, prev3, 1000)
	if s.ReadsPerSec != 10 || s.ReadMs != 1.5 {
		t.Fatalf("reads: %+v, want 10/s at 1.5 ms", s)
	}
	// A node that did not answer starts over.
	rates(map[uint64]counters{1: c("a2", 5000, 2, 1, 1, 0)}, prev, 5000)
	if _, ok := prev[2]; ok {
		t.Fatal("node 2 kept its counters while it did not answer")
	}
}

func TestRing(t *testing.T) {
	r := newRing(3)
	if got := r.all(); len(got) != 0 {
		t.Fatalf("empty ring: %v", got)
	}
	for i := range 5 {
		r.add(Sample{At: int64(i)})
	}
	var ats []int64
	for _, s := range r.all() {
		ats = append(ats, s.At)
	}
	if !reflect.DeepEqual(ats, []int64{2, 3, 4}) {
		t.Fatalf("ring holds %v, want the newest three oldest first", ats)
	}
}
