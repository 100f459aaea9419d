package cluster

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	pb "go.etcd.io/raft/v3/raftpb"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/wal"
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

// SetDraining turns the drain on or off for this process only: a draining
// node does not campaign, and hands its leaderships away (a graceful
// shutdown's handoff).
func (c *Cluster) SetDraining(on bool) { c.host.SetShedding(on) }

// maintenanceDrainFile marks an operator's maintenance drain in the data
// directory, so that the mark survives restarts until undrain.
const maintenanceDrainFile = "maintenance_drain"

// SetMaintenanceDrain turns an operator's maintenance drain on or off: as
// SetDraining, and recorded durably in the data directory first, so that a
// node restarted during a rollout stays drained until it is undrained.
func (c *Cluster) SetMaintenanceDrain(on bool) error {
	path := filepath.Join(c.cfg.DataDir, maintenanceDrainFile)
	if on {
		if err := wal.WriteFileAtomic(wal.OSFS{}, c.cfg.DataDir, path, []byte("maintenance-drain\n")); err != nil {
			return fault.Errorf(fault.ErrInternal, "record the maintenance drain: %v", err)
		}
	} else if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fault.Errorf(fault.ErrInternal, "clear the maintenance drain: %v", err)
	} else if err := wal.SyncDir(wal.OSFS{}, c.cfg.DataDir); err != nil {
		return fault.Errorf(fault.ErrInternal, "clear the maintenance drain: %v", err)
	}
	c.SetDraining(on)
	return nil
}

// restoreMaintenanceDrain puts a node whose data directory records a
// maintenance drain back in it at start.
func (c *Cluster) restoreMaintenanceDrain() {
	if _, err := os.Stat(filepath.Join(c.cfg.DataDir, maintenanceDrainFile)); err == nil {
		c.SetDraining(true)
		c.logger.Warn("the node starts drained: an operator's maintenance drain is still recorded (ursulactl undrain clears it)")
	}
}

// Draining reports the maintenance drain.
func (c *Cluster) Draining() bool { return c.host.Shedding() }

type stallWatch struct {
	commit uint64
	since  time.Time
}

func (c *Cluster) leadershipLoop(ctx context.Context) {
	if !c.MultiNode() {
		return
	}
	t := time.NewTicker(c.cfg.LeadershipTick)
	defer t.Stop()
	defer c.gates.wg.Wait()
	stalls := make(map[uint32]stallWatch)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c.openGates(ctx)
		c.drivePlans(ctx)
		c.reconcileMembership(ctx)
		c.watchCommits(ctx, stalls)
		if c.Draining() {
			c.HandOffLeaderships(ctx, 1)
		} else {
			c.balanceOnce(ctx)
		}
		c.requestRebuilds(ctx)
	}
}

// handoffAckWindow is how recently a handoff's target must have answered
// the leader: the minimum election timeout (the seed's 1.5 s rule), so that
// a voter the leader cannot reach, or that just lost its disk, is never
// handed a group.
const handoffAckWindow = 1500 * time.Millisecond

// eligible lists voters of a group, other than this node, that may take
// its leadership: answered the leader within handoffAckWindow, hold every
// committed entry, are not being rebuilt, and take transfers (not
// drained).
func (c *Cluster) eligible(ctx context.Context, g uint32) []uint64 {
	if c.net == nil {
		return nil
	}
	st := c.host.Status(g)
	prog, err := c.host.Progress(ctx, g)
	if err != nil {
		return nil
	}
	acked, err := c.host.Acked(ctx, g)
	if err != nil {
		return nil
	}
	var out []uint64
	for _, v := range st.Voters {
		if v == c.cfg.NodeID || prog[v] < st.Commit {
			continue
		}
		if age, ok := acked[v]; !ok || age > handoffAckWindow {
			continue
		}
		if _, rebuilding := c.rebuilds.Load(rebuildKey{g, v}); rebuilding {
			continue
		}
		if !c.net.AcceptsTransfers(ctx, v, g) {
			continue
		}
		out = append(out, v)
	}
	return out
}

// HandOffLeaderships transfers up to max leaderships (0: all) of this node
// to eligible voters and returns how many it started.
func (c *Cluster) HandOffLeaderships(ctx context.Context, max int) int {
	started := 0
	for g := range c.machines {
		if max > 0 && started >= max {
			break
		}
		if !c.host.Status(uint32(g)).IsLeader {
			continue
		}
		targets := c.eligible(ctx, uint32(g))
		if len(targets) == 0 {
			continue
		}
		to := targets[g%len(targets)]
		if err := c.host.TransferLeader(ctx, uint32(g), to); err == nil {
			started++
		}
	}
	return started
}

// LeaderCount is how many groups this node leads.
func (c *Cluster) LeaderCount() int {
	n := 0
	for g := range c.machines {
		if c.host.Status(uint32(g)).IsLeader {
			n++
		}
	}
	return n
}

