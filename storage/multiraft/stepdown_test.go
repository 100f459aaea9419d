package multiraft

import (
	"context"
	"errors"
	"testing"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/tests/await"
)

// TestStepDownSettlesPending: a leader that steps down with proposals
// appended but not committed answers them by what the new leader's log
// does with them, not with ErrOutcomeUnknown: applied when the new leader
// holds the entry (a graceful handoff), NotLeaderError when it replaced it
// (nothing applied anywhere, so a caller may retry).
func TestStepDownSettlesPending(t *testing.T) {
	tests := []struct {
		name string
		// hold parks the messages that keep the proposal uncommitted on
		// the old leader l.
		hold func(l uint64) func(uint32, *pb.Message) bool
		// applied: the proposal must apply (else NotLeaderError naming the
		// new leader, and it must not apply).
		applied bool
	}{
		{
			name: "followers hold the entry: applied in the new term",
			hold: func(l uint64) func(uint32, *pb.Message) bool {
				return func(_ uint32, m *pb.Message) bool { return m.GetType() == pb.MsgAppResp && m.GetTo() == l }
			},
			applied: true,
		},
		{
			name: "no follower holds the entry: replaced, NotLeaderError",
			hold: func(l uint64) func(uint32, *pb.Message) bool {
				return func(_ uint32, m *pb.Message) bool { return m.GetType() == pb.MsgApp && m.GetFrom() == l }
			},
		},
		{
			// The old leader hears of the new term only from the new
			// leader's first append, which replaces the proposal's entry in
			// the same Ready as the step-down: the log no longer shows
			// where the proposal was.
			name: "replaced before the step-down is seen: NotLeaderError",
			hold: func(l uint64) func(uint32, *pb.Message) bool {
				return func(_ uint32, m *pb.Message) bool {
					switch m.GetType() {
					case pb.MsgApp:
						return m.GetFrom() == l
					case pb.MsgVote, pb.MsgPreVote, pb.MsgHeartbeat:
						return m.GetTo() == l
					}
					return false
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A stopped clock: the orphan patience never runs out, so the
			// log alone settles the proposal however slowly a loaded host
			// runs the test (a CI run once saw ErrOutcomeUnknown here).
			stopped := time.Now()
			c := newCluster(t, 3, func(cfg *Config) {
				cfg.GroupCount, cfg.ShardCount = 1, 1
				cfg.Now = func() time.Time { return stopped }
			})
			ctx := t.Context()
			c.proposeN(t, 0, 3)
			c.converged(t, 0)
			l := c.leader(t, 0)
			lid := l.h.cfg.NodeID
			var to *testNode
			var toID uint64
			for id, n := range c.nodes {
				if id != lid {
					to, toID = n, id
					break
				}
			}
			_, before := to.sms[0].state()
			c.net.setHold(tt.hold(lid))
			done := make(chan error, 1)
			go func() {
				_, err := l.h.Propose(context.WithoutCancel(ctx), 0, u64(100))
				done <- err
			}()
			// The proposal is in the old leader's log, uncommitted.
			var last, commit, term uint64
			await.True(t, "the proposal appended on the leader", func() bool {
				if err := l.h.do(ctx, 0, func(g *group) error {
					last, _ = g.st.LastIndex()
					bs := g.rn.BasicStatus()
					commit, term = bs.GetCommit(), bs.GetTerm()
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				return last > commit
			})
			if tt.applied {
				await.True(t, "the followers to hold the entry", func() bool {
					for id, n := range c.nodes {
						if id == lid {
							continue
						}
						var have uint64
						_ = n.h.do(ctx, 0, func(g *group) error { have, _ = g.st.LastIndex(); return nil })
						if have < last {
							return false
						}
					}
					return true
				})
			}
			// The leader's timeout-now, as a transfer ends: the transferee
			// campaigns at once, and the old leader steps down.
			if err := to.h.Step(0, &pb.Message{Type: pb.MessageType_MsgTimeoutNow.Enum(), From: &lid, To: &toID, Term: &term}); err != nil {
				t.Fatal(err)
			}
			await.True(t, "the transferee to lead", func() bool { return to.h.Status(0).IsLeader })
			c.net.discard()
			var err error
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				// The stopped clock leaves only the log to answer it.
				t.Fatal("the proposal was never settled")
			}
			var nl *NotLeaderError
			switch {
			case tt.applied && err != nil:
				t.Fatalf("Propose = %v, want it applied in the new term", err)
			case !tt.applied && (!errors.As(err, &nl) || nl.LeaderID != toID):
				t.Fatalf("Propose = %v, want NotLeaderError{%d}", err, toID)
			}
			c.converged(t, 0)
			want := before
			if tt.applied {
				want++
			}
			if _, count := to.sms[0].state(); count != want {
				t.Fatalf("the new leader applied %d proposals, want %d", count, want)
			}
		})
	}
}
