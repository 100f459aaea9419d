package engine

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/cold"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/stream"
)

// DefaultContentType is a stream's type when a create names none.
const DefaultContentType = "application/octet-stream"

// bucketGroup holds every bucket record.
const bucketGroup = 0

// Groups is how the request engine reaches the Raft groups
// (cluster.Cluster implements it).
type Groups interface {
	// Propose replicates a command through group g and returns its
	// applied result; a command the state machine rejected returns its
	// error together with the result.
	Propose(ctx context.Context, g uint32, cmd *storagev1.Command) (*stream.Result, error)
	// WaitApplied waits until this node's replica of g applied index.
	WaitApplied(ctx context.Context, g uint32, index uint64) error
	// ReadBarrier makes this node's replica of g reflect every write
	// acknowledged before the call (a read index of the group's leader):
	// every read a client observes passes it before looking at the state.
	ReadBarrier(ctx context.Context, g uint32) error
	// Status is group g's Raft status on this node.
	Status(g uint32) multiraft.GroupStatus
	// Machine is group g's state machine on this node (read only).
	Machine(g uint32) *stream.Machine
	// GroupCount is the number of groups.
	GroupCount() int
	// Leads reports whether this node answers for the tail of group g.
	Leads(g uint32) bool
	// NotLeader is the answer of a node that must not serve group g.
	NotLeader(g uint32) error
}

