package cluster

import (
	"context"
	"errors"
	"testing"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/multiraft"
)

// oldLeaderNet is a leader of an older release: no ReadIndex call, and a
// forwarded Barrier commits at barrierIndex.
type oldLeaderNet struct {
	Network      // any other call panics
	barrierIndex uint64
	forwarded    []*raftv1.ForwardProposeRequest
}

func (n *oldLeaderNet) ReadIndex(context.Context, uint64, uint32) (uint64, uint64, error) {
	return 0, 0, errReadIndexUnsupported
}

func (n *oldLeaderNet) Forward(_ context.Context, _ uint64, req *raftv1.ForwardProposeRequest) (*storagev1.ApplyResult, error) {
	n.forwarded = append(n.forwarded, req)
	return &storagev1.ApplyResult{Index: n.barrierIndex}, nil
}

func TestRemoteReadIndexFallsBackToABarrier(t *testing.T) {
	net := &oldLeaderNet{barrierIndex: 42}
	c := testCluster()
	c.cfg.NodeID, c.net = 1, net
	index, last, err := c.remoteReadIndex(t.Context(), 2, 3)
	if err != nil || index != 42 || last != 42 {
		t.Fatalf("remoteReadIndex = %d, %d, %v; want the barrier's index 42 for both", index, last, err)
	}
	if len(net.forwarded) != 1 || net.forwarded[0].GetBarrier() == nil || net.forwarded[0].GetGroupId() != 3 {
		t.Fatalf("forwarded %v, want one barrier of group 3", net.forwarded)
	}
}

func TestReadIndexError(t *testing.T) {
	for _, tc := range []struct {
		name       string
		err        error
		kind       *fault.Kind
		retryAfter bool
	}{
		{"no leader", &multiraft.NotLeaderError{}, fault.ErrUnavailable, true},
		{"another leader", &multiraft.NotLeaderError{LeaderID: 3}, fault.ErrNotLeader, true},
		{"too many readers", multiraft.ErrTooManyReads, fault.ErrUnavailable, true},
		{"stopped", multiraft.ErrStopped, fault.ErrUnavailable, true},
		{"unknown group", multiraft.ErrUnknownGroup, fault.ErrInvalidArgument, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := readIndexError(7, tc.err)
			var fe *fault.Error
			if !errors.As(err, &fe) || fe.Kind != tc.kind {
				t.Fatalf("readIndexError(%v) = %v, want kind %v", tc.err, err, tc.kind)
			}
			if got := fe.Details[fault.DetailRetryAfterMS] != ""; got != tc.retryAfter {
				t.Fatalf("retry_after_ms present %v, want %v (%v)", got, tc.retryAfter, err)
			}
		})
	}
}
