package multiraft

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ursula/ursula/storage/raftlog"
	"github.com/ursula/ursula/storage/wal"
)

// Recovery plans (accept-unsynced-loss). When a majority of a group's
// voters lost the unsynced tail of their journals, the gated voters elect
// no one and the group stalls; only an operator can accept that writes
// acknowledged after the last fsync may be gone. A plan names the replica
// that leads the group's new history (the one with the longest log) and
// the plan term, at or above every vote term the replicas reported. From
// the moment a replica takes the plan:
//
//   - the plan's leader campaigns (at a term above the plan term: it
//     restarts its Raft node with the plan term as its term) and votes for
//     no other candidate;
//   - every other replica votes only for the plan's leader, only in an
//     election above the plan term, and takes replication only from a
//     leader above the plan term; it never campaigns;
//   - the replica serves nothing of the group (its status carries the
//     plan) until the new history event the plan's leader proposes first
//     has applied; the cluster layer then clears the plan.
//
// So no replica elects a leader that has not taken the plan, and a leader
// elected before the plan (at or below the plan term) extends no replica
// that holds it. Plans are recorded in <logDir>/recovery_plans before the
// call answers, so a restart keeps them until their event applied.

// PlanRole is a replica's part in a plan.
type PlanRole string

// Plan roles.
const (
	PlanLead   PlanRole = "lead"
	PlanFollow PlanRole = "follow"
)

// Plan is a recovery plan as a replica holds it.
type Plan struct {
	Leader uint64 `json:"leader"`
	// Term is the plan term: the leader's elections run above it.
	Term  uint64   `json:"leader_term"`
	Point uint64   `json:"point"`
	Cut   bool     `json:"cut"`
	Role  PlanRole `json:"role"`
	// TakenAt is the wall-clock time the replica took the plan.
	TakenAt time.Time `json:"taken_at"`
	// LeaderLost is set on the plan's leader when it restarted after a
	// crash with the plan held: it may have lost entries it replicated, so
	// it campaigns no more and the group waits for another plan.
	LeaderLost bool `json:"leader_lost,omitempty"`
}

// PlanRequest is what the operator's tool sends one replica.
type PlanRequest struct {
	Leader uint64
	Point  uint64
	Cut    bool
	// PointEntryTerm is set (non-zero) when the plan cuts to an entry
	// another replica reported committed: the leader must hold an entry of
	// that term at Point.
	PointEntryTerm uint64
	// Lead is set on the request to the plan's leader, with HighestTerm;
	// otherwise the request is a follow with LeaderTerm.
	Lead        bool
	HighestTerm uint64
	LeaderTerm  uint64
	// Expected is the replica's state as the tool read it.
	ExpectedLastIndex, ExpectedLastTerm, ExpectedTerm uint64
	// Stalled is the cluster layer's knowledge: the replica's gate is
	// closed and reports the group stalled.
	Stalled bool
}

// PlanRefusal is a replica's typed refusal of a plan (the seed's reasons).
type PlanRefusal struct {
	Reason  string
	Message string
	// LeaderID names the live leader for follows_leader.
	LeaderID uint64
}

func (r *PlanRefusal) Error() string { return r.Reason + ": " + r.Message }

// Refusal reasons.
const (
	RefuseMissingVoteFloor    = "missing_vote_floor"
	RefuseLeadsLive           = "leads_live"
	RefuseFollowsLeader       = "follows_leader"
	RefuseNotStalled          = "not_stalled"
	RefuseStepMismatch        = "step_mismatch"
	RefusePlanTermBelowVote   = "plan_term_below_vote"
	RefuseSingleVoterCut      = "single_voter_cut"
	RefuseLeaderNotVoter      = "leader_not_voter"
	RefuseExpectedMismatch    = "expected_mismatch"
	RefuseCommittedAbovePoint = "committed_above_point"
	RefuseLogNotAtPoint       = "log_not_at_point"
	RefusePointEntryMismatch  = "point_entry_mismatch"
	RefuseNoCommittedEntry    = "no_committed_entry"
)

// liveWindow is how recently a quorum must have answered a leader, or a
// leader a follower, for the replica to count as served by a live leader.
const liveWindow = 3 * time.Second

const plansFile = "recovery_plans"

// ErrPlanFile reports a recovery_plans file that does not decode.
var ErrPlanFile = errors.New("multiraft: recovery_plans is damaged")

type plansDoc struct {
	Version int              `json:"version"`
	Plans   map[uint32]*Plan `json:"plans"`
}

