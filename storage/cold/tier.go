package cold

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/storage/tier"
)

// Groups is how the cold tier reaches the Raft groups.
type Groups interface {
	// Propose replicates a command through group g (forwarding it to a
	// remote leader when it may run there) and returns its result.
	Propose(ctx context.Context, g uint32, cmd *storagev1.Command) (*stream.Result, error)
	// Status is group g's Raft status on this node.
	Status(g uint32) multiraft.GroupStatus
	// ReadBarrier makes this node's replica of g reflect every write
	// acknowledged before the call (a read index of the group's leader).
	ReadBarrier(ctx context.Context, g uint32) error
	// Machine is group g's state machine on this node (read only).
	Machine(g uint32) *stream.Machine
	// GroupCount is the number of groups.
	GroupCount() int
	// Leads reports whether this node answers for the tail of group g.
	Leads(g uint32) bool
}

// Tier is a node's cold tier.
type Tier struct {
	cfg    Config
	store  objstore.Store // nil: no cold store (every byte stays hot)
	reader *tier.Reader
	groups Groups
	logger *slog.Logger
	now    func() time.Time

	slots    chan struct{}       // upload concurrency
	inflight *semaphore.Weighted // hot bytes the running uploads encode
	flushing sync.Map            // stream.Key → struct{}: one flush per stream at a time
	kick     chan struct{}       // wakes the flush loop (a write hit the cap)
	admit    admitQueue          // writes waiting for room under the node's cap
	nodeHot  func() int64        // the hot bytes of all the node's groups
	staged   stagedIndex
	seeds    chan seed // seed listings of staged parts (staged.go)
	stats    Stats
}

// Stats are the cold tier's counters.
type Stats struct {
	Flushes          atomic.Uint64
	FlushRejected    atomic.Uint64
	Uploads          atomic.Uint64
	UploadBytes      atomic.Uint64
	UploadErrors     atomic.Uint64
	ExternalPayloads atomic.Uint64
	ReadErrors       atomic.Uint64
	// CorruptReads counts reads refused because a cold object's bytes did
	// not match their checksum (COLD_OBJECT_CORRUPT).
	CorruptReads       atomic.Uint64
	BackpressureWrites atomic.Uint64
	// AdmitWaits counts writes that waited for room under the node's cap.
	AdmitWaits  atomic.Uint64
	SealedPages atomic.Uint64
	Retired     atomic.Uint64
	Compactions atomic.Uint64
	GCAcked     atomic.Uint64
}

