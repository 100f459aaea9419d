package multiraft

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/ursula/ursula/storage/raftlog"
	"github.com/ursula/ursula/storage/wal"
)

type opKind uint8

const (
	opPropose opKind = iota
	opStep
	opReportSnapshot
	opReportUnreachable
	opFunc
	// opSnapshot and opPurgeLog are an operator's requests (Host.Snapshot,
	// Host.PurgeLog), run on the worker between two Ready cycles.
	opSnapshot
	opPurgeLog
	// opSnapshotDone is the snapshot worker's report (snapshot.go).
	opSnapshotDone
	// opReadIndex is a reader waiting for a read index (readindex.go).
	opReadIndex
)

type op struct {
	kind   opKind
	g      *group
	p      *proposal
	msg    *pb.Message
	to     uint64
	failed bool
	// fn runs on the shard worker (opFunc); its error goes to done.
	fn   func(g *group) error
	done chan error
	// req is the request of opSnapshot and opPurgeLog.
	req *logRequest
	// snap is the report of opSnapshotDone.
	snap *snapshotDone
	// read is the reader of opReadIndex.
	read *readWaiter
}

// States of a logRequest: the worker starts a pending request, or its
// caller abandons it; whichever moves first decides.
const (
	reqPending int32 = iota
	reqStarted
	reqAbandoned
)

// logRequest is an operator's snapshot or log purge of one group.
type logRequest struct {
	// upto bounds a purge (opPurgeLog).
	upto uint64
	// want is the applied index a snapshot request must cover.
	want  uint64
	state atomic.Int32
	done  chan logResult // buffered: the worker never blocks on it
}

type logResult struct {
	index uint64
	err   error
}

// start claims the request for the worker; false when its caller gave up.
func (r *logRequest) start() bool { return r.state.CompareAndSwap(reqPending, reqStarted) }

func (r *logRequest) finish(index uint64, err error) { r.done <- logResult{index: index, err: err} }

type result struct {
	v   any
	err error
}

type proposal struct {
	id   uint64
	data []byte
	done chan result
	// index is where the proposal sits in the log, recorded when its
	// leader stepped down with it pending (orphaned; stepdown.go).
	index    uint64
	orphaned bool
}

func (p *proposal) finish(v any, err error) { p.done <- result{v: v, err: err} }

// shard is one worker: it owns its groups and its journal.
type shard struct {
	id      int
	h       *Host
	journal *wal.Journal
	groups  []*group

	mu     sync.Mutex
	inbox  []op
	closed bool
	wake   chan struct{}

	// worker-only scratch
	lastSync time.Time
	// started is set once the worker's first processReady (which runs
	// the campaigns of a start) returned.
	started bool
	// lastDrained counts the proposals of the previous batch: concurrent
	// load (several per batch) is what makes waiting for more worthwhile.
	lastDrained int
	spare       []op
	readies     []groupReady
	ticks       int
	// campaigning counts groups still waiting for their membership before
	// deciding whether to campaign at once.
	campaigning int
	// retain lists groups whose older snapshot files may go once the
	// journal is synced (snapshot.go).
	retain []*group
	// holding lists groups holding proposals during a leadership
	// transfer (transfer.go).
	holding []*group
	// orphaned lists groups keeping proposals pending after they stepped
	// down (stepdown.go).
	orphaned []*group
	// proposing lists the groups with proposals in batch (propose.go).
	proposing []*group
	// lastDrive is when the snapshot driver last ran (deleted.go), and
	// erasures what it found.
	lastDrive time.Time
	erasures  erasureView

	stats shardStats
}

// campaign lets the groups waiting to campaign do so; it reports whether any
// group's state changed.
func (s *shard) campaign() bool {
	changed := false
	for _, g := range s.groups {
		if !g.wantCampaign {
			continue
		}
		if g.maybeCampaign(s.h.cfg.NodeID) {
			changed = true
		}
		if !g.wantCampaign {
			s.campaigning--
		}
	}
	return changed
}

type groupReady struct {
	g  *group
	rd raft.Ready
}

func (s *shard) enqueue(o op) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrStopped
	}
	s.inbox = append(s.inbox, o)
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
	return nil
}

