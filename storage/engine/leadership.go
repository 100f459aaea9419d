package engine

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/storage/multiraft"
)

// Leadership upkeep on a multi-node cluster, one pass per tick:
//   - drain: a node in maintenance drain hands its leaderships away;
//   - balance: a node leading more than its share hands one group to the
//     voter leading the fewest (one transfer per tick);
//   - watchdog: a leader whose log has entries it cannot commit for
//     commitStall hands leadership away;
//   - membership: a leader keeps every configured voter in the group: it
//     removes a voter that reported a lost log, adds missing configured
//     nodes as learners and promotes learners that caught up.

const (
	leadershipTick = time.Second
	commitStall    = 5 * time.Second
)

// ShedPeer reports whether a peer may take leaderships (not draining, same
// cluster). The node supplies it from the peers' shed state.
type ShedPeer func(ctx context.Context, peer uint64) bool

// SetShedPeer installs the eligibility check used by handoffs.
func (e *Engine) SetShedPeer(f ShedPeer) { e.shedPeer.Store(&f) }

// SetDraining turns the maintenance drain on or off.
func (e *Engine) SetDraining(on bool) { e.host.SetShedding(on) }

// Draining reports the maintenance drain.
func (e *Engine) Draining() bool { return e.host.Shedding() }

type stallWatch struct {
	commit uint64
	since  time.Time
}

func (e *Engine) leadershipLoop(ctx context.Context) {
	if !e.multiNode() {
		return
	}
	t := time.NewTicker(leadershipTick)
	defer t.Stop()
	stalls := make(map[uint32]stallWatch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		e.reconcileMembership(ctx)
		e.watchCommits(ctx, stalls)
		if e.Draining() {
			e.HandOffLeaderships(ctx, 1)
		} else {
			e.balanceOnce(ctx)
		}
		e.requestRebuilds(ctx)
	}
}

// eligible lists voters of a group, other than this node, that may take
// its leadership: not draining, caught up to the leader's commit.
func (e *Engine) eligible(ctx context.Context, g uint32) []uint64 {
	st := e.host.Status(g)
	prog, err := e.host.Progress(ctx, g)
	if err != nil {
		return nil
	}
	var out []uint64
	check := e.shedPeer.Load()
	for _, v := range st.Voters {
		if v == e.cfg.NodeID || prog[v] < st.Commit {
			continue
		}
		if _, rebuilding := e.rebuilds.Load(rebuildKey{g, v}); rebuilding {
			continue
		}
		if check != nil && !(*check)(ctx, v) {
			continue
		}
		out = append(out, v)
	}
	return out
}

// HandOffLeaderships transfers up to max leaderships (0: all) of this node
// to eligible voters and returns how many it started.
func (e *Engine) HandOffLeaderships(ctx context.Context, max int) int {
	started := 0
	for g := range e.machines {
		if max > 0 && started >= max {
			break
		}
		if !e.host.Status(uint32(g)).IsLeader {
			continue
		}
		targets := e.eligible(ctx, uint32(g))
		if len(targets) == 0 {
			continue
		}
		to := targets[g%len(targets)]
		if err := e.host.TransferLeader(ctx, uint32(g), to); err == nil {
			started++
		}
	}
	return started
}

// LeaderCount is how many groups this node leads.
func (e *Engine) LeaderCount() int {
	n := 0
	for g := range e.machines {
		if e.host.Status(uint32(g)).IsLeader {
			n++
		}
	}
	return n
}

// balanceOnce moves one leadership from this node to the least loaded
// eligible voter when this node leads more than its share.
func (e *Engine) balanceOnce(ctx context.Context) {
	voters := e.cfg.Voters()
	counts := make(map[uint64]int, len(voters))
	for _, v := range voters {
		counts[v] = 0
	}
	for g := range e.machines {
		if l := e.host.Status(uint32(g)).LeaderID; l != 0 {
			counts[l]++
		}
	}
	mine := counts[e.cfg.NodeID]
	fair := (len(e.machines) + len(voters) - 1) / len(voters)
	if mine <= fair {
		return
	}
	for g := range e.machines {
		if !e.host.Status(uint32(g)).IsLeader {
			continue
		}
		targets := e.eligible(ctx, uint32(g))
		slices.SortFunc(targets, func(a, b uint64) int { return counts[a] - counts[b] })
		if len(targets) == 0 || counts[targets[0]]+1 >= mine {
			continue
		}
		if err := e.host.TransferLeader(ctx, uint32(g), targets[0]); err == nil {
			e.logger.Info("balancer moved a leadership", "group_id", g, "to", targets[0])
			return
		}
	}
}

// watchCommits hands leadership away from groups whose log stopped
// committing while it holds uncommitted entries.
func (e *Engine) watchCommits(ctx context.Context, stalls map[uint32]stallWatch) {
	now := time.Now()
	for g := range e.machines {
		st := e.host.Status(uint32(g))
		if !st.IsLeader || st.LastIndex <= st.Commit {
			delete(stalls, uint32(g))
			continue
		}
		w, ok := stalls[uint32(g)]
		if !ok || w.commit != st.Commit {
			stalls[uint32(g)] = stallWatch{commit: st.Commit, since: now}
			continue
		}
		if now.Sub(w.since) < commitStall {
			continue
		}
		e.commitStalls.Add(1)
		e.logger.Warn("commit stalled: handing leadership away", "group_id", g, "commit", st.Commit, "last_index", st.LastIndex)
		if targets := e.eligible(ctx, uint32(g)); len(targets) > 0 {
			_ = e.host.TransferLeader(ctx, uint32(g), targets[0])
		}
		delete(stalls, uint32(g))
	}
}

