package multiraft

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/raft/v3"
	pb "go.etcd.io/raft/v3/raftpb"

	"github.com/ursula/ursula/storage/raftlog"
	"github.com/ursula/ursula/storage/wal"
)

// StateMachine is a group's replicated state machine.
type StateMachine interface {
	// Apply applies one committed normal entry's payload (never empty) at
	// index; the result is handed to the proposer waiting on it (if on this
	// node). Called only from the owning shard worker, in log order. An
	// error means the entry cannot be applied at all (it does not decode,
	// or names an operation this build does not know) and stops the node:
	// skipping it would make this replica diverge from the others. A
	// command the state machine rejects is a result, not an error.
	Apply(index uint64, data []byte) (any, error)
	// CaptureSnapshot captures the state as of the last applied index and
	// returns the function that encodes the capture deterministically. The
	// capture runs on the shard worker between two applies and must be
	// cheap (no I/O, no copy of data the state machine never modifies in
	// place); the encoder runs later on the snapshot worker, concurrently
	// with further applies, and may read only what the capture holds. The
	// encoder may build the encoding in buf's storage (from buf[:0]): the
	// snapshot worker hands it the buffer of its last snapshot, so that a
	// node of many groups does not allocate every group's snapshot anew.
	// The host calls the encoder at most once, so a state machine may
	// reuse a capture's own buffers once it has been encoded.
	CaptureSnapshot() func(buf []byte) ([]byte, error)
	// Restore replaces the state with a snapshot's encoding.
	Restore(data []byte) error
}

// SnapshotCoster is implemented by state machines that can tell about how
// many bytes their snapshot takes; the host then snapshots less often when
// the state is large compared with the log since the last snapshot.
type SnapshotCoster interface {
	SnapshotCost() uint64
}

// Transport carries Raft messages to other nodes. Send is called from shard
// workers after the messages' preconditions are durable; it must not block
// and may keep msgs. A MsgSnap's delivery should be reported back with
// Host.ReportSnapshot, and an unreachable peer with Host.ReportUnreachable.
type Transport interface {
	Send(groupID uint32, msgs []*pb.Message)
}

// NopTransport drops every message (a single-node deployment).
type NopTransport struct{}

// Send implements Transport.
func (NopTransport) Send(uint32, []*pb.Message) {}

var (
	// ErrStopped is returned once the host has stopped (or before New
	// returned a usable host).
	ErrStopped = errors.New("multiraft: stopped")
	// ErrProposalDropped is returned when raft refused a proposal (for
	// example during a leadership transfer or over the uncommitted limit);
	// the entry was not appended and may be retried.
	ErrProposalDropped = errors.New("multiraft: proposal dropped")
	// ErrOutcomeUnknown is returned when this node lost leadership after the
	// proposal was accepted: the entry may or may not commit.
	ErrOutcomeUnknown = errors.New("multiraft: outcome unknown")
	// ErrUnknownGroup is returned for a group id >= GroupCount.
	ErrUnknownGroup = errors.New("multiraft: unknown group")
	// ErrEmptyProposal is returned for a proposal without data.
	ErrEmptyProposal = errors.New("multiraft: empty proposal")
	// ErrApply reports a broken apply invariant; the node stops.
	ErrApply = errors.New("multiraft: apply failed")
)

// NotLeaderError is returned by Propose when this node is not the group's
// leader.
type NotLeaderError struct {
	// LeaderID is the leader this node knows of; 0 when unknown.
	LeaderID uint64
}

func (e *NotLeaderError) Error() string {
	if e.LeaderID == 0 {
		return "multiraft: not leader (leader unknown)"
	}
	return fmt.Sprintf("multiraft: not leader (leader is node %d)", e.LeaderID)
}