// close refuses further ops and fails the queued proposals.
func (s *shard) close() {
	s.mu.Lock()
	s.closed = true
	inbox := s.inbox
	s.inbox = nil
	s.mu.Unlock()
	for _, o := range inbox {
		switch o.kind {
		case opPropose:
			o.p.finish(nil, ErrStopped)
		case opSnapshot, opPurgeLog:
			if o.req.start() {
				o.req.finish(0, ErrStopped)
			}
		case opReadIndex:
			o.read.finish(0, ErrStopped)
		}
	}
}

func (s *shard) run(ctx context.Context) error {
	ticker := time.NewTicker(s.h.cfg.TickInterval)
	defer ticker.Stop()
	if err := s.processReady(); err != nil {
		return err
	}
	s.started = true
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			shedding := s.h.shedding.Load()
			for _, g := range s.groups {
				if !g.ticks(shedding) {
					continue
				}
				g.rn.Tick()
			}
			if err := s.onTick(); err != nil {
				return err
			}
		case <-s.wake:
			s.waitSyncWindow()
			if s.lastDrained > 0 {
				// Under load, let the goroutines that are about to
				// propose or step (RPC handlers, the transport's
				// receivers) run first: one yield makes the batch several
				// times larger, and everything per batch (a journal
				// write, a MsgApp and its answer per follower, a Ready)
				// is paid that many times less (propose.go).
				runtime.Gosched()
			}
		}
		if err := s.drain(); err != nil {
			return err
		}
		if err := s.processReady(); err != nil {
			return err
		}
		if s.releaseHeld() {
			if err := s.processReady(); err != nil {
				return err
			}
		}
		s.settleOrphans()
	}
}

// waitSyncWindow delays a busy shard's next batch under fsync "always" so
// that its fsyncs start at least SyncWindow apart (group commit).
func (s *shard) waitSyncWindow() {
	w := s.h.cfg.SyncWindow
	if w <= 0 || s.h.cfg.Fsync != FsyncAlways || s.lastSync.IsZero() || s.lastDrained < 2 {
		return
	}
	if d := w - time.Since(s.lastSync); d > 0 {
		time.Sleep(d)
	}
}

// drain handles the mailbox. It returns a fatal storage error (of a
// snapshot or an operator's purge) after handling every other op.
func (s *shard) drain() error {
	var fatal error
	s.mu.Lock()
	ops := s.inbox
	s.inbox = s.spare[:0]
	s.mu.Unlock()
	s.lastDrained = 0
	for i := range ops {
		o := &ops[i]
		if o.kind == opPropose {
			s.lastDrained++
		}
		g := o.g
		if g != nil && len(g.batch) > 0 && o.kind != opPropose && o.kind != opStep {
			s.proposeBatch(g) // whatever else the op does comes after them
		}
		if g != nil && g.halted != nil && o.kind != opSnapshotDone {
			refuseHalted(o)
			*o = op{}
			continue
		}
		switch o.kind {
		case opPropose:
			s.stats.proposals.Add(1)
			if !g.isLeader {
				o.p.finish(nil, &NotLeaderError{LeaderID: g.leader})
				break
			}
			if len(g.held) > 0 && len(g.held) < maxHeldProposals {
				g.held = append(g.held, o.p) // behind the held ones, in order
				break
			}
			// Proposed with the group's others of this batch (propose.go).
			if len(g.batch) == 0 {
				s.proposing = append(s.proposing, g)
			}
			g.batch = append(g.batch, o.p)
		case opStep:
			if g.refuseSteps {
				break // no vote floor yet: take nothing from peers
			}
			if g.plan != nil && !g.planStep(o.msg) {
				s.h.gateDropped.Add(1)
				g.logger.Debug("recovery plan: dropped", "type", o.msg.GetType().String(), "from", o.msg.GetFrom(), "term", o.msg.GetTerm())
				break
			}
			if g.plan == nil && g.gated && gatedMessage(o.msg.GetType()) {
				s.h.gateDropped.Add(1)
				g.logger.Debug("recovery gate closed: dropped", "type", o.msg.GetType().String(), "from", o.msg.GetFrom())
				break
			}
			if o.msg.GetType() == pb.MessageType_MsgHeartbeat {
				g.checkHeartbeat(o.msg)
			}
			if o.msg.GetType() == pb.MessageType_MsgApp && g.overwritesCommitted(o.msg) {
				s.h.gateDropped.Add(1)
				break
			}
			switch t := o.msg.GetType(); {
			case (t == pb.MessageType_MsgAppResp || t == pb.MessageType_MsgHeartbeatResp) && g.isLeader:
				g.acked[o.msg.GetFrom()] = time.Now()
			case t == pb.MessageType_MsgApp || t == pb.MessageType_MsgHeartbeat || t == pb.MessageType_MsgSnap:
				if o.msg.GetTerm() >= g.rn.BasicStatus().GetTerm() {
					g.heardLeader = time.Now()
				}
			}
			if err := g.rn.Step(o.msg); err != nil {
				g.logger.Debug("dropped raft message", "type", o.msg.GetType().String(), "from", o.msg.GetFrom(), "err", err)
			}
		case opReportSnapshot:
			st := raft.SnapshotFinish
			if o.failed {
				st = raft.SnapshotFailure
			}
			g.rn.ReportSnapshot(o.to, st)
		case opReportUnreachable:
			g.rn.ReportUnreachable(o.to)
		case opFunc:
			o.done <- o.fn(g)
		case opSnapshot, opPurgeLog:
			if !o.req.start() {
				break // the caller gave up before the worker got to it
			}
			if fatal != nil {
				o.req.finish(0, fatal)
				break
			}
			if o.kind == opSnapshot {
				if err := s.requestSnapshot(g, o.req); err != nil {
					fatal = err
				}
				break
			}
			index, err := s.purgeLog(g, o.req.upto)
			var fe *fatalError
			if errors.As(err, &fe) {
				fatal = fe.err
				err = fe.err
			}
			o.req.finish(index, err)
		case opSnapshotDone:
			if err := s.snapshotDone(g, o.snap); err != nil && fatal == nil {
				fatal = err
			}
		case opReadIndex:
			g.addRead(o.read)
		}
		*o = op{}
	}
	s.proposeBatches()
	s.spare = ops[:0]
	return fatal
}

