package multiraft

import (
	"context"
	"errors"
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