// Engine is the request engine of one node: every StreamService call goes
// through it.
type Engine struct {
	cfg    Config
	groups Groups
	cold   *cold.Tier
	logger *slog.Logger
	now    func() time.Time

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

// newRequestEngine builds the request engine over the groups and the cold tier.
func newRequestEngine(cfg Config, groups Groups, coldTier *cold.Tier, now func() time.Time, logger *slog.Logger) *Engine {
	return &Engine{
		cfg: cfg, groups: groups, cold: coldTier, logger: logger, now: now,
		sweepBudget: defaultSweepBudget,
		inflight:    map[stream.Key]struct{}{},
		stopping:    make(chan struct{}),
	}
}

// Run runs the expiry sweep until ctx ends, then waits for the background
// touches and expiries in flight.
func (e *Engine) Run(ctx context.Context) error {
	e.sweepLoop(ctx)
	e.stopOnce.Do(func() { close(e.stopping) })
	e.bg.Wait()
	return nil
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// GroupOf places a stream (stream.GroupOf).
func (e *Engine) GroupOf(k stream.Key) uint32 {
	return stream.GroupOf(k.Bucket, k.Stream, e.groups.GroupCount())
}

// GroupCount is the number of Raft groups.
func (e *Engine) GroupCount() int { return e.groups.GroupCount() }

func (e *Engine) machine(k stream.Key) *stream.Machine { return e.groups.Machine(e.GroupOf(k)) }

func (e *Engine) nowMs() int64 { return e.now().UnixMilli() }

// leads reports whether this node answers for the tail of k.
func (e *Engine) leads(k stream.Key) bool { return e.groups.Leads(e.GroupOf(k)) }

// notLeader answers a request that must see a group's tail on a node that
// does not lead it.
func (e *Engine) notLeader(k stream.Key) error { return e.groups.NotLeader(e.GroupOf(k)) }

// propose submits cmd to group g and waits for its applied result, then
// drops the fork references the command released (a removed fork,
// cascading up its chain). A command rejected by the state machine
// returns its error together with the result.
func (e *Engine) propose(ctx context.Context, g uint32, cmd *storagev1.Command) (*stream.Result, error) {
	res, err := e.groups.Propose(ctx, g, cmd)
	if res != nil && len(res.Release) > 0 {
		e.release(ctx, res.Release)
	}
	return res, err
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

// MaxTokenBytes bounds a Producer-Id and a Stream-Seq. Both are kept in
// replicated state (each stream keeps up to stream.MaxProducers producer
// ids and its last Stream-Seq) and in every snapshot, so their size is
// memory on every replica.
const MaxTokenBytes = 256

// validToken checks a Producer-Id or Stream-Seq (what names it): at most
// MaxTokenBytes bytes of valid UTF-8 without control characters. A
// Producer-Id must not be empty; an empty Stream-Seq means none.
func validToken(what, v string) error {
	if len(v) > MaxTokenBytes {
		return fault.Errorf(fault.ErrInvalidArgument, "%s is %d bytes long, at most %d are allowed", what, len(v), MaxTokenBytes)
	}
	if !utf8.ValidString(v) {
		return fault.Errorf(fault.ErrInvalidArgument, "%s is not valid UTF-8", what)
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return fault.Errorf(fault.ErrInvalidArgument, "%s contains the control character %U", what, r)
		}
	}
	return nil
}

// validWriter checks the writer's tokens of an append: the producer id
// and the Stream-Seq.
func validWriter(req *streamv1.AppendRequest) error {
	if p := req.GetProducer(); p != nil {
		if p.GetId() == "" {
			return fault.Errorf(fault.ErrInvalidArgument, "Producer-Id must not be empty")
		}
		if err := validToken("Producer-Id", p.GetId()); err != nil {
			return err
		}
	}
	return validToken("Stream-Seq", req.GetStreamSeq())
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
	st := e.groups.Status(g)
	if st.Recovery != nil {
		// The replica holds a recovery plan: until the group's new history
		// applied here it serves nothing of the history the plan replaces.
		return fault.Errorf(fault.ErrUnavailable, "group %d is being recovered (accept-unsynced-loss plan of term %d)", g, st.Recovery.Term).With(fault.DetailRetryAfterMS, "1000")
	}
	if !st.IsLeader || st.Applied >= st.LeaderSince {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	if err := e.groups.WaitApplied(ctx, g, st.LeaderSince); err != nil {
		return fault.Errorf(fault.ErrUnavailable, "the new leader of group %d is still applying its log", g).With(fault.DetailRetryAfterMS, "200")
	}
	return nil
}

// settleTimeout bounds how long a request waits for a new leader to apply
// its predecessors' entries.
const settleTimeout = 5 * time.Second

// leaderLive is live on the stream's group leader: another replica (which
// may lag, or hold nothing) answers NOT_LEADER without looking at its
// state. Writes use it: the command they propose is checked again when
// it applies.
func (e *Engine) leaderLive(k stream.Key) (stream.Meta, error) {
	if !e.leads(k) {
		return stream.Meta{}, e.notLeader(k)
	}
	return e.live(k)
}

// readLive is live for a read a client observes: after the read barrier
// of the stream's group, so that the answer reflects every write
// acknowledged before the read began (on a follower too), and a leader cut
// off from its quorum answers UNAVAILABLE instead of stale state.
func (e *Engine) readLive(ctx context.Context, k stream.Key) (stream.Meta, error) {
	if err := e.groups.ReadBarrier(ctx, e.GroupOf(k)); err != nil {
		return stream.Meta{}, err
	}
	return e.live(k)
}

// readBarrierAll runs the read barrier of every group, at most
// maxParallelBarriers at a time, for a read that looks at all of them;
// it returns the first failure.
func (e *Engine) readBarrierAll(ctx context.Context) error {
	return e.eachGroup(ctx, e.groups.ReadBarrier)
}

// eachGroup runs fn for every group, at most maxParallelBarriers at a
// time; the first failure stops the others and is the answer.
func (e *Engine) eachGroup(ctx context.Context, fn func(context.Context, uint32) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	n := e.groups.GroupCount()
	errs := make(chan error, n)
	sem := make(chan struct{}, maxParallelBarriers)
	var wg sync.WaitGroup
	for g := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if err := fn(ctx, uint32(g)); err != nil {
				errs <- err
				cancel()
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs // nil when closed empty
}

// maxParallelBarriers bounds the read barriers one request runs at once.
const maxParallelBarriers = 16

// live looks a stream up as a client sees it: missing and expired streams
// are STREAM_NOT_FOUND, soft-deleted ones STREAM_GONE. An expired stream
// found here is expired in the background.
func (e *Engine) live(k stream.Key) (stream.Meta, error) {
	if err := e.settle(k); err != nil {
		return stream.Meta{}, err
	}
	m, ok := e.machine(k).Lookup(k)
	if !ok {
		return m, fault.Errorf(fault.ErrStreamNotFound, "stream %s not found", k.Stream)
	}
	if m.SoftDeleted {
		return m, fault.Errorf(fault.ErrStreamGone, "stream %s is deleted", k.Stream)
	}
	if m.ExpiredAt(e.nowMs()) {
		e.expireAsync(m)
		return m, fault.Errorf(fault.ErrStreamNotFound, "stream %s not found (expired)", k.Stream)
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
	if err != nil && !errors.Is(err, fault.ErrNotLeader) {
		e.logger.Warn("expire stream failed", "bucket", m.Key.Bucket, "stream", m.Key.Stream, "err", err)
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
	t := time.NewTicker(e.cfg.SweepInterval())
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
