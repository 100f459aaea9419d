package multiraft

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"
)

// Errors of the membership and leadership operations.
var (
	ErrHasState   = errors.New("multiraft: group already holds state")
	ErrNotVoter   = errors.New("multiraft: target is not a voter of the group")
	ErrConfChange = errors.New("multiraft: membership change refused")
	ErrPlanHeld   = errors.New("multiraft: the replica holds a recovery plan whose new history has not applied")
)

// do runs fn on the group's shard worker and waits for it.
func (h *Host) do(ctx context.Context, groupID uint32, fn func(g *group) error) error {
	if int(groupID) >= len(h.groups) {
		return fmt.Errorf("%w: %d", ErrUnknownGroup, groupID)
	}
	g := h.groups[groupID]
	done := make(chan error, 1)
	wrapped := func(g *group) error {
		err := fn(g)
		g.updateStatus()
		return err
	}
	if err := g.shard.enqueue(op{kind: opFunc, g: g, fn: wrapped, done: done}); err != nil {
		return err
	}
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Bootstrap initializes a group that holds no state with the configured
// voters (the engine calls it once every other voter answered that it holds
// nothing either).
func (h *Host) Bootstrap(ctx context.Context, groupID uint32) error {
	return h.do(ctx, groupID, func(g *group) error {
		if g.hasState {
			return ErrHasState
		}
		peers := make([]raft.Peer, len(h.cfg.Voters))
		for i, v := range h.cfg.Voters {
			peers[i] = raft.Peer{ID: v}
		}
		if err := g.rn.Bootstrap(peers); err != nil {
			return fmt.Errorf("multiraft: group %d: bootstrap: %w", g.id, err)
		}
		g.hasState, g.refuseSteps = true, false
		// A single voter campaigns at once. Several voters wait for an
		// election timeout instead: peers still probing then see a group
		// that holds only its initial membership (term 1, no leader) and
		// initialize it too, rather than joining a group whose election
		// already completed without them.
		if len(h.cfg.Voters) == 1 && !g.wantCampaign {
			g.wantCampaign = true
			g.shard.campaigning++
		} else if len(h.cfg.Voters) > 1 && g.wantCampaign {
			g.wantCampaign = false
			g.shard.campaigning--
		}
		g.logger.Info("initialized group", "voters", h.cfg.Voters)
		return nil
	})
}

// SetVoteFloor prepares a group that holds no state (a wiped replica) to
// take part again: it records term and vote as its hard state, durably, so
// it can never vote twice in a term it may have voted in before its disk
// was lost. It keeps refusing messages until AcceptSteps. The engine calls it once a quorum of
// the other voters reported the same leader at term.
func (h *Host) SetVoteFloor(ctx context.Context, groupID uint32, term, vote uint64) error {
	return h.do(ctx, groupID, func(g *group) error {
		if g.hasState {
			return ErrHasState
		}
		hs := &pb.HardState{Term: proto.Uint64(term), Vote: proto.Uint64(vote), Commit: proto.Uint64(0)}
		g.shard.journal.SetHardState(g.id, hs)
		if err := g.shard.journal.Flush(true); err != nil {
			return fmt.Errorf("multiraft: group %d: persist vote floor: %w", g.id, err)
		}
		g.st.SetHardState(hs)
		rn, err := raft.NewRawNode(g.raftConfig(h, 0))
		if err != nil {
			return fmt.Errorf("multiraft: group %d: restart raft with vote floor: %w", g.id, err)
		}
		g.rn = rn
		g.hasState = true
		g.logger.Info("vote floor set; waiting for the leader to rebuild this replica", "term", term, "vote", vote)
		return nil
	})
}

// AcceptSteps opens a rejoining replica to its peers' messages once the
// leader has dropped it from the voters (so no stale progress of the lost
// log can reach it).
func (h *Host) AcceptSteps(ctx context.Context, groupID uint32) error {
	return h.do(ctx, groupID, func(g *group) error {
		if g.refuseSteps {
			g.refuseSteps = false
			g.logger.Info("rebuilt by the leader: accepting replication")
		}
		return nil
	})
}

// TransferLeader asks the leader of a group to hand leadership to a voter.
func (h *Host) TransferLeader(ctx context.Context, groupID uint32, to uint64) error {
	return h.do(ctx, groupID, func(g *group) error {
		if !g.isLeader {
			return &NotLeaderError{LeaderID: g.leader}
		}
		if !slices.Contains(g.cs.GetVoters(), to) {
			return ErrNotVoter
		}
		if g.plan != nil {
			// The plan's leader keeps its leadership until the group's new
			// history applied: another leader would not start it.
			return ErrPlanHeld
		}
		g.rn.TransferLeader(to)
		return nil
	})
}

// ProposeConfChange proposes a membership change on the group's leader. It
// returns once proposed; callers watch Status for the applied membership.
func (h *Host) ProposeConfChange(ctx context.Context, groupID uint32, cc *pb.ConfChangeV2) error {
	return h.do(ctx, groupID, func(g *group) error {
		if !g.isLeader {
			return &NotLeaderError{LeaderID: g.leader}
		}
		if err := g.rn.ProposeConfChange(cc); err != nil {
			return fmt.Errorf("%w: %v", ErrConfChange, err)
		}
		return nil
	})
}

// Progress returns the leader's view of each replica's match index (empty
// when this node does not lead the group).
func (h *Host) Progress(ctx context.Context, groupID uint32) (map[uint64]uint64, error) {
	out := map[uint64]uint64{}
	err := h.do(ctx, groupID, func(g *group) error {
		if !g.isLeader {
			return &NotLeaderError{LeaderID: g.leader}
		}
		st := g.rn.Status()
		for id, pr := range st.Progress {
			out[id] = pr.Match
		}
		return nil
	})
	return out, err
}

// Acked reports, on group groupID's leader, how long ago each peer last
// answered it (an append or heartbeat response); a peer that never did
// since this node became leader is missing.
func (h *Host) Acked(ctx context.Context, groupID uint32) (map[uint64]time.Duration, error) {
	out := map[uint64]time.Duration{}
	err := h.do(ctx, groupID, func(g *group) error {
		if !g.isLeader {
			return &NotLeaderError{LeaderID: g.leader}
		}
		now := time.Now()
		for id, at := range g.acked {
			out[id] = now.Sub(at)
		}
		return nil
	})
	return out, err
}

// LeadsLive reports whether this node leads group groupID with a quorum
// of every voter set (itself counted) that answered it within the last 3
// seconds (the seed's live leader; see group.leadsLive).
func (h *Host) LeadsLive(ctx context.Context, groupID uint32) (bool, error) {
	live := false
	err := h.do(ctx, groupID, func(g *group) error {
		live = g.isLeader && g.leadsLive(time.Now())
		return nil
	})
	return live, err
}

// SetShedding turns the maintenance drain on or off: while on, the node
// does not campaign for any group.
func (h *Host) SetShedding(on bool) { h.shedding.Store(on) }

// Shedding reports whether the maintenance drain is on.
func (h *Host) Shedding() bool { return h.shedding.Load() }
