package node

import (
	"testing"
	"time"

	"github.com/ursula/ursula/storage/cluster"
	"github.com/ursula/ursula/storage/engine"
	"github.com/ursula/ursula/storage/multiraft"
)

// TestReadinessReasons covers each reason a node can give on its own;
// awaiting_rebuild and learner_catching_up are produced by a wiped voter
// of a real cluster (tests/e2e TestClusterWipedNodeRejoins checks them).
func TestReadinessReasons(t *testing.T) {
	eng := startEngine(t)
	s := newServer(t, eng)
	if r := s.readiness(); r.GetReady() || r.GetReason() != ReasonStarting {
		t.Fatalf("before the engine reported ready: %+v", r)
	}
	s.setReady(true)
	if r := s.readiness(); !r.GetReady() || r.GetReason() != "" || r.GetClusterId() != testClusterID {
		t.Fatalf("ready single node: %+v", r)
	}
	s.stopping.Store(true)
	if r := s.readiness(); r.GetReady() || r.GetReason() != ReasonShuttingDown {
		t.Fatalf("shutting down: %+v", r)
	}
}

// TestReadinessWithoutLeader: a voter of a 3-node cluster whose peers never
// answer has no leader in any group.
func TestReadinessWithoutLeader(t *testing.T) {
	eng, err := engine.Open(engine.Config{
		DataDir: t.TempDir(), NodeID: 1, ClusterID: testClusterID, GroupCount: 2, ShardCount: 1, Fsync: "never",
		ReadChunkBytes: 1 << 20, SnapshotEntries: 64, SnapshotBytes: 64 << 10,
		TickInterval: 100 * time.Millisecond, ExpirySweepInterval: 100 * time.Millisecond,
		Peers: []cluster.Peer{
			{ID: 1, ClusterURL: "127.0.0.1:1", ClientURL: "127.0.0.1:1"},
			{ID: 2, ClusterURL: "127.0.0.1:2", ClientURL: "127.0.0.1:2"},
			{ID: 3, ClusterURL: "127.0.0.1:3", ClientURL: "127.0.0.1:3"},
		},
	}, engine.Deps{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, eng)
	s.setReady(true) // as if it had been ready before its peers went away
	if r := s.readiness(); r.GetReady() || r.GetReason() != ReasonNoLeader {
		t.Fatalf("no leader anywhere: %+v", r)
	}
}

// TestReadinessReasonTable covers every reason the node can give.
func TestReadinessReasonTable(t *testing.T) {
	led := multiraft.GroupStatus{LeaderID: 2, Voters: []uint64{1, 2, 3}}
	learner := multiraft.GroupStatus{LeaderID: 2, Voters: []uint64{2, 3}, Learners: []uint64{1}}
	leaderless := multiraft.GroupStatus{Voters: []uint64{1, 2, 3}}
	now := time.Now()
	changing := multiraft.GroupStatus{Voters: []uint64{1, 2, 3}, LeaderLostAt: now.Add(-time.Second)}
	lost := multiraft.GroupStatus{Voters: []uint64{1, 2, 3}, LeaderLostAt: now.Add(-leaderlessGrace)}
	for _, c := range []struct {
		name              string
		stopping, started bool
		rejoin            int
		gates             map[uint32]cluster.GateState
		groups            []multiraft.GroupStatus
		want              string
	}{
		{"ready", false, true, 0, nil, []multiraft.GroupStatus{led, led}, ""},
		{"starting", false, false, 0, nil, []multiraft.GroupStatus{led}, ReasonStarting},
		{"shutting down wins", true, true, 1, nil, []multiraft.GroupStatus{leaderless}, ReasonShuttingDown},
		{"awaiting rebuild", false, true, 2, nil, []multiraft.GroupStatus{led}, ReasonAwaitingRebuild},
		{"awaiting rebuild before started", false, false, 2, nil, []multiraft.GroupStatus{leaderless}, ReasonAwaitingRebuild},
		{"learner", false, true, 0, nil, []multiraft.GroupStatus{led, learner}, ReasonLearner},
		{"no leader", false, true, 0, nil, []multiraft.GroupStatus{led, leaderless}, ReasonNoLeader},
		// A leadership change in flight does not make the node unready...
		{"leader changing", false, true, 0, nil, []multiraft.GroupStatus{led, changing}, ""},
		// ...one that does not complete within the grace does.
		{"leader lost", false, true, 0, nil, []multiraft.GroupStatus{led, lost}, ReasonNoLeader},
		{"gate closed", false, true, 0, map[uint32]cluster.GateState{1: cluster.GateAwaitingBarrier}, []multiraft.GroupStatus{led, leaderless}, ReasonRecoveryGateClosed},
		// A gated node that never saw a leader names the gate, not "starting".
		{"gate before starting", false, false, 0, map[uint32]cluster.GateState{0: cluster.GateStalled}, []multiraft.GroupStatus{leaderless}, ReasonRecoveryStalled},
		{"gate stalled wins", false, true, 0, map[uint32]cluster.GateState{0: cluster.GateAwaitingBarrier, 1: cluster.GateStalled}, []multiraft.GroupStatus{led, leaderless}, ReasonRecoveryStalled},
	} {
		if got := readinessReason(c.stopping, c.started, c.rejoin, c.gates, c.groups, 1, now); got != c.want {
			t.Errorf("%s: reason %q, want %q", c.name, got, c.want)
		}
	}
}
