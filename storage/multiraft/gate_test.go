package multiraft

import (
	"context"
	"slices"
	"testing"

	"github.com/ursula/ursula/tests/await"
)

// crash stops a node without recording a clean shutdown.
func (c *cluster) crash(tb testing.TB, id uint64) {
	tb.Helper()
	c.net.set(id, nil)
	c.nodes[id].halt(tb)
	delete(c.nodes, id)
}

// TestRecoveryGate: a voter restarted after a crash under fsync "never"
// holds every group it had behind the gate, recorded so that a further
// restart keeps it; a gated replica still follows its leader but helps
// elect no one; OpenGate opens it for good. A clean restart gates nothing.
func TestRecoveryGate(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.GroupCount, cfg.ShardCount = 2, 1 })
	for _, n := range c.nodes {
		waitReady(t, n.h)
	}
	c.proposeN(t, 0, 10)
	l := c.leader(t, 0)
	var a uint64
	for id, n := range c.nodes {
		if n != l {
			a = id
			break
		}
	}

	c.stop(t, a)
	if got := c.start(t, a).h.Gated(); len(got) != 0 {
		t.Fatalf("after a clean restart gated %v, want none", got)
	}
	c.crash(t, a)
	if got := c.start(t, a).h.Gated(); !slices.Equal(got, []uint32{0, 1}) {
		t.Fatalf("after a crash gated %v, want both groups", got)
	}
	c.crash(t, a)
	na := c.start(t, a)
	if got := na.h.Gated(); !slices.Equal(got, []uint32{0, 1}) || !na.h.Status(0).Gated {
		t.Fatalf("after a second start gated %v, want the recorded gates kept", got)
	}
	// A gated replica follows its leader.
	c.proposeN(t, 0, 5)
	c.converged(t, 0)

	// Without the gated replica's vote the survivor of the leader's stop
	// elects no one in the groups the stopped node led: its (pre-)vote
	// requests are dropped. (A group the survivor already leads keeps its
	// leader: the gated replica still follows.)
	var orphaned []uint32
	for g := range uint32(2) {
		if l.h.Status(g).IsLeader {
			orphaned = append(orphaned, g)
		}
	}
	c.stop(t, l.h.cfg.NodeID)
	var b *testNode
	for id, n := range c.nodes {
		if id != a {
			b = n
		}
	}
	dropped := na.h.GateDropped()
	await.True(t, "the gated replica to drop a vote request", func() bool { return na.h.GateDropped() > dropped })
	for _, g := range orphaned {
		if b.h.Status(g).IsLeader || na.h.Status(g).IsLeader {
			t.Fatalf("group %d elected a leader without a vote of an open majority", g)
		}
	}

	if err := na.h.OpenGate(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if got := na.h.Gated(); !slices.Equal(got, []uint32{1}) || na.h.Status(0).Gated {
		t.Fatalf("after OpenGate(0) gated %v", got)
	}
	c.leader(t, 0)
	c.proposeN(t, 0, 1)
}