// fatalError marks a storage failure of an operator's request that stops
// the node (as the same failure does in the worker's own snapshots).
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

// purgeLog purges g's log through upto, at most through its snapshot, and
// returns the index it purged through. The in-memory log is compacted
// through every snapshot as soon as it is taken, so what is left is the
// journal: segments holding only entries at or below their groups'
// snapshots are deleted.
func (s *shard) purgeLog(g *group, upto uint64) (uint64, error) {
	through := min(upto, g.snapIndex)
	if err := s.purge(); err != nil {
		return 0, &fatalError{err: err}
	}
	return through, nil
}

func hasConfChange(ents []*pb.Entry) bool {
	for _, e := range ents {
		if t := e.GetType(); t == pb.EntryConfChange || t == pb.EntryConfChangeV2 {
			return true
		}
	}
	return false
}

// maxMergedDrains bounds the mailbox drains one processReady makes between
// its Readies (see there), so that the worker gets back to its loop, and
// to its ticks, after a bounded number of Readies however busy it is.
const maxMergedDrains = 4

// processReady handles Readies until no group of the shard has one.
func (s *shard) processReady() error {
	h := s.h
	always := h.cfg.Fsync == FsyncAlways
	drains := 0
	for {
		s.readies = s.readies[:0]
		for _, g := range s.groups {
			if g.halted != nil {
				continue
			}
			g.startReadRound()
			if g.rn.HasReady() {
				s.readies = append(s.readies, groupReady{g: g, rd: g.rn.Ready()})
			}
		}
		if len(s.readies) == 0 {
			if s.campaigning == 0 || !s.campaign() {
				return nil
			}
			continue
		}
		// 1. Persist every group's snapshot, entries and hard state: one
		// write, at most one fsync.
		write, sync := false, false
		for i := range s.readies {
			g, rd := s.readies[i].g, &s.readies[i].rd
			if !raft.IsEmptySnap(rd.Snapshot) {
				if err := h.snaps.Save(g.id, rd.Snapshot); err != nil {
					return fmt.Errorf("multiraft: group %d: persist received snapshot: %w", g.id, err)
				}
				md := rd.Snapshot.GetMetadata()
				s.journal.SetSnapshot(g.id, wal.SnapshotMarker{
					Index: md.GetIndex(), Term: md.GetTerm(), ConfState: md.GetConfState(), Discard: true,
				})
				write, sync = true, true
			}
			if len(rd.Entries) > 0 {
				g.indexPending(rd.Entries)
				s.journal.AppendEntries(g.id, rd.Entries)
				if hasConfChange(rd.Entries) {
					sync = true
				}
			}
			if rd.HardState != nil {
				s.journal.SetHardState(g.id, rd.HardState)
				// A new term or vote is synced under every fsync mode:
				// elections are rare, and a term or vote a power loss took
				// back lets a replica vote twice in a term (two leaders), or
				// a recovery plan reuse a term a lost leader led.
				if old := g.st.HardState(); old.GetTerm() != rd.HardState.GetTerm() || old.GetVote() != rd.HardState.GetVote() {
					sync = true
				}
			}
			if rd.MustSync {
				write = true
				if always {
					sync = true
				}
			}
		}
		if write {
			flushStart := time.Now()
			if err := s.journal.Flush(sync); err != nil {
				return fmt.Errorf("multiraft: shard %d: %w", s.id, err)
			}
			d := time.Since(flushStart)
			s.stats.persistNs.Add(uint64(d))
			h.lat.persist.Record(context.Background(), d.Seconds())
			if sync {
				// The window runs from the start of this fsync: proposals
				// that arrived while it ran already wait for the next one,
				// and a slow fsync (longer than the window) must not be
				// followed by a sleep on top of it.
				s.lastSync = flushStart
			}
		}
		for i := range s.readies {
			if rd := &s.readies[i].rd; !raft.IsEmptySnap(rd.Snapshot) {
				s.retainLater(s.readies[i].g) // its marker was synced above
			}
		}
		// 2. Update the raft storages, then send.
		for i := range s.readies {
			g, rd := s.readies[i].g, &s.readies[i].rd
			if !raft.IsEmptySnap(rd.Snapshot) {
				g.st.ApplySnapshot(rd.Snapshot.GetMetadata())
			}
			if err := g.st.Append(rd.Entries); err != nil {
				return fmt.Errorf("multiraft: %w", err)
			}
			if rd.HardState != nil {
				g.st.SetHardState(rd.HardState)
			}
			if len(rd.Messages) > 0 {
				h.tr.Send(g.id, g.dropStaleSnapshots(rd.Messages))
			}
		}
		// 3. Apply, then Advance.
		s.stats.readyBatches.Add(1)
		captured := false
		for i := range s.readies {
			g, rd := s.readies[i].g, &s.readies[i].rd
			applyStart := time.Now()
			if err := g.apply(rd); err != nil {
				return err
			}
			d := time.Since(applyStart)
			s.stats.applyNs.Add(uint64(d))
			if len(rd.CommittedEntries) > 0 {
				h.lat.apply.Record(context.Background(), d.Seconds())
			}
			s.stats.appliedEntries.Add(uint64(len(rd.CommittedEntries)))
			g.appliedWaits.trigger(g.applied)
			if g.halted != nil {
				// Frozen (halt.go): the Ready is done with, nothing more
				// of the group runs.
				g.rn.Advance(*rd)
				g.updateStatus()
				s.readies[i] = groupReady{}
				continue
			}
			g.rn.Advance(*rd)
			g.readsAfterReady(rd)
			for _, to := range g.staleSnapTo {
				g.rn.ReportSnapshot(to, raft.SnapshotFailure)
			}
			g.staleSnapTo = g.staleSnapTo[:0]
			// One capture per pass: a capture encodes every stream of the
			// group on this worker (a group of 20,000 streams takes about
			// 100 ms), and groups under the same load come due together;
			// capturing them all in one pass kept the worker from
			// heartbeats for over an election timeout (a 300,000-stream
			// cluster lost leaderships under load). The others stay due
			// and are captured at their next Readies.
			if !captured && g.snapshotDue(h.cfg) {
				if err := s.startSnapshot(g); err != nil {
					return err
				}
				captured = true
			}
			g.updateStatus()
			s.readies[i] = groupReady{}
		}
		// A batch whose entries were just written is committed by the
		// next Ready. Under fsync "never", the proposals that arrived
		// meanwhile join that Ready: one Ready per batch instead of two,
		// and Raft's costs per Ready and group are most of a small
		// batch's. Not under "always": this batch's answers would wait
		// for the next batch's fsync (and the sync window). Nor in the
		// worker's first processReady: the proposals queued at start
		// wait for the campaigns it runs (a restarted group elects itself
		// there), rather than be refused by a group not leading yet.
		if !always && s.started && drains < maxMergedDrains && s.pending() {
			drains++
			if err := s.drain(); err != nil {
				return err
			}
		}
	}
}

