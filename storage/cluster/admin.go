package cluster

import (
	"context"
	"slices"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/multiraft"
)

// The operator's view of the groups (the admin plane calls these). Every
// error is a storage error (package fault).

// TransferLeader asks this node, the group's leader, to hand leadership
// to a voter. The target must be eligible as for every handoff: a voter
// that holds every committed entry, is not being rebuilt, and takes
// transfers (not drained); otherwise nothing is started.
func (c *Cluster) TransferLeader(ctx context.Context, g uint32, to uint64) error {
	if err := c.checkGroup(g); err != nil {
		return err
	}
	st := c.host.Status(g)
	switch {
	case !st.IsLeader:
		return notLeader(st.LeaderID, "this node does not lead the group")
	case !slices.Contains(st.Voters, to):
		return fault.Errorf(fault.ErrNotAVoter, "node %d is not a voter of group %d", to, g)
	case to != c.cfg.NodeID && !slices.Contains(c.eligible(ctx, g), to):
		return fault.Errorf(fault.ErrTransferTargetNotEligible,
			"node %d may not take group %d's leadership now: it is drained, gated, being rebuilt, unreachable or behind the commit index", to, g)
	}
	return raftError(c.host.TransferLeader(ctx, g, to))
}

// AddLearner adds node as a learner of group g (on its leader) and, with
// wait, returns once the membership holds it.
func (c *Cluster) AddLearner(ctx context.Context, g uint32, node uint64, wait bool) error {
	if err := c.checkGroup(g); err != nil {
		return err
	}
	if err := c.host.ProposeConfChange(ctx, g, confChange(pb.ConfChangeAddLearnerNode, node)); err != nil {
		return raftError(err)
	}
	if wait {
		return c.waitMembership(ctx, g, "the learner was not added in time", func(st multiraft.GroupStatus) bool {
			return slices.Contains(st.Learners, node)
		})
	}
	return nil
}

// SetVoters replaces group g's voter set in one joint change (on its
// leader) and returns the commit index once the new set is in force.
func (c *Cluster) SetVoters(ctx context.Context, g uint32, want []uint64) (uint64, error) {
	if err := c.checkGroup(g); err != nil {
		return 0, err
	}
	st := c.host.Status(g)
	if !st.IsLeader {
		return 0, notLeader(st.LeaderID, "this node does not lead the group")
	}
	cc := &pb.ConfChangeV2{}
	for _, id := range want {
		if !slices.Contains(st.Voters, id) {
			cc.Changes = append(cc.Changes, confChange(pb.ConfChangeAddNode, id).Changes...)
		}
	}
	for _, id := range st.Voters {
		if !slices.Contains(want, id) {
			cc.Changes = append(cc.Changes, confChange(pb.ConfChangeRemoveNode, id).Changes...)
		}
	}
	if len(cc.Changes) > 0 {
		if err := c.host.ProposeConfChange(ctx, g, cc); err != nil {
			return 0, raftError(err)
		}
	}
	sorted := slices.Sorted(slices.Values(want))
	err := c.waitMembership(ctx, g, "the new voter set did not commit in time", func(st multiraft.GroupStatus) bool {
		return slices.Equal(slices.Sorted(slices.Values(st.Voters)), sorted)
	})
	if err != nil {
		return 0, err
	}
	return c.host.Status(g).Commit, nil
}

// membershipWait bounds how long a membership change may take to apply.
const membershipWait = 10 * time.Second

// waitMembership waits, on the host's status changes, until done holds.
func (c *Cluster) waitMembership(ctx context.Context, g uint32, timeout string, done func(multiraft.GroupStatus) bool) error {
	ctx, cancel := context.WithTimeout(ctx, membershipWait)
	defer cancel()
	for {
		changed := c.host.StatusChanged()
		if done(c.host.Status(g)) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fault.Errorf(fault.ErrUnavailable, "%s", timeout).With(fault.DetailRetryAfterMS, "1000")
		}
	}
}

// Snapshot makes group g hold a snapshot of everything it has applied and
// returns its index; a request its shard worker did not start within
// startWithin is dropped (unavailable, retry).
func (c *Cluster) Snapshot(ctx context.Context, g uint32, startWithin time.Duration) (uint64, error) {
	if err := c.checkGroup(g); err != nil {
		return 0, err
	}
	index, err := c.host.Snapshot(ctx, g, startWithin)
	return index, raftError(err)
}

// PurgeLog purges group g's log through min(upto, its snapshot index) and
// returns the index it purged through.
func (c *Cluster) PurgeLog(ctx context.Context, g uint32, upto uint64, startWithin time.Duration) (uint64, error) {
	if err := c.checkGroup(g); err != nil {
		return 0, err
	}
	through, err := c.host.PurgeLog(ctx, g, upto, startWithin)
	return through, raftError(err)
}

// ShardStats are the shard workers' counters (metrics).
func (c *Cluster) ShardStats() []multiraft.ShardStats { return c.host.ShardStats() }

// Erasure returns the deleted-data gauges (multiraft, deleted.go).
func (c *Cluster) Erasure() multiraft.ErasureStats { return c.host.Erasure() }

// SyncJournals flushes every journal to disk.
func (c *Cluster) SyncJournals() error { return c.host.Sync() }

func (c *Cluster) checkGroup(g uint32) error {
	if int(g) >= len(c.machines) {
		return fault.Errorf(fault.ErrInvalidArgument, "group %d out of range [0, %d)", g, len(c.machines))
	}
	return nil
}
