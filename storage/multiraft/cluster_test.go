package multiraft

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/tests/await"
)

// memNetwork is an in-memory Transport between Hosts of one process.
type memNetwork struct {
	mu    sync.Mutex
	hosts map[uint64]*Host
	down  map[uint64]bool
	snaps atomic.Int64 // MsgSnap deliveries
	// hold, when set, parks the messages it matches until release (a link
	// that delays them).
	hold func(groupID uint32, m *pb.Message) bool
	held []heldMessage
}

type heldMessage struct {
	groupID uint32
	m       *pb.Message
}

// setHold parks the messages hold matches from now on (nil: none).
func (n *memNetwork) setHold(hold func(groupID uint32, m *pb.Message) bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hold = hold
}

// release stops holding messages and delivers those held.
func (n *memNetwork) release() {
	n.mu.Lock()
	held := n.held
	n.hold, n.held = nil, nil
	hosts := n.hosts
	var to []*Host
	for _, hm := range held {
		to = append(to, hosts[hm.m.GetTo()])
	}
	n.mu.Unlock()
	for i, hm := range held {
		if to[i] != nil {
			_ = to[i].Step(hm.groupID, hm.m)
		}
	}
}

// discard stops holding messages and drops those held (a link that lost
// them).
func (n *memNetwork) discard() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hold, n.held = nil, nil
}

func newMemNetwork() *memNetwork {
	return &memNetwork{hosts: map[uint64]*Host{}, down: map[uint64]bool{}}
}

func (n *memNetwork) set(id uint64, h *Host) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.hosts[id] = h
}

func (n *memNetwork) setDown(id uint64, down bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down[id] = down
}

// endpoint is one node's view of the network.
type endpoint struct {
	net  *memNetwork
	self uint64
}

func (e endpoint) Send(groupID uint32, msgs []*pb.Message) {
	e.net.mu.Lock()
	self := e.net.hosts[e.self]
	selfDown := e.net.down[e.self]
	type delivery struct {
		to *Host
		m  *pb.Message
	}
	var out []delivery
	for _, m := range msgs {
		to := e.net.hosts[m.GetTo()]
		if to == nil || selfDown || e.net.down[m.GetTo()] {
			if self != nil {
				_ = self.ReportUnreachable(groupID, m.GetTo())
				if m.GetType() == pb.MsgSnap {
					_ = self.ReportSnapshot(groupID, m.GetTo(), true)
				}
			}
			continue
		}
		if e.net.hold != nil && e.net.hold(groupID, m) {
			e.net.held = append(e.net.held, heldMessage{groupID: groupID, m: m})
			continue
		}
		out = append(out, delivery{to, m})
	}
	e.net.mu.Unlock()
	for _, d := range out {
		_ = d.to.Step(groupID, d.m)
		if d.m.GetType() == pb.MsgSnap && self != nil {
			e.net.snaps.Add(1)
			_ = self.ReportSnapshot(groupID, d.m.GetTo(), false)
		}
	}
}

type cluster struct {
	// tb owns the nodes: they are stopped when its test ends, not when the
	// subtest that (re)started them does.
	tb    testing.TB
	net   *memNetwork
	cfgs  map[uint64]Config
	nodes map[uint64]*testNode
}

func newCluster(tb testing.TB, size int, tune func(*Config)) *cluster {
	tb.Helper()
	c := &cluster{tb: tb, net: newMemNetwork(), cfgs: map[uint64]Config{}, nodes: map[uint64]*testNode{}}
	var voters []uint64
	for i := 1; i <= size; i++ {
		voters = append(voters, uint64(i))
	}
	for _, id := range voters {
		cfg := baseConfig(tb.TempDir())
		cfg.NodeID = id
		cfg.Voters = voters
		if tune != nil {
			tune(&cfg)
		}
		c.cfgs[id] = cfg
		c.start(tb, id)
	}
	return c
}

func (c *cluster) start(tb testing.TB, id uint64) *testNode {
	tb.Helper()
	n := newNode(tb, c.cfgs[id], endpoint{net: c.net, self: id})
	c.net.set(id, n.h)
	c.nodes[id] = n
	n.run(c.tb)
	return n
}

func (c *cluster) stop(tb testing.TB, id uint64) {
	tb.Helper()
	c.net.set(id, nil)
	c.nodes[id].stop(tb)
	delete(c.nodes, id)
}

// leader waits until all running nodes agree on a leader of group g.
func (c *cluster) leader(tb testing.TB, g uint32) *testNode {
	tb.Helper()
	var lead uint64
	defer func() {
		if tb.Failed() {
			for id, n := range c.nodes {
				tb.Logf("node %d group %d: %+v", id, g, n.h.Status(g))
			}

		}
	}()
	await.True(tb, fmt.Sprintf("leader of group %d", g), func() bool {
		lead = 0
		for _, n := range c.nodes {
			st := n.h.Status(g)
			if st.LeaderID == 0 || (lead != 0 && st.LeaderID != lead) {
				return false
			}
			lead = st.LeaderID
		}
		return c.nodes[lead] != nil && c.nodes[lead].h.Status(g).IsLeader
	})
	return c.nodes[lead]
}