// pending reports whether the mailbox holds anything.
func (s *shard) pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.inbox) > 0
}

// onTick flushes buffered commit-only hard states and keeps the journal
// bounded.
// ticks reports whether the replica's clock runs, given whether its node
// drains. A replica without a clock never campaigns.
func (g *group) ticks(shedding bool) bool {
	switch {
	case g.halted != nil:
		return false
	case g.isLeader:
		// It keeps ticking what it leads until the leadership has moved
		// away (a leader's clock drives heartbeats and the quorum check).
		return true
	case g.gated && !g.campaignsUnderPlan(), g.plan != nil && g.plan.Role == PlanFollow:
		// A gated replica or one that follows a plan never campaigns; a
		// plan's leader does.
		return false
	case shedding:
		// A draining node does not campaign for what it follows, but
		// finishes a campaign it was told to run: a transfer's
		// MsgTimeoutNow makes it a candidate, and a candidate that lost
		// its votes must try again, or the group waits for the other
		// replicas' timeouts, which never come if they drain too.
		return g.campaigning
	}
	return true
}

func (s *shard) onTick() error {
	if s.journal.Buffered() > 0 {
		if err := s.journal.Flush(false); err != nil {
			return fmt.Errorf("multiraft: shard %d: %w", s.id, err)
		}
	}
	if err := s.retainSnapshots(); err != nil {
		return err
	}
	if d := s.h.cfg.DriveInterval; d > 0 {
		if now := s.h.cfg.Now(); now.Sub(s.lastDrive) >= d {
			s.lastDrive = now
			if err := s.drive(now); err != nil {
				return err
			}
		}
	}
	s.ticks++
	if s.ticks%10 != 0 {
		return nil
	}
	// At most one capture per pass, as on the apply path.
	if s.journal.Segments() > s.h.cfg.MaxSegments {
		pins := s.journal.Pinning()
		groups := make([]uint32, 0, len(pins))
		for id := range pins {
			groups = append(groups, id)
		}
		slices.Sort(groups)
		for _, id := range groups {
			g := s.h.groups[id]
			if g.applied > g.snapIndex && !g.snapshotting && g.halted == nil {
				g.logger.Debug("snapshotting group pinning an old wal segment", "applied", g.applied, "pinned_index", pins[id])
				if err := s.startSnapshot(g); err != nil {
					return err
				}
				break
			}
		}
	}
	return s.purge()
}