// balanceOnce moves one leadership from this node to the least loaded
// eligible voter when this node leads more than its share.
func (c *Cluster) balanceOnce(ctx context.Context) {
	voters := c.cfg.Voters()
	counts := make(map[uint64]int, len(voters))
	for _, v := range voters {
		counts[v] = 0
	}
	for g := range c.machines {
		if l := c.host.Status(uint32(g)).LeaderID; l != 0 {
			counts[l]++
		}
	}
	mine := counts[c.cfg.NodeID]
	fair := (len(c.machines) + len(voters) - 1) / len(voters)
	if mine <= fair {
		return
	}
	for g := range c.machines {
		if !c.host.Status(uint32(g)).IsLeader {
			continue
		}
		targets := c.eligible(ctx, uint32(g))
		slices.SortFunc(targets, func(a, b uint64) int { return counts[a] - counts[b] })
		if len(targets) == 0 || counts[targets[0]]+1 >= mine {
			continue
		}
		if err := c.host.TransferLeader(ctx, uint32(g), targets[0]); err == nil {
			c.logger.Info("balancer moved a leadership", "group_id", g, "to", targets[0])
			return
		}
	}
}

// watchCommits hands leadership away from groups whose log stopped
// committing while it holds uncommitted entries.
func (c *Cluster) watchCommits(ctx context.Context, stalls map[uint32]stallWatch) {
	now := c.now()
	for g := range c.machines {
		st := c.host.Status(uint32(g))
		if !st.IsLeader || st.LastIndex <= st.Commit {
			delete(stalls, uint32(g))
			continue
		}
		w, ok := stalls[uint32(g)]
		if !ok || w.commit != st.Commit {
			stalls[uint32(g)] = stallWatch{commit: st.Commit, since: now}
			continue
		}
		if now.Sub(w.since) < c.cfg.CommitStall {
			continue
		}
		c.commitStalls.Add(1)
		c.logger.Warn("commit stalled: handing leadership away", "group_id", g, "commit", st.Commit, "last_index", st.LastIndex)
		if targets := c.eligible(ctx, uint32(g)); len(targets) > 0 {
			_ = c.host.TransferLeader(ctx, uint32(g), targets[0])
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
// log or its tail, node, through peer from; lastIndex is where the
// replica's log ends now (0 when it lost everything). It reports done once
// the replica is no longer a voter, or when it holds everything it
// acknowledged (no rebuild needed). A node asks only for itself: a request
// for another node is refused, since it would remove a healthy voter.
func (c *Cluster) RequestRebuild(ctx context.Context, from uint64, g uint32, node, lastIndex uint64) (bool, error) {
	if from != node {
		c.logger.Warn("refused a rebuild request for another node", "from_node_id", from, "node_id", node, "group_id", g)
		return false, fault.Errorf(fault.ErrPermissionDenied, "node %d may ask a rebuild of its own replica only, not of node %d", from, node)
	}
	if int(g) >= len(c.machines) {
		return false, fault.Errorf(fault.ErrInvalidArgument, "group %d out of range", g)
	}
	st := c.host.Status(g)
	if !st.IsLeader {
		return false, notLeader(st.LeaderID, "not the leader of this group")
	}
	// The replica is rebuilt once the leader holds no progress of its lost
	// log: it is not a voter, and it is either no member at all or a
	// learner added back afresh (match 0; it acknowledges nothing until it
	// accepts replication). A learner that had caught up before the loss is
	// removed and added back too.
	prog, err := c.host.Progress(ctx, g)
	if err != nil {
		return false, raftError(err)
	}
	if !slices.Contains(st.Voters, node) {
		if !slices.Contains(st.Learners, node) || prog[node] == 0 {
			return true, nil
		}
	} else {
		if lastIndex > 0 && prog[node] <= lastIndex {
			return true, nil // it holds everything it acknowledged
		}
		// Removing a voter must not cost the group its quorum: the voters
		// that kept their log and answered recently, the leader counted,
		// must be a majority without it. Otherwise the removal could not
		// commit, and the replica waits (behind its gate) instead.
		if !c.healthyQuorumWithout(ctx, g, st, prog, node) {
			return false, fault.Errorf(fault.ErrUnavailable, "group %d has no quorum of healthy voters without node %d: it cannot be rebuilt now", g, node).
				With(fault.DetailRetryAfterMS, "1000")
		}
	}
	if _, already := c.rebuilds.LoadOrStore(rebuildKey{g, node}, true); !already {
		c.logger.Warn("a replica lost entries it had acknowledged: rebuilding it", "group_id", g, "node_id", node,
			"acknowledged", prog[node], "last_index", lastIndex)
	}
	return false, nil
}

// healthyQuorumWithout reports whether the voters of group g other than
// node that hold every committed entry and answered the leader within
// handoffAckWindow, the leader counted, are a majority of the voters.
func (c *Cluster) healthyQuorumWithout(ctx context.Context, g uint32, st multiraft.GroupStatus, prog map[uint64]uint64, node uint64) bool {
	acked, err := c.host.Acked(ctx, g)
	if err != nil {
		return false
	}
	healthy := 0
	for _, v := range st.Voters {
		switch {
		case v == node:
		case v == c.cfg.NodeID:
			healthy++
		case prog[v] >= st.Commit:
			if age, ok := acked[v]; ok && age <= handoffAckWindow {
				healthy++
			}
		}
	}
	return healthy > len(st.Voters)/2
}

// reconcileMembership keeps each led group at the configured voters.
func (c *Cluster) reconcileMembership(ctx context.Context) {
	configured := c.cfg.Voters()
	for g := range c.machines {
		st := c.host.Status(uint32(g))
		if !st.IsLeader {
			continue
		}
		var cc *pb.ConfChangeV2
		// 1. Remove a replica that lost its log (one change at a time).
		for _, v := range append(slices.Clone(st.Voters), st.Learners...) {
			if _, ok := c.rebuilds.Load(rebuildKey{uint32(g), v}); ok && v != c.cfg.NodeID {
				cc = confChange(pb.ConfChangeRemoveNode, v)
				c.rebuilds.Delete(rebuildKey{uint32(g), v})
				c.logger.Warn("removing a voter that lost its log; it comes back as a learner", "group_id", g, "node_id", v)
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
			prog, err := c.host.Progress(ctx, uint32(g))
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
			if err := c.host.ProposeConfChange(ctx, uint32(g), cc); err != nil {
				c.logger.Warn("membership change failed", "group_id", g, "err", err)
			}
		}
	}
}

// requestRebuilds asks leaders to rebuild the groups this node rejoined
// with a vote floor; once a leader has dropped this node from the voters,
// the replica starts accepting replication (it comes back as a learner).
func (c *Cluster) requestRebuilds(ctx context.Context) {
	c.rejoined.Range(func(k, v any) bool {
		g, leader := k.(uint32), v.(uint64)
		done, err := c.net.RequestRebuild(ctx, leader, g, c.cfg.NodeID, 0)
		switch {
		case err == nil && done:
			if err := c.host.AcceptSteps(ctx, g); err == nil {
				c.rejoined.Delete(g)
			}
		case errors.Is(err, fault.ErrNotLeader):
			if id, perr := strconv.ParseUint(fault.Detail(err, fault.DetailLeaderID), 10, 64); perr == nil && id != 0 {
				c.rejoined.Store(g, id)
			}
		}
		return true
	})
}

// RejoinPending lists the groups this node joined as a wiped replica and
// that their leader has not rebuilt yet (it must not count as a healthy
// voter of them).
func (c *Cluster) RejoinPending() []uint32 {
	var out []uint32
	c.rejoined.Range(func(k, _ any) bool {
		out = append(out, k.(uint32))
		return true
	})
	slices.Sort(out)
	return out
}

// CommitStalls counts commit-stall watchdog interventions.
func (c *Cluster) CommitStalls() uint64 { return c.commitStalls.Load() }

// ShedState is this node's leadership-shed state, as the seed's
// /__ursula/leadership-shed documents it (Local).
func (c *Cluster) ShedState() *raftv1.ShedState {
	if c.Draining() {
		return &raftv1.ShedState{ClusterId: c.cfg.ClusterID, NodeId: c.cfg.NodeID, Bits: 1, State: "maintenance-drain",
			ShouldAcceptTransfer: false, ShouldCampaign: false, ShouldShedCurrentLeaders: true, GatedGroups: c.noTransferGroups()}
	}
	return &raftv1.ShedState{ClusterId: c.cfg.ClusterID, NodeId: c.cfg.NodeID, Bits: 0, State: "normal",
		ShouldAcceptTransfer: true, ShouldCampaign: true, ShouldShedCurrentLeaders: false, GatedGroups: c.noTransferGroups()}
}

// noTransferGroups are the groups whose replica here takes no leadership:
// behind the recovery gate, or holding a recovery plan.
func (c *Cluster) noTransferGroups() []uint32 {
	out := c.host.Gated()
	for g := range c.host.Plans() {
		if !slices.Contains(out, g) {
			out = append(out, g)
		}
	}
	slices.Sort(out)
	return out
}

// HandOffAll hands every leadership of this node to eligible voters (a
// graceful stop), retrying as leaderships move, and reports whether the
// node leads nothing before ctx ends.
func (c *Cluster) HandOffAll(ctx context.Context) bool {
	for {
		changed := c.host.StatusChanged()
		if c.LeaderCount() == 0 {
			return true
		}
		c.HandOffLeaderships(ctx, 0)
		select {
		case <-changed:
		case <-time.After(200 * time.Millisecond): // a transfer may be refused: ask again
		case <-ctx.Done():
			return c.LeaderCount() == 0
		}
	}
}
