package multiraft

import (
	"context"
	"sync"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/tests/await"
)

// TestProposalsOfABatchShareAMsgApp: the proposals a shard worker takes
// from its mailbox at once reach each follower in one MsgApp carrying all
// of them, not in one message each, and each proposer gets its own
// result.
func TestProposalsOfABatchShareAMsgApp(t *testing.T) {
	const k = 20
	c := newCluster(t, 3, func(cfg *Config) { cfg.GroupCount, cfg.ShardCount = 1, 1 })
	ctx := t.Context()
	c.proposeN(t, 0, 3)
	c.converged(t, 0)
	l := c.leader(t, 0)
	lid := l.h.cfg.NodeID

	var mu sync.Mutex
	apps := map[uint64][]int{} // follower -> entries of each MsgApp carrying some
	c.net.setHold(func(_ uint32, m *pb.Message) bool {
		if m.GetType() == pb.MessageType_MsgApp && m.GetFrom() == lid && len(m.GetEntries()) > 0 {
			mu.Lock()
			apps[m.GetTo()] = append(apps[m.GetTo()], len(m.GetEntries()))
			mu.Unlock()
		}
		return false
	})
	// Keep the worker busy while k proposals queue up in its mailbox.
	running, release := make(chan struct{}), make(chan struct{})
	go func() {
		_ = l.h.do(context.WithoutCancel(ctx), 0, func(*group) error {
			close(running)
			<-release
			return nil
		})
	}()
	<-running
	var wg sync.WaitGroup
	errs := make(chan error, k)
	for i := range k {
		wg.Go(func() {
			_, err := l.h.Propose(context.WithoutCancel(ctx), 0, u64(uint64(100+i)))
			errs <- err
		})
	}
	s := l.h.groups[0].shard
	await.True(t, "the proposals queued", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.inbox) == k
	})
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("Propose: %v", err)
		}
	}
	c.net.setHold(nil)
	c.converged(t, 0)
	mu.Lock()
	defer mu.Unlock()
	for id := range c.nodes {
		if id == lid {
			continue
		}
		if got := apps[id]; len(got) != 1 || got[0] != k {
			t.Errorf("follower %d got MsgApps of %v entries, want one of %d", id, got, k)
		}
	}
	if _, count := l.sms[0].state(); count != 3+k {
		t.Fatalf("the leader applied %d proposals, want %d", count, 3+k)
	}
}