func (s *shard) purge() error {
	if s.journal.Segments() < 2 {
		return nil
	}
	if _, err := s.journal.Purge(); err != nil {
		return fmt.Errorf("multiraft: shard %d: purge: %w", s.id, err)
	}
	return nil
}

// group is one Raft group; all fields but status are owned by the shard
// worker.
type group struct {
	id     uint32
	shard  *shard
	rn     *raft.RawNode
	st     *raftlog.Storage
	sm     StateMachine
	logger *slog.Logger

	cs               *pb.ConfState
	applied          uint64
	snapIndex        uint64
	sinceSnapEntries uint64
	sinceSnapBytes   uint64
	isLeader         bool
	// campaigning: the replica is a candidate (see ticks).
	campaigning  bool
	leader       uint64
	wantCampaign bool
	pending      map[uint64]*proposal
	// refuseSteps drops every message from peers: the group holds no state
	// and has neither been initialized nor been given a vote floor, so it
	// cannot tell a current leader from a stale one.
	refuseSteps bool
	// hasState is set once the group holds any Raft state.
	hasState bool
	// leaderSince is the last log index when this node last became leader.
	leaderSince uint64
	// gated: behind the recovery gate (gate.go); recovered: the group's
	// state came from the journals at this start; lostEntries: a leader
	// knows this replica to hold entries its log no longer has.
	gated, recovered, lostEntries bool
	// acked is when each peer last answered this node as the group's
	// leader (an append or heartbeat response): handoffs go only to a
	// voter that answered recently.
	acked map[uint64]time.Time
	// heardLeader is when a leader last reached this replica, and
	// termLeaders the leader seen in each recent term (bounded).
	heardLeader time.Time
	termLeaders map[uint64]uint64
	// lastLeader is the last leader the group knew, kept while it knows
	// none (the leader-change log).
	lastLeader uint64
	// plan is the recovery plan this replica holds (plan.go), nil if none.
	plan *Plan
	// staleSnapTo are peers a snapshot was not sent to because its
	// membership does not name them (reported failed after Advance), and
	// freshSnapshot asks for a new snapshot that does.
	staleSnapTo   []uint64
	freshSnapshot bool
	// committedOverwrite is set once the replica refused appends that would
	// replace its committed entries (gate.go).
	committedOverwrite bool
	// halted is why the group stopped applying on this node (halt.go);
	// nil while it applies.
	halted error
	// appliedWaits releases WaitApplied callers (safe for any goroutine).
	appliedWaits appliedWaits
	// snapshotting is set while a capture of the group is with the
	// snapshot worker; snapWaiters are operators' requests waiting for a
	// snapshot; retainPending is set while the group is in shard.retain.
	snapshotting  bool
	snapWaiters   []*logRequest
	retainPending bool
	// batch are the proposals of the mailbox batch being drained, proposed
	// to raft together at its end (propose.go).
	batch []*proposal
	// held are proposals raft refused while this leader hands its
	// leadership over, since heldSince (transfer.go).
	held      []*proposal
	heldSince time.Time
	// orphans are pending proposals kept after a step-down, since
	// orphanedSince; orphanQueued is set while the group is in
	// shard.orphaned; restoredThrough is the index of the last snapshot
	// restored from a leader (stepdown.go).
	orphans         []*proposal
	orphanedSince   time.Time
	orphanQueued    bool
	restoredThrough uint64
	// owed is the deleted data this replica still holds (deleted.go),
	// replayThrough the commit index recovered at startup, and remover
	// sm when it reports removals (asked after every applied entry).
	remover       Remover
	owed          *erasure
	replayThrough uint64
	// reads are the readers waiting for a read index (readindex.go).
	reads groupReads

	statusMu sync.Mutex
	status   GroupStatus
}

