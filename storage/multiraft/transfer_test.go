package multiraft

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/tests/await"
)

// transferring reports whether node n's replica of group 0 is handing its
// leadership over.
func transferring(tb testing.TB, n *testNode) bool {
	tb.Helper()
	var to uint64
	if err := n.h.do(tb.Context(), 0, func(g *group) error {
		to = g.rn.BasicStatus().LeadTransferee
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return to != 0
}

// TestProposalsHeldDuringTransfer: a proposal that reaches a leader while
// it hands its leadership over is not dropped (raft refuses it then). It
// is held, and answered once the transfer is over: proposed after all
// when the transfer is aborted, NotLeaderError naming the new leader when
// it completes.
func TestProposalsHeldDuringTransfer(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.GroupCount, cfg.ShardCount = 1, 1 })
	ctx := t.Context()
	propose := func(n *testNode, v uint64) <-chan error {
		done := make(chan error, 1)
		go func() {
			_, err := n.h.Propose(context.WithoutCancel(ctx), 0, u64(v))
			done <- err
		}()
		return done
	}
	other := func(l *testNode) uint64 {
		for id, n := range c.nodes {
			if n != l {
				return id
			}
		}
		return 0
	}
	timeoutNow := func(_ uint32, m *pb.Message) bool { return m.GetType() == pb.MessageType_MsgTimeoutNow }

	t.Run("aborted transfer: proposed after all", func(t *testing.T) {
		l := c.leader(t, 0)
		c.proposeN(t, 0, 3)
		// The transferee never hears that it should campaign: raft aborts
		// the transfer after an election timeout.
		c.net.setHold(timeoutNow)
		if err := l.h.TransferLeader(ctx, 0, other(l)); err != nil {
			t.Fatal(err)
		}
		await.True(t, "the transfer to start", func() bool { return transferring(t, l) })
		done := propose(l, 11)
		if err := <-done; err != nil {
			t.Fatalf("a proposal during an aborted transfer: %v, want it applied", err)
		}
		// The held MsgTimeoutNow is lost: delivered now, it would move the
		// leadership while the next subtest starts its own transfer.
		c.net.discard()
	})

	t.Run("completed transfer: NotLeaderError naming the new leader", func(t *testing.T) {
		c.converged(t, 0)
		l := c.leader(t, 0)
		to := other(l)
		c.net.setHold(timeoutNow)
		if err := l.h.TransferLeader(ctx, 0, to); err != nil {
			t.Fatal(err)
		}
		await.True(t, "the transfer to start", func() bool { return transferring(t, l) })
		first, second := propose(l, 21), propose(l, 22)
		c.net.release() // the transferee campaigns now
		for _, done := range []<-chan error{first, second} {
			err := <-done
			var nl *NotLeaderError
			if !errors.As(err, &nl) || nl.LeaderID != to {
				t.Fatalf("a proposal during a completed transfer: %v, want NotLeaderError{%d}", err, to)
			}
		}
	})
}

// TestDrainingTransfereeRetriesItsCampaign: a draining node told to take a
// leadership (MsgTimeoutNow) becomes a candidate; if its votes are lost, it
// campaigns again on its own clock. Here the only other live replica
// drains too and never times out, so without that retry the group would
// have no leader until an operator undrained a node.
func TestDrainingTransfereeRetriesItsCampaign(t *testing.T) {
	c := newCluster(t, 3, func(cfg *Config) { cfg.GroupCount, cfg.ShardCount = 1, 1 })
	l := c.leader(t, 0)
	var to, down uint64
	for id, n := range c.nodes {
		switch {
		case n == l:
		case to == 0:
			to = id
		default:
			down = id
		}
	}
	c.stop(t, down)
	l.h.SetShedding(true)
	c.nodes[to].h.SetShedding(true)
	var lost atomic.Bool
	c.net.setHold(func(_ uint32, m *pb.Message) bool {
		// The transferee's first vote request is lost on the way.
		return m.GetType() == pb.MessageType_MsgVote && m.GetFrom() == to && lost.CompareAndSwap(false, true)
	})
	if err := l.h.TransferLeader(t.Context(), 0, to); err != nil {
		t.Fatal(err)
	}
	await.True(t, "the transferee's vote request to be lost", lost.Load)
	if got := c.leader(t, 0); got != c.nodes[to] {
		t.Fatalf("leader is node %d, want the transferee %d", got.h.cfg.NodeID, to)
	}
	c.net.discard()
}