// rebuildKey names a replica that reported a lost log.
type rebuildKey struct {
	group uint32
	node  uint64
}

// RequestRebuild is called on a group's leader by a replica that lost its
// log. It reports done once the replica is no longer a voter.
func (e *Engine) RequestRebuild(ctx context.Context, g uint32, node uint64) (bool, error) {
	if int(g) >= len(e.machines) {
		return false, errors.New("engine: group out of range")
	}
	st := e.host.Status(g)
	if !st.IsLeader {
		return false, raftError(&multiraft.NotLeaderError{LeaderID: st.LeaderID})
	}
	// The replica is rebuilt once the leader holds no progress of its lost
	// log: it is not a voter, and it is either no member at all or a
	// learner added back afresh (match 0; it acknowledges nothing until it
	// accepts replication). A learner that had caught up before the loss is
	// removed and added back too.
	if !slices.Contains(st.Voters, node) {
		if !slices.Contains(st.Learners, node) {
			return true, nil
		}
		prog, err := e.host.Progress(ctx, g)
		if err != nil {
			return false, raftError(err)
		}
		if prog[node] == 0 {
			return true, nil
		}
	}
	e.rebuilds.Store(rebuildKey{g, node}, true)
	return false, nil
}

// reconcileMembership keeps each led group at the configured voters.
func (e *Engine) reconcileMembership(ctx context.Context) {
	configured := e.cfg.Voters()
	for g := range e.machines {
		st := e.host.Status(uint32(g))
		if !st.IsLeader {
			continue
		}
		var cc *pb.ConfChangeV2
		// 1. Remove a replica that lost its log (one change at a time).
		for _, v := range append(slices.Clone(st.Voters), st.Learners...) {
			if _, ok := e.rebuilds.Load(rebuildKey{uint32(g), v}); ok && v != e.cfg.NodeID {
				cc = confChange(pb.ConfChangeRemoveNode, v)
				e.rebuilds.Delete(rebuildKey{uint32(g), v})
				e.logger.Warn("removing a voter that lost its log; it comes back as a learner", "group_id", g, "node_id", v)
				break
			}
		}
		// 2. Add configured nodes that are missing as learners.
		if cc == nil {
			for _, v := range configured {
				if !slices.Contains(st.Voters, v) && !slices.Contains(st.Learners, v) {
					cc = confChange(pb.ConfChangeAddLearnerNode, v)
					break
				}
			}
		}
		// 3. Promote learners that caught up.
		if cc == nil && len(st.Learners) > 0 {
			prog, err := e.host.Progress(ctx, uint32(g))
			if err == nil {
				for _, v := range st.Learners {
					if slices.Contains(configured, v) && prog[v] >= st.Commit && st.Commit > 0 {
						cc = confChange(pb.ConfChangeAddNode, v)
						break
					}
				}
			}
		}
		if cc != nil {
			if err := e.host.ProposeConfChange(ctx, uint32(g), cc); err != nil {
				e.logger.Warn("membership change failed", "group_id", g, "err", err)
			}
		}
	}
}

func confChange(t pb.ConfChangeType, node uint64) *pb.ConfChangeV2 {
	return &pb.ConfChangeV2{Changes: []*pb.ConfChangeSingle{{Type: t.Enum(), NodeId: proto.Uint64(node)}}}
}

// requestRebuilds asks leaders to rebuild the groups this node rejoined
// with a vote floor; once a leader has dropped this node from the voters,
// the replica starts accepting replication (it comes back as a learner).
func (e *Engine) requestRebuilds(ctx context.Context) {
	d := e.cluster.Load()
	if d == nil || d.Rebuilder == nil {
		return
	}
	e.rejoined.Range(func(k, v any) bool {
		g, leader := k.(uint32), v.(uint64)
		done, err := d.Rebuilder.RequestRebuild(ctx, leader, g, e.cfg.NodeID)
		var de *errcode.Error
		switch {
		case err == nil && done:
			if err := e.host.AcceptSteps(ctx, g); err == nil {
				e.rejoined.Delete(g)
			}
		case errors.As(err, &de) && de.Code == errcode.NotLeader:
			if id, perr := strconv.ParseUint(de.Metadata[errcode.KeyLeaderID], 10, 64); perr == nil && id != 0 {
				e.rejoined.Store(g, id)
			}
		}
		return true
	})
}

// RejoinPending lists the groups this node joined as a wiped replica and
// that their leader has not rebuilt yet (it must not count as a healthy
// voter of them).
func (e *Engine) RejoinPending() []uint32 {
	var out []uint32
	e.rejoined.Range(func(k, _ any) bool {
		out = append(out, k.(uint32))
		return true
	})
	slices.Sort(out)
	return out
}