func (g *group) apply(rd *raft.Ready) error {
	h := g.shard.h
	if !raft.IsEmptySnap(rd.Snapshot) {
		md := rd.Snapshot.GetMetadata()
		if err := g.sm.Restore(rd.Snapshot.GetData()); haltsGroup(err) {
			g.halt(fmt.Errorf("restore snapshot %d: %w", md.GetIndex(), err))
			return nil
		} else if err != nil {
			return fmt.Errorf("%w: group %d: restore snapshot %d: %v", ErrApply, g.id, md.GetIndex(), err)
		}
		g.cs = pb.EnsureConfState(proto.Clone(md.GetConfState()).(*pb.ConfState))
		g.applied = md.GetIndex()
		g.snapIndex = md.GetIndex()
		g.restoredThrough = md.GetIndex()
		g.sinceSnapEntries, g.sinceSnapBytes = 0, 0
		g.logger.Debug("restored snapshot from leader", "index", md.GetIndex())
	}
	for _, e := range rd.CommittedEntries {
		idx := e.GetIndex()
		if idx <= g.applied {
			continue
		}
		switch e.GetType() {
		case pb.EntryNormal:
			data := e.GetData()
			if len(data) == 0 {
				break
			}
			if len(data) <= headerSize || data[0] != 1 {
				return fmt.Errorf("%w: group %d: entry %d has no proposal header", ErrApply, g.id, idx)
			}
			v, err := g.sm.Apply(idx, data[headerSize:])
			if haltsGroup(err) {
				g.halt(err)
				return nil
			}
			if err != nil {
				return fmt.Errorf("%w: group %d: entry %d: %w", ErrApply, g.id, idx, err)
			}
			// Before the proposer hears of it: a purge's report reads the
			// erasure right after.
			g.noteRemovals(idx)
			if binary.LittleEndian.Uint64(data[1:]) == h.cfg.NodeID {
				id := binary.LittleEndian.Uint64(data[9:])
				if p := g.pending[id]; p != nil {
					delete(g.pending, id)
					p.finish(v, nil)
				}
			}
			g.sinceSnapBytes += uint64(len(data))
		case pb.EntryConfChange:
			var cc pb.ConfChange
			if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
				return fmt.Errorf("%w: group %d: entry %d: decode conf change: %v", ErrApply, g.id, idx, err)
			}
			g.cs = g.rn.ApplyConfChange(&cc)
		case pb.EntryConfChangeV2:
			var cc pb.ConfChangeV2
			if err := proto.Unmarshal(e.GetData(), &cc); err != nil {
				return fmt.Errorf("%w: group %d: entry %d: decode conf change: %v", ErrApply, g.id, idx, err)
			}
			g.cs = g.rn.ApplyConfChange(&cc)
		}
		g.applied = idx
		g.sinceSnapEntries++
	}
	if rd.SoftState != nil {
		was := g.isLeader
		g.isLeader = rd.SoftState.RaftState == raft.StateLeader
		g.campaigning = rd.SoftState.RaftState == raft.StateCandidate
		g.leader = rd.SoftState.Lead
		if was && !g.isLeader {
			g.orphan(rd) // settled by the log, not failed (stepdown.go)
		}
		if !was && g.isLeader {
			// The new leader's empty entry is in the log by now; until it
			// applies, the state machine may lack entries committed in
			// earlier terms.
			g.leaderSince, _ = g.st.LastIndex()
			// Answers given to an earlier leadership say nothing now.
			clear(g.acked)
		}
	}
	return nil
}

