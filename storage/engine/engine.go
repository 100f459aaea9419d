package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/placement"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/stream"
)

// DefaultContentType is a stream's type when a create names none.
const DefaultContentType = "application/octet-stream"

// bucketGroup holds every bucket record.
const bucketGroup = 0

// Limits on names.
const (
	maxStreamIDBytes = 1024
	maxBucketBytes   = 63
)

// Engine is the storage engine of one node.
type Engine struct {
	cfg      Config
	host     *multiraft.Host
	machines []*stream.Machine
	logger   *slog.Logger
	now      func() time.Time

	cold     *coldTier // nil without a cold store
	staged   stagedIndex
	cluster  atomic.Pointer[ClusterDeps]
	rejoined sync.Map // group → leader id: joined with a vote floor, awaiting rebuild
	rebuilds sync.Map // rebuildKey → true: replicas to remove and add back
	shedPeer atomic.Pointer[ShedPeer]
	// walRecovery is set when this run started after a crash.
	walRecovery bool
	// commitStalls counts watchdog interventions.
	commitStalls atomic.Uint64
	// sweepEntries and sweepDue are the TTL sweep's metrics (sweep.go).
	sweepEntries atomic.Uint64
	sweepDue     atomic.Int64
	// sweepBudget bounds one sweep pass, measured on now.
	sweepBudget time.Duration

	bg       sync.WaitGroup
	bgMu     sync.Mutex
	inflight map[stream.Key]struct{} // streams with a background Touch/Expire in flight
	stopping chan struct{}
	stopOnce sync.Once
}

// New builds the engine: it opens and recovers the WAL but starts nothing.
func New(cfg Config, tr multiraft.Transport, logger *slog.Logger) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("engine config: %w", err)
	}
	e := &Engine{
		cfg:         cfg,
		machines:    make([]*stream.Machine, cfg.GroupCount),
		logger:      logger,
		now:         time.Now,
		sweepBudget: defaultSweepBudget,
		inflight:    map[stream.Key]struct{}{},
		stopping:    make(chan struct{}),
	}
	for g := range e.machines {
		e.machines[g] = stream.NewMachine(uint32(g))
	}
	if tr == nil {
		tr = e
	}
	host, err := multiraft.New(multiraft.Config{
		DeferBootstrap:  len(cfg.Peers) > 1,
		Dir:             cfg.DataDir,
		NodeID:          cfg.NodeID,
		Voters:          cfg.Voters(),
		GroupCount:      cfg.GroupCount,
		ShardCount:      cfg.ShardCount,
		Fsync:           cfg.Fsync,
		TickInterval:    cfg.TickInterval,
		SyncWindow:      cfg.SyncWindow,
		SnapshotEntries: cfg.SnapshotEntries,
		SnapshotBytes:   cfg.SnapshotBytes,
	}, func(g uint32) multiraft.StateMachine { return e.machines[g] }, tr, logger)
	if err != nil {
		return nil, fmt.Errorf("open raft host: %w", err)
	}
	e.host = host
	if cfg.ClusterID != "" {
		if err := checkClusterID(cfg.DataDir, cfg.ClusterID); err != nil {
			_ = host.Close()
			return nil, err
		}
	}
	hadState := false
	for g := range e.machines {
		if host.Status(uint32(g)).LastIndex > 0 {
			hadState = true
			break
		}
	}
	crashed, err := readRunState(cfg.DataDir, hadState)
	if err != nil {
		_ = host.Close()
		return nil, err
	}
	e.walRecovery = crashed
	if crashed {
		logger.Warn("previous run did not shut down cleanly: recovered the journals as they were on disk", "fsync", cfg.Fsync)
	}
	return e, nil
}

