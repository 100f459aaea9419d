package cluster

import (
	"context"
	"errors"
	"time"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/multiraft"
)

// Linearizable reads. A read barrier of group g makes this node's replica
// at least as current as every write acknowledged before the barrier
// began: the group's leader confirms its leadership with a quorum
// heartbeat round (Raft's ReadIndex, multiraft.Host.ReadIndex; the
// readers of a group waiting together share one round) and returns its
// commit index, and the replica waits until it applied that index. On the
// leader that is its own ReadIndex; a follower asks the leader
// (ForwardService.ReadIndex). No clock is trusted, so a leader cut off
// from its quorum serves nothing stale: its readers wait until it steps
// down or their bound ends, and are answered UNAVAILABLE. The recovery
// gate asks the leader the same way (gate.go).

// readBarrierWait bounds one read barrier: a leader cut off from its
// quorum answers no read index until check-quorum steps it down (an
// election timeout), and a replica far behind its leader is better
// retried later than waited for.
const readBarrierWait = 5 * time.Second

// errReadIndexUnsupported is a leader of an older release, which has no
// ReadIndex call.
var errReadIndexUnsupported = errors.New("cluster: the leader does not serve read indexes")

// ReadBarrier waits until this node's replica of group g reflects every
// write acknowledged before the call, within readBarrierWait. It fails
// with UNAVAILABLE (retry-after) when no leader confirms its leadership in
// time or the replica does not catch up, with NOT_LEADER when the node it
// asked no longer leads, and with ctx's error.
func (c *Cluster) ReadBarrier(ctx context.Context, g uint32) error {
	if int(g) >= len(c.machines) {
		return fault.Errorf(fault.ErrInvalidArgument, "group %d out of range", g)
	}
	bctx, cancel := context.WithTimeout(ctx, readBarrierWait)
	defer cancel()
	index, _, err := c.readIndex(bctx, g)
	if err == nil {
		err = c.host.WaitApplied(bctx, g, index)
	}
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, context.DeadlineExceeded):
		return fault.Errorf(fault.ErrUnavailable, "group %d: no read confirmed within %v (its leader may be cut off from its quorum, or this replica lags)", g, readBarrierWait).
			With(fault.DetailRetryAfterMS, "500")
	}
	return raftError(err)
}

// readIndex returns a read index of group g and the last index of its
// leader's log when the index was confirmed: from this node's Raft host
// when it leads the group, else from the leader.
func (c *Cluster) readIndex(ctx context.Context, g uint32) (index, last uint64, err error) {
	st := c.host.Status(g)
	leader := st.LeaderID
	if st.IsLeader || !c.MultiNode() {
		index, err = c.host.ReadIndex(ctx, g)
		if err == nil {
			return index, c.host.Status(g).LastIndex, nil
		}
		var nl *multiraft.NotLeaderError
		if !errors.As(err, &nl) || !c.MultiNode() || nl.LeaderID == 0 {
			return 0, 0, readIndexError(g, err)
		}
		leader = nl.LeaderID // it lost the leadership meanwhile: ask the new leader
	}
	if leader == 0 {
		return 0, 0, readIndexError(g, &multiraft.NotLeaderError{})
	}
	return c.remoteReadIndex(ctx, leader, g)
}

// remoteReadIndex asks leader for a read index of group g and its last
// index.
func (c *Cluster) remoteReadIndex(ctx context.Context, leader uint64, g uint32) (index, last uint64, err error) {
	if c.net == nil || leader == c.cfg.NodeID {
		return 0, 0, readIndexError(g, &multiraft.NotLeaderError{})
	}
	index, last, err = c.net.ReadIndex(ctx, leader, g)
	if !errors.Is(err, errReadIndexUnsupported) {
		return index, last, err
	}
	// A leader of an older release (a rolling upgrade): a barrier it
	// commits is a read index too, and, as the last entry of its log when
	// proposed, its last index.
	res, err := c.forward(ctx, leader, &raftv1.ForwardProposeRequest{GroupId: g, Op: &raftv1.ForwardProposeRequest_Barrier{Barrier: &storagev1.Barrier{}}})
	if err != nil {
		return 0, 0, err
	}
	return res.Index, res.Index, nil
}

// ReadIndexForwarded answers a peer's ReadIndex on this node, the group's
// leader (Local).
func (c *Cluster) ReadIndexForwarded(ctx context.Context, g uint32) (index, last uint64, err error) {
	if int(g) >= len(c.machines) {
		return 0, 0, fault.Errorf(fault.ErrInvalidArgument, "group %d out of range", g)
	}
	index, err = c.host.ReadIndex(ctx, g)
	if err != nil {
		return 0, 0, readIndexError(g, err)
	}
	return index, c.host.Status(g).LastIndex, nil
}

// readIndexError translates the Raft host's refusal of a read index: no
// leader and too many readers are worth a retry soon.
func readIndexError(g uint32, err error) error {
	var nl *multiraft.NotLeaderError
	switch {
	case errors.As(err, &nl) && nl.LeaderID == 0:
		return fault.Errorf(fault.ErrUnavailable, "group %d has no leader", g).With(fault.DetailRetryAfterMS, "500")
	case errors.Is(err, multiraft.ErrTooManyReads):
		return fault.Errorf(fault.ErrUnavailable, "group %d: too many reads wait for a read index", g).With(fault.DetailRetryAfterMS, "100")
	}
	return raftError(err)
}