func (g *group) failPending(err error) {
	for id, p := range g.pending {
		delete(g.pending, id)
		p.finish(nil, err)
	}
}

// maybeCampaign makes a group whose only voter is this node campaign at once
// (instead of waiting for an election timeout) once its membership is applied.
// It clears wantCampaign once decided and reports whether it campaigned.
func (g *group) maybeCampaign(self uint64) bool {
	if g.halted != nil {
		g.wantCampaign = false
		return false
	}
	bs := g.rn.BasicStatus()
	voters := g.cs.GetVoters()
	if len(voters) == 0 || bs.Applied < bs.GetCommit() {
		return false // membership not applied yet
	}
	g.wantCampaign = false
	if g.gated || g.plan != nil || len(g.cs.GetVotersOutgoing()) != 0 || bs.RaftState == raft.StateLeader || !slices.Contains(voters, self) {
		return false
	}
	// A single voter campaigns at once. With several, the group's preferred
	// voter (voters sorted, index group mod count) does, so leaderships start
	// spread across nodes instead of waiting for randomized timeouts.
	if len(voters) > 1 {
		sorted := slices.Sorted(slices.Values(voters))
		if sorted[int(g.id)%len(sorted)] != self || g.shard.h.shedding.Load() {
			return false
		}
	}
	if err := g.rn.Campaign(); err != nil {
		g.logger.Warn("campaign failed", "err", err)
		return false
	}
	return true
}

func (g *group) updateStatus() {
	bs := g.rn.BasicStatus()
	g.statusMu.Lock()
	defer g.statusMu.Unlock()
	st := &g.status
	changed := st.LeaderID != bs.Lead || st.Term != bs.GetTerm() || st.IsLeader != (bs.RaftState == raft.StateLeader) ||
		!slices.Equal(st.Voters, g.cs.GetVoters()) || !slices.Equal(st.Learners, g.cs.GetLearners()) || st.Gated != g.gated ||
		st.Recovery != g.plan
	if changed {
		defer g.shard.h.statusChanged.notify()
	}
	st.GroupID = g.id
	if bs.Lead == 0 && st.LeaderID != 0 {
		st.LeaderLostAt = time.Now()
	}
	if bs.Lead != 0 && bs.Lead != st.LeaderID {
		if g.lastLeader != 0 {
			// An election or a handoff after the group had a leader: worth
			// an operator's attention when no drain, transfer or failure
			// explains it (an overloaded node that misses heartbeats).
			var leaderless time.Duration
			if st.LeaderID == 0 {
				leaderless = time.Since(st.LeaderLostAt).Round(time.Millisecond)
			}
			g.logger.Info("group leader changed", "from", g.lastLeader, "to", bs.Lead, "term", bs.GetTerm(), "leaderless", leaderless)
		}
		g.lastLeader = bs.Lead
	}
	st.LeaderID = bs.Lead
	st.Term = bs.GetTerm()
	st.Commit = bs.GetCommit()
	st.Applied = g.applied
	st.IsLeader = bs.RaftState == raft.StateLeader
	st.SnapshotIndex = g.snapIndex
	st.HasState = g.hasState
	st.LeaderSince = g.leaderSince
	st.Gated = g.gated
	st.LostEntries = g.lostEntries
	st.Recovery = g.plan
	st.LastIndex, _ = g.st.LastIndex()
	st.LastTerm, _ = g.st.Term(st.LastIndex)
	st.CommitTerm, _ = g.st.Term(st.Commit)
	st.Vote = bs.GetVote()
	st.LeaderHeard = g.heardLeader
	if g.halted != nil {
		if st.Halted == nil && !changed {
			defer g.shard.h.statusChanged.notify()
		}
		st.Halted, st.IsLeader, st.LeaderID = g.halted, false, 0
	}
	if bs.Lead != 0 {
		g.noteTermLeader(bs.GetTerm(), bs.Lead)
	}
	st.CommitNode = g.termLeaders[st.CommitTerm]
	if !slices.Equal(st.VotersOutgoing, g.cs.GetVotersOutgoing()) {
		st.VotersOutgoing = slices.Clone(g.cs.GetVotersOutgoing())
	}
	if !slices.Equal(st.Voters, g.cs.GetVoters()) {
		st.Voters = slices.Clone(g.cs.GetVoters())
	}
	if !slices.Equal(st.Learners, g.cs.GetLearners()) {
		st.Learners = slices.Clone(g.cs.GetLearners())
	}
}