func (c *cluster) proposeN(tb testing.TB, g uint32, count int) {
	tb.Helper()
	for i := 0; i < count; {
		l := c.leader(tb, g)
		_, err := l.h.Propose(context.Background(), g, u64(uint64(i+1)))
		var nl *NotLeaderError
		switch {
		case err == nil:
			i++
		case errors.As(err, &nl), errors.Is(err, ErrOutcomeUnknown), errors.Is(err, ErrProposalDropped):
			// leadership moved; the counter test below tolerates no
			// duplicates, so only retry errors that did not append.
			if errors.Is(err, ErrOutcomeUnknown) {
				tb.Fatalf("leadership lost during proposals: %v", err)
			}
		default:
			tb.Fatalf("Propose: %v", err)
		}
	}
}

func (c *cluster) converged(tb testing.TB, g uint32) {
	tb.Helper()
	await.True(tb, fmt.Sprintf("group %d replicas to converge", g), func() bool {
		var want [2]uint64
		first := true
		for _, n := range c.nodes {
			sum, count := n.sms[g].state()
			if first {
				want, first = [2]uint64{sum, count}, false
			} else if want != [2]uint64{sum, count} {
				return false
			}
		}
		return true
	})
}

func TestThreeNodes(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.GroupCount, cfg.ShardCount = 3, 2
		cfg.SnapshotEntries = 50
	})
	for _, n := range c.nodes {
		waitReady(t, n.h)
	}

	t.Run("replication", func(t *testing.T) {
		for g := range uint32(3) {
			c.proposeN(t, g, 30)
			c.converged(t, g)
		}
		l := c.leader(t, 0)
		st := l.h.Status(0)
		if len(st.Voters) != 3 {
			t.Fatalf("voters %v, want 3", st.Voters)
		}
	})

	t.Run("follower refuses proposals", func(t *testing.T) {
		l := c.leader(t, 1)
		for id, n := range c.nodes {
			if n == l {
				continue
			}
			_, err := n.h.Propose(context.Background(), 1, u64(1))
			var nl *NotLeaderError
			if !errors.As(err, &nl) || nl.LeaderID != l.h.cfg.NodeID {
				t.Fatalf("node %d: Propose = %v, want NotLeaderError{%d}", id, err, l.h.cfg.NodeID)
			}
		}
	})

	t.Run("follower catches up via snapshot", func(t *testing.T) {
		l := c.leader(t, 0)
		var follower uint64
		for id, n := range c.nodes {
			if n != l {
				follower = id
				break
			}
		}
		c.stop(t, follower)
		c.proposeN(t, 0, 300) // several snapshots and compactions on the leader
		// Snapshots are written by the snapshot worker, after the applies.
		await.True(t, "the leader to take a snapshot", func() bool { return l.h.Status(0).SnapshotIndex > 0 })
		snaps := c.net.snaps.Load()
		c.start(t, follower)
		c.converged(t, 0)
		if c.net.snaps.Load() == snaps {
			t.Fatal("follower caught up without a snapshot")
		}
		sum, count := c.nodes[follower].sms[0].state()
		if count != 330 {
			t.Fatalf("follower applied %d entries (sum %d), want 330", count, sum)
		}
	})

	t.Run("leader failover", func(t *testing.T) {
		old := c.leader(t, 2)
		oldID := old.h.cfg.NodeID
		c.stop(t, oldID)
		nl := c.leader(t, 2)
		if nl.h.cfg.NodeID == oldID {
			t.Fatal("stopped node still leads")
		}
		c.proposeN(t, 2, 20)
		c.start(t, oldID)
		c.converged(t, 2)
	})
}

func TestLeaderIsolatedOutcomeUnknown(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.GroupCount, cfg.ShardCount = 1, 1 })
	l := c.leader(t, 0)
	c.proposeN(t, 0, 5)
	id := l.h.cfg.NodeID
	c.net.setDown(id, true)
	_, err := l.h.Propose(context.Background(), 0, u64(7))
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("Propose on an isolated leader = %v, want ErrOutcomeUnknown", err)
	}
	c.net.setDown(id, false)
	c.proposeN(t, 0, 5)
	c.converged(t, 0)
}

// TestLearnerAfterSnapshot: a replica removed and later added back as a
// learner, after the leader compacted its log behind a snapshot whose
// membership does not name it, still catches up: that snapshot is held
// back and a new one, naming the learner, is sent instead (the replica
// would refuse the old one forever).
func TestLearnerAfterSnapshot(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) {
		cfg.GroupCount, cfg.ShardCount = 1, 1
		cfg.SnapshotEntries = 20
		cfg.SegmentBytes = 16 << 10
	})
	for _, n := range c.nodes {
		waitReady(t, n.h)
	}
	l := c.leader(t, 0)
	var out uint64
	for id, n := range c.nodes {
		if n != l {
			out = id
		}
	}
	c.stop(t, out)
	ctx := context.Background()
	remove := &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: pb.ConfChangeRemoveNode.Enum(), NodeId: new(out)}}}
	if err := l.h.ProposeConfChange(ctx, 0, remove); err != nil {
		t.Fatal(err)
	}
	await.True(t, "the removal to apply", func() bool { return !slices.Contains(l.h.Status(0).Voters, out) })
	c.proposeN(t, 0, 200)
	await.True(t, "a snapshot after the removal", func() bool { return l.h.Status(0).SnapshotIndex > 20 })
	n := c.start(t, out)
	add := &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: pb.ConfChangeAddLearnerNode.Enum(), NodeId: new(out)}}}
	if err := l.h.ProposeConfChange(ctx, 0, add); err != nil {
		t.Fatal(err)
	}
	await.True(t, "the learner to catch up through a snapshot that names it", func() bool {
		return n.h.Status(0).Applied >= l.h.Status(0).Commit
	})
}