// New builds the cold tier over store (nil keeps every committed byte in
// memory: tests of the hot path only). The zero cfg means DefaultConfig.
// It starts nothing.
//
// nodeHot reports the hot bytes of all the node's groups. Every write
// reads it: it must be one counter the machines share
// (stream.Machine.TallyHotIn), not a sum over the groups' counters, each
// in a cache line the shard workers write at every append.
func New(cfg Config, store objstore.Store, groups Groups, nodeHot func() int64, now func() time.Time, logger *slog.Logger) (*Tier, error) {
	if cfg == (Config{}) {
		cfg = DefaultConfig()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	t := &Tier{
		cfg: cfg, store: store, groups: groups, nodeHot: nodeHot, logger: logger, now: now,
		slots:    make(chan struct{}, cfg.FlushConcurrency),
		inflight: semaphore.NewWeighted(int64(cfg.FlushInflightBytes)),
		kick:     make(chan struct{}, 1),
		seeds:    make(chan seed, max(groups.GroupCount(), 1)),
	}
	if store != nil {
		t.reader = tier.NewReader(tier.NewCache(store, int64(cfg.BlockBytes), int64(cfg.CacheBytes)))
	}
	return t, nil
}

// Enabled reports whether a cold store is attached.
func (t *Tier) Enabled() bool { return t.store != nil }

// Config is the tier's effective configuration.
func (t *Tier) Config() Config { return t.cfg }

// Store is the cold store (nil without one).
func (t *Tier) Store() objstore.Store { return t.store }

// Stats returns the tier's counters.
func (t *Tier) Stats() *Stats { return &t.stats }

// CacheStats returns the read cache's counters.
func (t *Tier) CacheStats() tier.CacheStats {
	if t.reader == nil {
		return tier.CacheStats{}
	}
	return t.reader.Cache().Stats()
}

// errNoStore is the answer of an operation that needs a cold store on a
// node without one.
func errNoStore(what string) error {
	return fault.Errorf(fault.ErrNoColdStore, "%s needs a cold store", what)
}

func (t *Tier) refuseWrite(why string) error {
	t.stats.BackpressureWrites.Add(1)
	t.kickFlush()
	return fault.Errorf(fault.ErrOverloaded, "%s: waiting for cold flushes", why).
		With(fault.DetailRetryAfterMS, "1000")
}

// kickFlush wakes the flush loop before its next tick.
func (t *Tier) kickFlush() {
	select {
	case t.kick <- struct{}{}:
	default:
	}
}

// nodeHotBytes is the hot bytes of every group on this node: each
// replica holds its group's hot window, led here or not.
func (t *Tier) nodeHotBytes() uint64 { return uint64(max(t.nodeHot(), 0)) }

// External reports whether an append of n bytes goes to the cold store as
// an object of its own.
func (t *Tier) External(n int) bool {
	return t.store != nil && t.cfg.ExternalMinBytes > 0 && uint64(n) >= t.cfg.ExternalMinBytes
}

// StoreExternal uploads a large append body as an object of its own (a
// chunk without record ends, so that reads verify it block by block) and
// returns its locator for the Append command: the object's key, size and
// checksum, and the body's length as End (Start 0; apply rebases both).
func (t *Tier) StoreExternal(ctx context.Context, m stream.Meta, body []byte) (*storagev1.ColdRef, error) {
	key := coldfmt.ExternalKey(coldfmt.StreamPrefix(m.Key.Bucket, m.Key.Stream, m.Incarnation))
	obj, crc := coldfmt.EncodeChunk(0, [][]byte{body}, nil)
	if err := t.Put(ctx, key, obj, "append"); err != nil {
		return nil, err
	}
	t.stats.ExternalPayloads.Add(1)
	return &storagev1.ColdRef{Key: key, Kind: storagev1.ColdKind_COLD_KIND_EXTERNAL, Size: uint64(len(obj)), End: uint64(len(body)), Crc32C: crc}, nil
}

// Put uploads an object (what names it in the error).
func (t *Tier) Put(ctx context.Context, key string, body []byte, what string) error {
	if t.store == nil {
		return errNoStore("storing a " + what)
	}
	if err := t.store.Put(ctx, key, body); err != nil {
		t.stats.UploadErrors.Add(1)
		return fault.Errorf(fault.ErrUnavailable, "store a %d-byte %s in the cold store: %v", len(body), what, err).With(fault.DetailRetryAfterMS, "1000")
	}
	t.stats.Uploads.Add(1)
	t.stats.UploadBytes.Add(uint64(len(body)))
	return nil
}

// maxCachedObjectBytes bounds the objects Get reads through the block
// cache (a bootstrap storm reads the same snapshot again and again; a
// large one would evict everything else).
const maxCachedObjectBytes = 1 << 20

// Get reads a whole object of the given size of stream k (what names it
// in errors), verified by check before it is served (and, for a small one,
// before it is cached): check returns an error wrapping coldfmt.ErrCorrupt
// when the bytes are not the ones committed.
func (t *Tier) Get(ctx context.Context, k stream.Key, key string, size int64, what string, check func([]byte) error) ([]byte, error) {
	if t.store == nil {
		return nil, fault.Errorf(fault.ErrInternal, "%s is in the cold store but none is configured", what)
	}
	var body []byte
	var err error
	if size <= maxCachedObjectBytes {
		body, err = t.reader.Cache().ReadSealed(ctx, key, 0, size, check)
	} else if body, err = t.store.Get(ctx, key); err == nil {
		if int64(len(body)) != size {
			err = fmt.Errorf("%w: %q holds %d bytes, its reference %d", coldfmt.ErrCorrupt, key, len(body), size)
		} else {
			err = check(body)
		}
		if err != nil {
			body = nil
		}
	}
	if err != nil {
		return nil, t.readFailed(ctx, k, "read "+what, err)
	}
	return body, nil
}

// Discard deletes objects a rejected command named (best effort: the
// orphan sweep catches what this misses).
func (t *Tier) Discard(keys ...string) {
	if len(keys) == 0 || t.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := t.store.Delete(ctx, keys...); err != nil {
		t.logger.Warn("delete objects of a rejected cold command", "err", err)
	}
}

// GroupCount is the number of Raft groups.
func (t *Tier) GroupCount() int { return t.groups.GroupCount() }