// maxTermLeaders bounds the terms whose leader a group remembers.
const maxTermLeaders = 64

// noteTermLeader records that node led term (one leader per term).
func (g *group) noteTermLeader(term, node uint64) {
	if g.termLeaders == nil {
		g.termLeaders = map[uint64]uint64{}
	}
	if _, ok := g.termLeaders[term]; ok {
		return
	}
	if len(g.termLeaders) >= maxTermLeaders {
		oldest := term
		for t := range g.termLeaders {
			oldest = min(oldest, t)
		}
		delete(g.termLeaders, oldest)
	}
	g.termLeaders[term] = node
}

// getStatus returns the status. Its Voters and Learners slices are
// shared: updateStatus replaces them, never modifies them in place, so
// they need no copy (callers must not modify them).
func (g *group) getStatus() GroupStatus {
	g.statusMu.Lock()
	defer g.statusMu.Unlock()
	return g.status
}

func (g *group) leaderID() uint64 {
	g.statusMu.Lock()
	defer g.statusMu.Unlock()
	return g.status.LeaderID
}

// snapshotDue decides whether the group takes a snapshot now: after the
// configured entries or bytes, but never before the log since the last
// snapshot is a good part of what a snapshot would write, so that a group
// holding much state (hot bytes not yet flushed) does not rewrite it for
// every few appends.
func (g *group) snapshotDue(cfg Config) bool {
	if g.snapshotting {
		return false // one at a time; the counters restarted at its capture
	}
	if g.freshSnapshot {
		g.freshSnapshot = false
		return true
	}
	if g.sinceSnapEntries < cfg.SnapshotEntries && g.sinceSnapBytes < cfg.SnapshotBytes {
		return false // the cost only ever raises the thresholds: skip asking for it
	}
	var cost uint64
	if c, ok := g.sm.(SnapshotCoster); ok {
		cost = c.SnapshotCost()
	}
	return g.sinceSnapBytes >= max(cfg.SnapshotBytes, cost) ||
		(g.sinceSnapEntries >= cfg.SnapshotEntries && g.sinceSnapBytes >= cost/4)
}

// dropStaleSnapshots keeps back a snapshot whose membership does not name
// its recipient: a replica added (a learner being rebuilt) after the
// group's latest snapshot refuses it ("not in the ConfState"), and the
// leader would send the same snapshot again until a later one is taken.
// The group takes a new snapshot (which names every peer the leader
// replicates to) and Raft, told that the send failed, probes again.
func (g *group) dropStaleSnapshots(msgs []*pb.Message) []*pb.Message {
	out := msgs[:0]
	for _, m := range msgs {
		if m.GetType() == pb.MessageType_MsgSnap && !confNames(m.GetSnapshot().GetMetadata().GetConfState(), m.GetTo()) {
			g.staleSnapTo = append(g.staleSnapTo, m.GetTo())
			g.freshSnapshot = true
			g.logger.Info("holding back a snapshot whose membership does not name its recipient; taking a new one",
				"to", m.GetTo(), "snapshot_index", m.GetSnapshot().GetMetadata().GetIndex())
			continue
		}
		out = append(out, m)
	}
	return out
}

func confNames(cs *pb.ConfState, id uint64) bool {
	return slices.Contains(cs.GetVoters(), id) || slices.Contains(cs.GetLearners(), id) ||
		slices.Contains(cs.GetVotersOutgoing(), id) || slices.Contains(cs.GetLearnersNext(), id)
}