func readPlans(fsys wal.FS, logDir string) (map[uint32]*Plan, error) {
	path := filepath.Join(logDir, plansFile)
	b, err := wal.ReadFile(fsys, path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[uint32]*Plan{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("multiraft: read %s: %w", path, err)
	}
	var doc plansDoc
	if err := json.Unmarshal(b, &doc); err != nil || doc.Version != 1 {
		return nil, fmt.Errorf("%w: %s", ErrPlanFile, path)
	}
	if doc.Plans == nil {
		doc.Plans = map[uint32]*Plan{}
	}
	return doc.Plans, nil
}

func writePlans(fsys wal.FS, logDir string, plans map[uint32]*Plan) error {
	b, err := json.Marshal(plansDoc{Version: 1, Plans: plans})
	if err != nil {
		return err
	}
	return wal.WriteFileAtomic(fsys, logDir, filepath.Join(logDir, plansFile), b)
}

// loadPlans gives each group the plan recorded for it; crashed reports a
// start after a crash, when a plan's leader may have lost what it
// replicated under the plan.
func (h *Host) loadPlans(logDir string, crashed bool) error {
	plans, err := readPlans(h.cfg.FS, logDir)
	if err != nil {
		return err
	}
	changed := false
	for id, p := range plans {
		if int(id) >= len(h.groups) || h.groups[id] == nil {
			continue
		}
		if p.Role == PlanLead && crashed && h.cfg.Fsync == FsyncNever && !p.LeaderLost {
			p.LeaderLost, changed = true, true
			h.logger.Warn("the plan's leader restarted after a crash: it campaigns no more; plan again", "group_id", id)
		}
		h.groups[id].plan = p
		h.groups[id].updateStatus()
	}
	h.plans = plans
	if !changed {
		return nil
	}
	return writePlans(h.cfg.FS, logDir, plans)
}

// planStep filters a message of a replica that holds a plan; it reports
// whether the message may reach Raft.
func (g *group) planStep(m *pb.Message) bool {
	p := g.plan
	switch m.GetType() {
	case pb.MessageType_MsgVote, pb.MessageType_MsgPreVote:
		// The leader votes for no one; another replica only for the plan's
		// leader in an election above the plan term.
		return p.Role == PlanFollow && m.GetFrom() == p.Leader && m.GetTerm() > p.Term
	case pb.MessageType_MsgTimeoutNow:
		return false
	case pb.MessageType_MsgApp, pb.MessageType_MsgHeartbeat, pb.MessageType_MsgSnap:
		return m.GetTerm() > p.Term
	}
	return true
}

// campaignsUnderPlan reports whether the group ticks and campaigns as the
// plan's leader.
func (g *group) campaignsUnderPlan() bool {
	return g.plan != nil && g.plan.Role == PlanLead && !g.plan.LeaderLost
}

// AcceptPlan makes this replica of group groupID take a recovery plan, or
// refuses it with a *PlanRefusal and changes nothing. On success it
// returns the plan term (the leader's answer; a follow echoes it).
func (h *Host) AcceptPlan(ctx context.Context, groupID uint32, req PlanRequest) (uint64, error) {
	var term uint64
	err := h.do(ctx, groupID, func(g *group) error {
		if p := g.plan; p != nil && p.Leader == req.Leader && p.Point == req.Point && p.Cut == req.Cut && !p.LeaderLost &&
			(req.Lead && p.Role == PlanLead && p.Term >= req.HighestTerm || !req.Lead && p.Role == PlanFollow && p.Term == req.LeaderTerm) {
			term = p.Term // the same plan again: nothing to do
			return nil
		}
		if r := g.checkPlan(req); r != nil {
			return r
		}
		hs := g.st.HardState()
		p := &Plan{Leader: req.Leader, Point: req.Point, Cut: req.Cut, TakenAt: time.Now()}
		if req.Lead {
			p.Role, p.Term = PlanLead, max(req.HighestTerm, hs.GetTerm())
		} else {
			p.Role, p.Term = PlanFollow, req.LeaderTerm
		}
		// The cut first: a crash before the plan is recorded leaves a log
		// without entries nobody knew committed, and no plan.
		if req.Cut {
			if err := g.cutToCommitted(); err != nil {
				return err
			}
		}
		if err := h.recordPlan(groupID, p); err != nil {
			return err
		}
		g.plan = p
		// Restart the Raft node: it drops any leadership or campaign and
		// any leader it followed; the plan's leader starts at the plan term,
		// so its first election is above it.
		if req.Lead && hs.GetTerm() < p.Term {
			nhs := &pb.HardState{Term: proto.Uint64(p.Term), Vote: proto.Uint64(0), Commit: proto.Uint64(hs.GetCommit())}
			g.shard.journal.SetHardState(g.id, nhs)
			if err := g.shard.journal.Flush(true); err != nil {
				return fmt.Errorf("multiraft: group %d: persist the plan term: %w", g.id, err)
			}
			g.st.SetHardState(nhs)
		}
		if err := g.restartRaft(); err != nil {
			return err
		}
		if req.Lead {
			if err := g.rn.Campaign(); err != nil {
				g.logger.Warn("the plan's leader could not campaign yet", "err", err)
			}
		}
		g.logger.Warn("took an accept-unsynced-loss recovery plan: writes acknowledged after the last fsync may be gone; a new history starts",
			"role", p.Role, "leader", p.Leader, "plan_term", p.Term, "point", p.Point, "cut", p.Cut)
		term = p.Term
		return nil
	})
	return term, err
}

// checkPlan returns why this replica refuses req, or nil.
func (g *group) checkPlan(req PlanRequest) *PlanRefusal {
	self := g.shard.h.cfg.NodeID
	bs := g.rn.BasicStatus()
	hs := g.st.HardState()
	last, _ := g.st.LastIndex()
	lastTerm, _ := g.st.Term(last)
	commit := bs.GetCommit()
	refuse := func(reason, format string, args ...any) *PlanRefusal {
		return &PlanRefusal{Reason: reason, Message: fmt.Sprintf(format, args...)}
	}
	now := time.Now()
	switch {
	case !g.hasState || g.refuseSteps:
		return refuse(RefuseMissingVoteFloor, "the replica holds no Raft state and no durable vote floor: restore connectivity to an intact quorum so it gets a barrier")
	case req.Lead != (req.Leader == self):
		return refuse(RefuseStepMismatch, "the request's step is not this replica's: lead goes to the plan's leader (node %d) only, follow to every other replica", req.Leader)
	case !req.Lead && req.LeaderTerm < req.ExpectedTerm:
		return refuse(RefusePlanTermBelowVote, "plan term %d is below the current term %d the request expects: take the term from the leader's answer", req.LeaderTerm, req.ExpectedTerm)
	}
	if g.isLeader && g.leadsLive(now) {
		return refuse(RefuseLeadsLive, "the replica leads the group with a quorum that answered it within %s", liveWindow)
	}
	if !g.isLeader && bs.Lead != 0 && !g.heardLeader.IsZero() && now.Sub(g.heardLeader) <= liveWindow {
		r := refuse(RefuseFollowsLeader, "the replica follows node %d, whose replication reached it within %s", bs.Lead, liveWindow)
		r.LeaderID = bs.Lead
		return r
	}
	if g.gated && !req.Stalled && g.plan == nil {
		return refuse(RefuseNotStalled, "the replica's gate may still open through a leader's barrier: wait until it reports the group stalled")
	}
	// A replica that campaigns raises its term with every election, so only
	// its last log id is compared; a gated one does not campaign.
	moved := last != req.ExpectedLastIndex || lastTerm != req.ExpectedLastTerm
	if g.gated && g.plan == nil && hs.GetTerm() != req.ExpectedTerm {
		moved = true
	}
	if moved {
		return refuse(RefuseExpectedMismatch, "the replica no longer holds the log the request expects (last index %d, last term %d, current term %d): read the metrics again and plan again",
			last, lastTerm, hs.GetTerm())
	}
	if max(commit, g.applied) > req.Point {
		return refuse(RefuseCommittedAbovePoint, "the replica committed or applied index %d, above the plan's point %d: the plan picked the wrong leader", max(commit, g.applied), req.Point)
	}
	configs := [][]uint64{g.cs.GetVoters(), g.cs.GetVotersOutgoing()}
	voters := map[uint64]bool{}
	for _, set := range configs {
		for _, v := range set {
			voters[v] = true
		}
	}
	if req.Cut && len(voters) <= 1 {
		return refuse(RefuseSingleVoterCut, "the plan cuts a replica whose membership names one voter: no other voter could have overwritten its entries, so its log is kept whole")
	}
	if req.Cut && (commit < g.st.SnapshotIndex() || commit == 0 && last > 0) {
		return refuse(RefuseNoCommittedEntry, "the plan cuts, and the replica knows no committed entry it still holds (commit %d, snapshot %d)", commit, g.st.SnapshotIndex())
	}
	if req.Lead {
		if !slices.Contains(g.cs.GetVoters(), self) || len(g.cs.GetVotersOutgoing()) > 0 && !slices.Contains(g.cs.GetVotersOutgoing(), self) {
			return refuse(RefuseLeaderNotVoter, "the plan's leader is no voter of the membership it would campaign under: read the metrics again and plan again")
		}
		at := last
		if req.Cut {
			at = commit
		}
		if at != req.Point {
			return refuse(RefuseLogNotAtPoint, "the plan's leader's log does not continue from the point %d (it ends at %d)", req.Point, at)
		}
		if req.PointEntryTerm != 0 {
			if t, err := g.st.Term(req.Point); err != nil || t != req.PointEntryTerm {
				return refuse(RefusePointEntryMismatch, "the leader does not hold the entry of term %d at the point %d", req.PointEntryTerm, req.Point)
			}
		}
	}
	return nil
}

// cutToCommitted cuts the log back to the committed entry, durably: the
// entries above it were never known committed, and a lost leader may have
// overwritten them elsewhere.
func (g *group) cutToCommitted() error {
	commit := g.rn.BasicStatus().GetCommit()
	last, _ := g.st.LastIndex()
	if commit >= last {
		return nil
	}
	g.shard.journal.TruncateEntries(g.id, commit)
	if err := g.shard.journal.Flush(true); err != nil {
		return fmt.Errorf("multiraft: group %d: persist the plan's cut: %w", g.id, err)
	}
	if err := g.st.Truncate(commit); err != nil {
		return err
	}
	g.logger.Warn("the recovery plan cut the log back to its committed entry", "from", last, "to", commit)
	return nil
}

// leadsLive reports whether this leader heard from a quorum of every
// voter set within liveWindow.
func (g *group) leadsLive(now time.Time) bool {
	self := g.shard.h.cfg.NodeID
	quorum := func(set []uint64) bool {
		n := 0
		for _, v := range set {
			if at, ok := g.acked[v]; v == self || ok && now.Sub(at) <= liveWindow {
				n++
			}
		}
		return n*2 > len(set)
	}
	return quorum(g.cs.GetVoters()) && (len(g.cs.GetVotersOutgoing()) == 0 || quorum(g.cs.GetVotersOutgoing()))
}

// restartRaft replaces the group's Raft node by a fresh one on the same
// storage (a follower of no leader), failing pending proposals.
func (g *group) restartRaft() error {
	cfg := g.raftConfig(g.shard.h, g.applied)
	cfg.Storage = appliedConf{Storage: g.st, cs: g.cs}
	rn, err := raft.NewRawNode(cfg)
	if err != nil {
		return fmt.Errorf("multiraft: group %d: restart raft: %w", g.id, err)
	}
	g.failPending(ErrProposalDropped)
	g.failHeld(ErrProposalDropped)
	g.rn = rn
	g.isLeader, g.leader = false, 0
	return nil
}

// appliedConf is the group's storage as a restarted Raft node must see it:
// with the membership in force at the applied index (the storage knows only
// the latest snapshot's), since Raft restores its configuration from
// InitialState and replays nothing at or below Applied.
type appliedConf struct {
	*raftlog.Storage
	cs *pb.ConfState
}

func (s appliedConf) InitialState() (*pb.HardState, *pb.ConfState, error) {
	hs, _, err := s.Storage.InitialState()
	return hs, s.cs, err
}

func (h *Host) recordPlan(groupID uint32, p *Plan) error {
	h.gateMu.Lock()
	defer h.gateMu.Unlock()
	next := make(map[uint32]*Plan, len(h.plans)+1)
	for id, q := range h.plans {
		next[id] = q
	}
	if p == nil {
		delete(next, groupID)
	} else {
		next[groupID] = p
	}
	if err := writePlans(h.cfg.FS, wal.LogDir(h.cfg.Dir), next); err != nil {
		return fmt.Errorf("multiraft: record the recovery plan of group %d: %w", groupID, err)
	}
	h.plans = next
	return nil
}

// PlanSatisfied clears group groupID's plan of term once the group's new
// history event of that plan applied on this replica; the plan's leader
// then also opens its recovery gate (it holds the new history).
func (h *Host) PlanSatisfied(ctx context.Context, groupID uint32, term uint64) error {
	var open bool
	err := h.do(ctx, groupID, func(g *group) error {
		if g.plan == nil || g.plan.Term != term {
			return nil
		}
		if err := h.recordPlan(groupID, nil); err != nil {
			return err
		}
		open = g.plan.Role == PlanLead && g.isLeader
		g.plan = nil
		g.logger.Info("the recovery plan is satisfied: the group's new history applied", "plan_term", term)
		return nil
	})
	if err == nil && open {
		err = h.OpenGate(ctx, groupID)
	}
	return err
}

// Plans returns the plans this node's replicas hold, by group.
func (h *Host) Plans() map[uint32]Plan {
	h.gateMu.Lock()
	defer h.gateMu.Unlock()
	out := make(map[uint32]Plan, len(h.plans))
	for id, p := range h.plans {
		out[id] = *p
	}
	return out
}