// GroupStatus is a point-in-time view of a group on this node. Voters and
// Learners are shared with other callers: never modify them.
type GroupStatus struct {
	GroupID  uint32
	LeaderID uint64
	Term     uint64
	Commit   uint64
	Applied  uint64
	Voters   []uint64
	Learners []uint64
	IsLeader bool
	// SnapshotIndex is the index of the group's latest snapshot on this node.
	SnapshotIndex uint64
	// HasState is set when the group holds any Raft state on this node.
	HasState bool
	// LastIndex is the last index of the group's log on this node.
	LastIndex uint64
	// LeaderSince is the log index of this node's latest leadership start;
	// a leader serves from its state machine only once Applied reaches it.
	LeaderSince uint64
	// Gated is set while the group is behind the recovery gate.
	Gated bool
	// LostEntries is set once the group's leader showed that this replica
	// acknowledged entries its log no longer holds (a lost tail): only a
	// rebuild by the leader (remove, learner, promote) repairs it.
	LostEntries bool
	// LastTerm is the term of the last entry of the log (0: empty).
	LastTerm uint64
	// CommitTerm is the term of the entry at Commit, and CommitNode the
	// node that led that term when this replica saw it lead (0: not seen,
	// for example a term that ended before this start): with Commit they
	// name the replica's committed entry.
	CommitTerm, CommitNode uint64
	// VotersOutgoing is the second voter set of a joint membership.
	VotersOutgoing []uint64
	// Vote is whom this replica voted for in Term (0: nobody).
	Vote uint64
	// Recovery is the recovery plan the replica holds (nil: none); it
	// serves nothing of the group while it holds one. Read only.
	Recovery *Plan
	// LeaderLostAt is when the replica last stopped knowing a leader
	// (zero: it never knew one in this run); meaningful while LeaderID is 0.
	LeaderLostAt time.Time
	// LeaderHeard is when this replica last took an append, heartbeat or
	// snapshot of the leader it follows (zero: never in this run).
	LeaderHeard time.Time
	// Halted is why this node stopped applying the group (nil: it did
	// not; halt.go). A halted replica reports no leader.
	Halted error
}

const (
	stateNew int32 = iota
	stateRunning
	stateStopped
)

// Host runs the Raft groups of one node.
type Host struct {
	cfg    Config
	logger *slog.Logger
	tr     Transport
	snaps  *raftlog.SnapshotStore
	shards []*shard
	groups []*group
	lat    latencies
	nextID atomic.Uint64
	newSM  func(groupID uint32) StateMachine

	mu    sync.Mutex
	state int32
	// stopped is closed once the host has stopped.
	stopped chan struct{}
	// statusChanged wakes waiters on any group's leader, term or
	// membership change.
	statusChanged broadcast
	// snapshots carries captured group snapshots from the shard workers
	// to the snapshot worker (at most one in flight per group, so a send
	// never blocks).
	snapshots chan snapshotJob

	// shedding is the maintenance drain: no campaigning, leaderships handed
	// away by the engine's balancer.
	shedding atomic.Bool
	// tailMayBeLost: see TailMayBeLost.
	tailMayBeLost bool
	// bootstrapped counts the groups New initialized (no state, and not
	// DeferBootstrap).
	bootstrapped int
	// gated are the groups behind the recovery gate (see gate.go), as
	// recorded in the gate file.
	gateMu sync.Mutex
	gated  map[uint32]bool
	// plans are the recovery plans held, as recorded (plan.go; gateMu).
	plans map[uint32]*Plan
	// gateDropped counts the messages gated groups dropped.
	gateDropped atomic.Uint64
}