// Run drives the Raft groups and the expiry sweep until ctx ends.
func (e *Engine) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- e.host.Run(ctx) }()
	go func() {
		if err := e.initializeGroups(ctx); err != nil && ctx.Err() == nil {
			e.logger.Error("group initializer stopped", "err", err)
		}
	}()
	flushDone := make(chan struct{})
	go func() {
		defer close(flushDone)
		if e.cold != nil {
			e.flushLoop(ctx)
		}
	}()
	sweepDone := make(chan struct{})
	go func() {
		defer close(sweepDone)
		e.sweepLoop(ctx)
	}()
	leadDone := make(chan struct{})
	go func() {
		defer close(leadDone)
		e.leadershipLoop(ctx)
	}()
	err := <-errc
	cancel()
	<-sweepDone
	<-leadDone
	<-flushDone
	e.stopOnce.Do(func() { close(e.stopping) })
	e.bg.Wait()
	if err == nil {
		// host.Run returned after flushing and syncing every journal.
		err = recordCleanShutdown(e.cfg.DataDir)
	}
	return err
}

// WaitReady blocks until every group has a leader and every group this
// node leads has applied its whole log: a barrier entry proposed in the
// leader's term applies only after every entry before it.
func (e *Engine) WaitReady(ctx context.Context) error {
	if err := e.host.WaitReady(ctx); err != nil {
		return err
	}
	for g := range e.machines {
		for {
			if !e.host.Status(uint32(g)).IsLeader {
				break
			}
			_, err := e.propose(ctx, uint32(g), &storagev1.Command{Op: &storagev1.Command_Barrier{Barrier: &storagev1.Barrier{}}})
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// Sync flushes every journal to disk.
func (e *Engine) Sync() error { return e.host.Sync() }

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// WALRecovery reports whether this run started after an unclean shutdown.
func (e *Engine) WALRecovery() bool { return e.walRecovery }

// CommitStalls counts commit-stall watchdog interventions.
func (e *Engine) CommitStalls() uint64 { return e.commitStalls.Load() }

// Host exposes the Raft host (for status and metrics).
func (e *Engine) Host() *multiraft.Host { return e.host }

// Machines exposes the group state machines (for metrics).
func (e *Engine) Machines() []*stream.Machine { return e.machines }

// GroupOf places a stream (see services/platform/placement).
func (e *Engine) GroupOf(k stream.Key) uint32 {
	return placement.Group(k.Bucket, k.Stream, len(e.machines))
}

func (e *Engine) machine(k stream.Key) *stream.Machine { return e.machines[e.GroupOf(k)] }

func (e *Engine) nowMs() int64 { return e.now().UnixMilli() }

// propose submits cmd to group g and waits for its applied result. A
// command rejected by the state machine returns its domain error together
// with the result.
func (e *Engine) propose(ctx context.Context, g uint32, cmd *storagev1.Command) (*stream.Result, error) {
	cmd.NowMs = e.nowMs()
	data, err := proto.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("encode command: %w", err)
	}
	out, err := e.host.Propose(ctx, g, data)
	var res *stream.Result
	var nl *multiraft.NotLeaderError
	switch {
	case err == nil:
		var ok bool
		if res, ok = out.(*stream.Result); !ok {
			return nil, errcode.New(errcode.Internal, "unexpected apply result %T", out)
		}
	case errors.As(err, &nl) && forwardable(cmd) && nl.LeaderID != 0:
		// Cross-group steps run wherever the other group's leader is.
		if res, err = e.forward(ctx, nl.LeaderID, g, cmd); err != nil {
			return nil, err
		}
	default:
		return nil, raftError(err)
	}
	if len(res.Release) > 0 {
		e.release(ctx, res.Release)
	}
	if res.Err != nil {
		return res, res.Err
	}
	return res, nil
}

// forwardable reports commands the engine issues on its own behalf in a
// group it may not lead (fork references, bucket purges, cold-GC
// acknowledgements and compaction swaps); client commands are routed to
// the leader by the gateway instead, and expiry, touches, barriers and
// flushes run only on the leader.
func forwardable(cmd *storagev1.Command) bool {
	switch cmd.GetOp().(type) {
	case *storagev1.Command_AddForkRef, *storagev1.Command_ReleaseForkRef,
		*storagev1.Command_PurgeBucket, *storagev1.Command_GcAck, *storagev1.Command_ColdSwap:
		return true
	}
	return false
}

// raftError maps multiraft's errors to domain errors.
func raftError(err error) error {
	var nl *multiraft.NotLeaderError
	switch {
	case errors.As(err, &nl):
		de := errcode.New(errcode.NotLeader, "not the leader of this group")
		if nl.LeaderID != 0 {
			de.With(errcode.KeyLeaderID, strconv.FormatUint(nl.LeaderID, 10))
		}
		return de.With(errcode.KeyRetryAfterMS, "200")
	case errors.Is(err, multiraft.ErrOutcomeUnknown):
		return errcode.New(errcode.OutcomeUnknown, "leadership changed after the write was proposed; it may or may not have been applied")
	case errors.Is(err, multiraft.ErrStopped), errors.Is(err, multiraft.ErrProposalDropped):
		return errcode.New(errcode.Unavailable, "%v", err).With(errcode.KeyRetryAfterMS, "1000")
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	default:
		return fmt.Errorf("propose: %w", err)
	}
}

// release drops fork references, following cascades up fork chains.
func (e *Engine) release(ctx context.Context, origins []*storagev1.ForkOrigin) {
	// propose follows the cascade itself: a release that removes a
	// soft-deleted fork releases that fork's own source in turn.
	for _, o := range origins {
		k := stream.Key{Bucket: o.GetSourceBucket(), Stream: o.GetSourceStream()}
		_, err := e.propose(context.WithoutCancel(ctx), e.GroupOf(k), &storagev1.Command{Op: &storagev1.Command_ReleaseForkRef{
			ReleaseForkRef: &storagev1.ReleaseForkRef{Bucket: k.Bucket, Stream: k.Stream, Incarnation: o.GetSourceIncarnation()},
		}})
		if err != nil {
			e.logger.Warn("release fork reference failed", "bucket", k.Bucket, "stream", k.Stream, "err", err)
		}
	}
}

// validKey checks bucket and stream names.
func validKey(k stream.Key) error {
	if k.Bucket == "" || len(k.Bucket) > maxBucketBytes {
		return errcode.New(errcode.InvalidArgument, "bucket name must be 1 to %d bytes", maxBucketBytes)
	}
	if k.Stream == "" || len(k.Stream) > maxStreamIDBytes {
		return errcode.New(errcode.InvalidArgument, "stream id must be 1 to %d bytes", maxStreamIDBytes)
	}
	if !utf8.ValidString(k.Stream) || !utf8.ValidString(k.Bucket) {
		return errcode.New(errcode.InvalidArgument, "names must be valid UTF-8")
	}
	for _, r := range k.Stream {
		if r < 0x20 || r == 0x7f {
			return errcode.New(errcode.InvalidArgument, "stream id contains a control character")
		}
	}
	return nil
}

// builtinBucket reports buckets that exist without creation (names
// starting with "__" are reserved for the system and the Durable Streams
// family).
func builtinBucket(b string) bool { return strings.HasPrefix(b, "__") }

// settle waits, on a freshly elected leader of k's group, until its state
// machine has applied everything committed before its term, so it never
// answers from a state that lacks acknowledged writes.
func (e *Engine) settle(k stream.Key) error {
	g := e.GroupOf(k)
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := e.host.Status(g)
		if !st.IsLeader || st.Applied >= st.LeaderSince {
			return nil
		}
		if time.Now().After(deadline) {
			return errcode.New(errcode.Unavailable, "the new leader of group %d is still applying its log", g).With(errcode.KeyRetryAfterMS, "200")
		}
		time.Sleep(time.Millisecond)
	}
}

// live looks a stream up as a client sees it: missing and expired streams
// are STREAM_NOT_FOUND, soft-deleted ones STREAM_GONE. An expired stream
// found here is expired in the background.
// leaderLive is live on the stream's group leader: another replica (which
// may lag, or hold nothing) answers NOT_LEADER without looking at its
// state.
func (e *Engine) leaderLive(k stream.Key) (stream.Meta, error) {
	if !e.leads(k) {
		return stream.Meta{}, e.notLeader(k)
	}
	return e.live(k)
}

func (e *Engine) live(k stream.Key) (stream.Meta, error) {
	if err := e.settle(k); err != nil {
		return stream.Meta{}, err
	}
	m, ok := e.machine(k).Lookup(k)
	if !ok {
		return m, errcode.New(errcode.StreamNotFound, "stream %s not found", k.Stream)
	}
	if m.SoftDeleted {
		return m, errcode.New(errcode.StreamGone, "stream %s is deleted", k.Stream)
	}
	if m.ExpiredAt(e.nowMs()) {
		e.expireAsync(m)
		return m, errcode.New(errcode.StreamNotFound, "stream %s not found (expired)", k.Stream)
	}
	return m, nil
}

// background runs f for stream k unless one is already in flight for it.
func (e *Engine) background(k stream.Key, f func(ctx context.Context)) {
	e.bgMu.Lock()
	if _, busy := e.inflight[k]; busy {
		e.bgMu.Unlock()
		return
	}
	select {
	case <-e.stopping:
		e.bgMu.Unlock()
		return
	default:
	}
	e.inflight[k] = struct{}{}
	e.bg.Add(1)
	e.bgMu.Unlock()
	go func() {
		defer e.bg.Done()
		defer func() {
			e.bgMu.Lock()
			delete(e.inflight, k)
			e.bgMu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		f(ctx)
	}()
}

func (e *Engine) expireAsync(m stream.Meta) {
	e.background(m.Key, func(ctx context.Context) { e.expire(ctx, m) })
}

func (e *Engine) expire(ctx context.Context, m stream.Meta) {
	_, err := e.propose(ctx, e.GroupOf(m.Key), &storagev1.Command{Op: &storagev1.Command_Expire{
		Expire: &storagev1.Expire{Bucket: m.Key.Bucket, Stream: m.Key.Stream, Incarnation: m.Incarnation},
	}})
	if err != nil {
		var de *errcode.Error
		if !errors.As(err, &de) || de.Code != errcode.NotLeader {
			e.logger.Warn("expire stream failed", "bucket", m.Key.Bucket, "stream", m.Key.Stream, "err", err)
		}
	}
}

// touch restarts a stream's sliding TTL for a read and, when the replicated
// touch is more than a second old, persists it.
func (e *Engine) touch(m stream.Meta) {
	if !m.HasTTL {
		return
	}
	now := e.nowMs()
	e.machine(m.Key).Touch(m.Key, m.Incarnation, now)
	if now-m.ReplTouchedMs < 1000 {
		return
	}
	e.background(m.Key, func(ctx context.Context) {
		_, _ = e.propose(ctx, e.GroupOf(m.Key), &storagev1.Command{Op: &storagev1.Command_Touch{
			Touch: &storagev1.Touch{Bucket: m.Key.Bucket, Stream: m.Key.Stream, Incarnation: m.Incarnation, TouchedMs: now},
		}})
	})
}

// sweepLoop removes expired streams from the groups this node leads,
// every ExpirySweepInterval, in bounded passes (sweep.go).
func (e *Engine) sweepLoop(ctx context.Context) {
	t := time.NewTicker(e.cfg.ExpirySweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		st := e.sweepPass(ctx)
		e.sweepEntries.Add(st.entries)
		e.sweepDue.Store(st.dueGroups)
	}
}

// notLeader answers a request that must see a group's tail on a node that
// does not lead it.
func (e *Engine) notLeader(k stream.Key) error {
	st := e.host.Status(e.GroupOf(k))
	de := errcode.New(errcode.NotLeader, "this node does not lead the stream's group; ask its leader").With(errcode.KeyRetryAfterMS, "200")
	if st.LeaderID != 0 {
		de.With(errcode.KeyLeaderID, strconv.FormatUint(st.LeaderID, 10))
	}
	return de
}

// leads reports whether this node can answer tail reads of k: a single
// node always; in a cluster only the group's leader.
func (e *Engine) leads(k stream.Key) bool {
	return !e.multiNode() || e.host.Status(e.GroupOf(k)).IsLeader
}