// New validates cfg, checks the topology bound to the WAL, recovers every
// shard's journal and every group's storage and state machine. It starts no
// goroutines; Run does.
func New(cfg Config, newStateMachine func(groupID uint32) StateMachine, tr Transport, logger *slog.Logger) (*Host, error) {
	cfg.Voters = slices.Clone(cfg.Voters)
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if newStateMachine == nil {
		return nil, fmt.Errorf("%w: no state machine constructor", ErrInvalidConfig)
	}
	if tr == nil {
		tr = NopTransport{}
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	h := &Host{
		cfg:    cfg,
		logger: logger.With("node_id", cfg.NodeID),
		tr:     tr,
		snaps:  raftlog.NewSnapshotStore(cfg.FS, cfg.Dir),
		groups: make([]*group, cfg.GroupCount),
		newSM:  newStateMachine,

		stopped:   make(chan struct{}),
		snapshots: make(chan snapshotJob, cfg.GroupCount),
	}
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	h.nextID.Store(binary.LittleEndian.Uint64(seed[:]) >> 1)

	logDir := wal.LogDir(cfg.Dir)
	if err := wal.CheckTopology(cfg.FS, logDir, cfg.GroupCount, cfg.ShardCount); err != nil {
		return nil, fmt.Errorf("multiraft: %w", err)
	}
	// After a clean shutdown every journal must be exactly as it was left;
	// after a crash a torn tail is cut. Every journal is recovered before
	// any is started, and the run state is consumed in between, so that a
	// refused start changes nothing and a crash of this run is recognized.
	clean, err := wal.ReadCleanShutdown(cfg.FS, logDir)
	if err != nil {
		return nil, fmt.Errorf("multiraft: %w", err)
	}
	h.lat = newLatencies()
	ok := false
	defer func() {
		if !ok {
			for _, s := range h.shards {
				_ = s.journal.Close()
			}
		}
	}()
	for i := range cfg.ShardCount {
		opts := wal.Options{FS: cfg.FS, LogDir: logDir, Shard: i, SegmentBytes: cfg.SegmentBytes, Logger: h.logger, Now: cfg.Now}
		if clean != nil {
			tail, found := clean.Tails[i]
			if !found {
				return nil, fmt.Errorf("multiraft: %w: %s records no active segment for shard %d", wal.ErrCorrupt,
					filepath.Join(logDir, wal.CleanShutdownFile), i)
			}
			opts.CleanShutdown = &tail
		}
		j, states, err := wal.RecoverJournal(opts)
		if err != nil {
			return nil, fmt.Errorf("multiraft: open shard %d: %w", i, err)
		}
		s := &shard{id: i, h: h, journal: j, wake: make(chan struct{}, 1)}
		h.shards = append(h.shards, s)
		for g := range states {
			if int(g) >= cfg.GroupCount || int(g)%cfg.ShardCount != i {
				return nil, fmt.Errorf("multiraft: shard %d journal holds group %d, which does not belong to it", i, g)
			}
		}
		for g := i; g < cfg.GroupCount; g += cfg.ShardCount {
			grp, err := h.newGroup(uint32(g), states[uint32(g)], s)
			if err != nil {
				return nil, err
			}
			h.groups[g] = grp
			s.groups = append(s.groups, grp)
		}
	}
	// A crash of the process alone (the running record names this boot)
	// lost nothing the page cache held: once the journals are synced it
	// is a start like any other, and only a crash that may have taken the
	// host with it can have cost the unsynced tail.
	boot := wal.BootID(cfg.FS)
	if clean == nil && h.hadJournals() {
		h.tailMayBeLost = true
		if boot != "" && wal.ReadRunning(cfg.FS, logDir) == boot {
			h.tailMayBeLost = !h.syncAfterProcessCrash()
		}
	}
	if err := h.gateAfterRecovery(logDir, h.tailMayBeLost); err != nil {
		return nil, err
	}
	if err := h.loadPlans(logDir, h.tailMayBeLost); err != nil {
		return nil, err
	}
	if clean != nil {
		if err := wal.ConsumeCleanShutdown(cfg.FS, logDir); err != nil {
			return nil, fmt.Errorf("multiraft: %w", err)
		}
	}
	if err := wal.RecordRunning(cfg.FS, logDir, boot); err != nil {
		return nil, fmt.Errorf("multiraft: %w", err)
	}
	for _, s := range h.shards {
		if err := s.journal.Start(); err != nil {
			return nil, fmt.Errorf("multiraft: start shard %d: %w", s.id, err)
		}
	}
	ok = true
	return h, nil
}

func (h *Host) newGroup(id uint32, st *wal.GroupState, s *shard) (*group, error) {
	logger := h.logger.With("group_id", id)
	storage, snap, err := raftlog.New(id, st, h.snaps, logger)
	if err != nil {
		return nil, fmt.Errorf("multiraft: %w", err)
	}
	g := &group{
		id:      id,
		shard:   s,
		st:      storage,
		sm:      nil,
		logger:  logger,
		pending: make(map[uint64]*proposal),
		acked:   make(map[uint64]time.Time),
		cs:      pb.EnsureConfState(nil),
	}
	g.sm = h.newSM(id)
	g.remover, _ = g.sm.(Remover)
	var applied uint64
	if snap != nil {
		if err := g.sm.Restore(snap.GetData()); haltsGroup(err) {
			// Halted before it starts (halt.go): the state machine stays
			// empty and nothing of the group is ever applied in this run.
			g.halted = fmt.Errorf("restore snapshot %d: %w", snap.GetMetadata().GetIndex(), err)
			logger.Error("stopped applying the group: this build cannot apply what the group committed; the node stays up, unready, and the other replicas go on (restart it with a build that knows it)",
				"err", g.halted)
		} else if err != nil {
			return nil, fmt.Errorf("multiraft: group %d: restore snapshot %d: %w", id, snap.GetMetadata().GetIndex(), err)
		}
		applied = snap.GetMetadata().GetIndex()
		g.cs = pb.EnsureConfState(snap.GetMetadata().GetConfState())
	}
	g.applied = applied
	g.snapIndex = applied
	// Removals applied again up to here may have been applied before the
	// restart: they are due at once (deleted.go).
	g.replayThrough = storage.HardState().GetCommit()
	g.appliedWaits.trigger(applied)
	rn, err := raft.NewRawNode(g.raftConfig(h, applied))
	if err != nil {
		return nil, fmt.Errorf("multiraft: group %d: start raft: %w", id, err)
	}
	g.rn = rn
	last, _ := storage.LastIndex()
	empty := raft.IsEmptyHardState(storage.HardState()) && last == 0 && storage.SnapshotIndex() == 0
	g.hasState = !empty
	g.recovered = !empty
	if empty && h.cfg.DeferBootstrap {
		// The engine's initializer decides: Bootstrap when every voter is
		// empty, SetVoteFloor when the group already exists elsewhere.
		g.refuseSteps = true
	} else if empty {
		g.hasState = true
		peers := make([]raft.Peer, len(h.cfg.Voters))
		for i, v := range h.cfg.Voters {
			peers[i] = raft.Peer{ID: v}
		}
		if err := rn.Bootstrap(peers); err != nil {
			return nil, fmt.Errorf("multiraft: group %d: bootstrap: %w", id, err)
		}
		logger.Debug("bootstrapped group", "voters", h.cfg.Voters)
		h.bootstrapped++
	}
	g.wantCampaign = true
	s.campaigning++
	g.updateStatus()
	return g, nil
}

// Run starts the shard workers and blocks until ctx ends or a fatal storage
// error stops the node. On return the journals are flushed, synced and
// closed, and every waiting proposal has failed with ErrStopped. It returns
// nil when ctx ended, and the fatal error otherwise.
func (h *Host) Run(ctx context.Context) error {
	h.mu.Lock()
	if h.state != stateNew {
		h.mu.Unlock()
		return ErrStopped
	}
	h.state = stateRunning
	h.mu.Unlock()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	snapDone := make(chan struct{})
	go func() {
		defer close(snapDone)
		h.snapshotWorker(ctx)
	}()
	for _, s := range h.shards {
		wg.Go(func() {
			if err := s.run(ctx); err != nil {
				h.logger.Error("shard worker stopped on a fatal error; stopping the node", "shard_id", s.id, "err", err)
				errMu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				errMu.Unlock()
				cancel()
			}
		})
	}
	wg.Wait()
	close(h.snapshots) // every shard worker, its only sender, has returned
	<-snapDone
	if err := h.stop(); err != nil && firstErr == nil {
		firstErr = err
	}
	if firstErr != nil {
		// A journal that failed may have lost writes the page cache was
		// to keep: the next start on this boot must not trust it.
		if err := wal.ForgetRunning(h.cfg.FS, wal.LogDir(h.cfg.Dir)); err != nil {
			h.logger.Error("could not forget the running state after a failure", "err", err)
		}
	}
	return firstErr
}

// Close releases the files of a host whose Run was never called (Run closes
// them itself), and records a clean shutdown when they closed without an
// error. It is idempotent.
func (h *Host) Close() error {
	h.mu.Lock()
	running := h.state != stateNew
	h.mu.Unlock()
	if running {
		return nil
	}
	if err := h.stop(); err != nil {
		return err
	}
	return h.RecordCleanShutdown()
}

// TailMayBeLost reports whether the previous run ended in a crash that may
// have taken the host with it (no clean shutdown, and no running record of
// this boot whose journals then synced): under fsync "never" the unsynced
// tail of the journals may be gone.
func (h *Host) TailMayBeLost() bool { return h.tailMayBeLost }

// hadJournals reports whether any group recovered state from the journals.
func (h *Host) hadJournals() bool {
	for _, g := range h.groups {
		if g.recovered {
			return true
		}
	}
	return false
}

// syncAfterProcessCrash syncs every journal after a crash of the process
// alone; false (logged) when one fails: the kernel then dropped a page
// the crashed process wrote, and the start is treated as a host crash's.
func (h *Host) syncAfterProcessCrash() bool {
	for _, s := range h.shards {
		if err := s.journal.SyncSegments(); err != nil {
			h.logger.Error("the previous run crashed and its journals do not sync: treating it as a host crash", "shard_id", s.id, "err", err)
			return false
		}
	}
	h.logger.Warn("the previous run crashed on this boot: the page cache kept its journal writes, now synced; nothing is gated for it")
	return true
}

// BootstrappedAll reports whether New initialized every group: a fresh
// install of a node that does not defer bootstrapping (a single voter).
func (h *Host) BootstrappedAll() bool { return h.bootstrapped == len(h.groups) }

// RecordCleanShutdown records, once the host has stopped with every
// journal flushed, synced and closed without an error, the run state that
// holds the next start to the journals as they are now. Run's caller
// calls it after a clean stop (Run returned nil on a cancelled context).
func (h *Host) RecordCleanShutdown() error {
	h.mu.Lock()
	stopped := h.state == stateStopped
	h.mu.Unlock()
	if !stopped {
		return fmt.Errorf("multiraft: record a clean shutdown: %w", errNotStopped)
	}
	tails := make(map[int]wal.SegmentTail, len(h.shards))
	for _, s := range h.shards {
		tails[s.id] = s.journal.Tail()
	}
	return wal.RecordCleanShutdown(h.cfg.FS, wal.LogDir(h.cfg.Dir), tails)
}

var errNotStopped = errors.New("the host is still running")

func (h *Host) stop() error {
	h.mu.Lock()
	if h.state == stateStopped {
		h.mu.Unlock()
		return nil
	}
	h.state = stateStopped
	h.mu.Unlock()
	var errs []error
	for _, s := range h.shards {
		s.close()
		if err := s.journal.Close(); err != nil {
			errs = append(errs, fmt.Errorf("multiraft: close shard %d journal: %w", s.id, err))
		}
	}
	for _, g := range h.groups {
		// The shard workers have returned: their state is ours now.
		g.failPending(ErrStopped)
		g.failHeld(ErrStopped)
		g.failReads(ErrStopped)
		g.finishSnapshotWaiters(0, ErrStopped)
	}
	close(h.stopped)
	return errors.Join(errs...)
}

const headerSize = 17

// Propose replicates data through the group's log and blocks until the entry
// is applied on this node; it returns the state machine's result. It fails
// with *NotLeaderError when this node does not lead the group (or led it
// and the entry was replaced in the new leader's log: nothing applied),
// with ErrOutcomeUnknown when leadership was lost after the entry was
// appended and its fate stayed unknown (stepdown.go),
// and with ErrStopped on shutdown.
func (h *Host) Propose(ctx context.Context, groupID uint32, data []byte) (any, error) {
	return h.ProposeEncoded(ctx, groupID, len(data), func(dst []byte) ([]byte, error) {
		return append(dst, data...), nil
	})
}

// ProposeEncoded is Propose for a caller that encodes its proposal itself:
// encode appends the proposal's bytes to dst (which has room for sizeHint
// of them) and returns the result. The bytes go into the log entry as they
// are, so a caller that would marshal into a buffer of its own and then
// hand it to Propose saves one allocation and one copy of every proposal.
// encode runs before ProposeEncoded returns and must not keep dst.
func (h *Host) ProposeEncoded(ctx context.Context, groupID uint32, sizeHint int, encode func(dst []byte) ([]byte, error)) (any, error) {
	if int(groupID) >= len(h.groups) {
		return nil, fmt.Errorf("%w: %d", ErrUnknownGroup, groupID)
	}
	g := h.groups[groupID]
	buf := make([]byte, headerSize, headerSize+max(sizeHint, 0))
	buf, err := encode(buf)
	if err != nil {
		return nil, err
	}
	if len(buf) <= headerSize {
		return nil, ErrEmptyProposal
	}
	id := h.nextID.Add(1)
	buf[0] = 1
	binary.LittleEndian.PutUint64(buf[1:], h.cfg.NodeID)
	binary.LittleEndian.PutUint64(buf[9:], id)
	p := &proposal{id: id, data: buf, done: make(chan result, 1)}
	if err := g.shard.enqueue(op{kind: opPropose, g: g, p: p}); err != nil {
		return nil, err
	}
	select {
	case r := <-p.done:
		return r.v, r.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Step hands an inbound Raft message from a peer to the group.
func (h *Host) Step(groupID uint32, m *pb.Message) error {
	if int(groupID) >= len(h.groups) {
		return fmt.Errorf("%w: %d", ErrUnknownGroup, groupID)
	}
	g := h.groups[groupID]
	return g.shard.enqueue(op{kind: opStep, g: g, msg: m})
}

// ReportSnapshot tells the group's leader whether a MsgSnap to peer `to` was
// delivered.
func (h *Host) ReportSnapshot(groupID uint32, to uint64, failed bool) error {
	if int(groupID) >= len(h.groups) {
		return fmt.Errorf("%w: %d", ErrUnknownGroup, groupID)
	}
	g := h.groups[groupID]
	return g.shard.enqueue(op{kind: opReportSnapshot, g: g, to: to, failed: failed})
}

// ReportUnreachable tells the group that a message to peer `to` could not be
// sent.
func (h *Host) ReportUnreachable(groupID uint32, to uint64) error {
	if int(groupID) >= len(h.groups) {
		return fmt.Errorf("%w: %d", ErrUnknownGroup, groupID)
	}
	g := h.groups[groupID]
	return g.shard.enqueue(op{kind: opReportUnreachable, g: g, to: to})
}

// Status returns the group's current status (zero for an unknown group).
func (h *Host) Status(groupID uint32) GroupStatus {
	if int(groupID) >= len(h.groups) {
		return GroupStatus{GroupID: groupID}
	}
	return h.groups[groupID].getStatus()
}

// WaitReady returns once every group has a known leader.
func (h *Host) WaitReady(ctx context.Context) error {
	for {
		changed := h.StatusChanged()
		ready := true
		for _, g := range h.groups {
			if g.leaderID() == 0 {
				ready = false
				break
			}
		}
		if ready {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-h.stopped:
			return ErrStopped
		}
	}
}

// Sync writes and fsyncs every shard's journal.
func (h *Host) Sync() error {
	for _, s := range h.shards {
		if err := s.journal.Sync(); err != nil {
			if errors.Is(err, wal.ErrClosed) {
				return ErrStopped
			}
			return fmt.Errorf("multiraft: sync shard %d: %w", s.id, err)
		}
	}
	return nil
}

// raftConfig is the configuration of the group's RawNode.
func (g *group) raftConfig(h *Host, applied uint64) *raft.Config {
	return &raft.Config{
		ID:                        h.cfg.NodeID,
		ElectionTick:              h.cfg.ElectionTicks,
		HeartbeatTick:             h.cfg.HeartbeatTicks,
		Storage:                   g.st,
		Applied:                   applied,
		MaxSizePerMsg:             h.cfg.MaxBatchBytes,
		MaxCommittedSizePerReady:  h.cfg.MaxBatchBytes,
		MaxUncommittedEntriesSize: h.cfg.MaxUncommittedBytes,
		MaxInflightMsgs:           256,
		CheckQuorum:               true,
		PreVote:                   true,
		// ReadIndex confirms leadership with a heartbeat round, not with a
		// lease that would trust the clocks (readindex.go).
		ReadOnlyOption:            raft.ReadOnlySafe,
		DisableProposalForwarding: true,
		Logger:                    raftLogger{l: g.logger},
	}
}
