package coldgc

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	coldgcv1 "github.com/ursula/ursula/proto/gen/go/ursula/coldgc/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/objstore"
)

// Config configures the worker.
type Config struct {
	// Interval is the pause between two passes over the GC queues.
	Interval time.Duration `toml:"interval"`
	// CompactInterval is the pause between two compaction passes (0: no
	// compaction).
	CompactInterval time.Duration `toml:"compact_interval"`
	// SmallChunkBytes: chunks below it are merged with their neighbours.
	SmallChunkBytes uint64 `toml:"small_chunk_bytes"`
	// MaxChunkBytes bounds a merged chunk.
	MaxChunkBytes uint64 `toml:"max_chunk_bytes"`
	// SweepInterval is the pause between two orphan sweeps (0: none).
	SweepInterval time.Duration `toml:"sweep_interval"`
	// OrphanAge: an unreferenced object is deleted once it is this old.
	OrphanAge time.Duration `toml:"orphan_age"`
}

// RegisterFlags registers the worker's flags with defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.Interval, "coldgc.interval", 2*time.Second, "pause between two passes over the cold-GC queues")
	fs.DurationVar(&c.CompactInterval, "coldgc.compact_interval", 30*time.Second, "pause between two compaction passes (0: none)")
	fs.Uint64Var(&c.SmallChunkBytes, "coldgc.small_chunk_bytes", 256<<10, "chunks below this size are merged")
	fs.Uint64Var(&c.MaxChunkBytes, "coldgc.max_chunk_bytes", 4<<20, "largest merged chunk")
	fs.DurationVar(&c.SweepInterval, "coldgc.sweep_interval", time.Hour, "pause between two orphan sweeps (0: none)")
	fs.DurationVar(&c.OrphanAge, "coldgc.orphan_age", 24*time.Hour, "an unreferenced object is deleted once it is this old")
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	if c.Interval <= 0 {
		errs = append(errs, errors.New("coldgc: interval must be positive"))
	}
	if c.CompactInterval < 0 || c.SweepInterval < 0 {
		errs = append(errs, errors.New("coldgc: compact_interval and sweep_interval must not be negative"))
	}
	if c.CompactInterval > 0 && (c.SmallChunkBytes == 0 || c.MaxChunkBytes < c.SmallChunkBytes) {
		errs = append(errs, errors.New("coldgc: want 0 < small_chunk_bytes <= max_chunk_bytes"))
	}
	if c.SweepInterval > 0 && c.OrphanAge < time.Hour {
		errs = append(errs, errors.New("coldgc: orphan_age must be at least 1h (an upload whose command is in flight must never look orphaned)"))
	}
	return errors.Join(errs...)
}

// Stats are the worker's counters.
type Stats struct {
	Passes          atomic.Uint64
	Reclaimed       atomic.Uint64 // GC entries reclaimed and acknowledged
	DeletedObjects  atomic.Uint64
	Errors          atomic.Uint64
	Compactions     atomic.Uint64
	CompactRejected atomic.Uint64
	OrphansDeleted  atomic.Uint64
	Sweeps          atomic.Uint64
	// CorruptObjects counts objects that failed their checksum when the
	// worker read them (a page to reclaim, a chunk to compact).
	CorruptObjects atomic.Uint64
	// HeldSkips counts the groups a pass skipped and the sweeps that
	// stopped because a backup held the cold GC.
	HeldSkips atomic.Uint64
}

// Worker reclaims, compacts and sweeps one cold store.
type Worker struct {
	cfg    Config
	node   coldgcv1.ColdGCServiceClient
	store  objstore.Store
	logger *slog.Logger
	now    func() time.Time
	stats  Stats
	// running is set while Run runs (the metrics plane's readiness).
	running atomic.Bool
}

// New returns a worker.
func New(cfg Config, node coldgcv1.ColdGCServiceClient, store objstore.Store, logger *slog.Logger) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Worker{cfg: cfg, node: node, store: store, logger: logger, now: time.Now}, nil
}

// Stats returns the worker's counters.
func (w *Worker) Stats() *Stats { return &w.stats }

// Run runs the three jobs until ctx ends.
func (w *Worker) Run(ctx context.Context) error {
	w.running.Store(true)
	defer w.running.Store(false)
	lastCompact, lastSweep := w.now(), w.now()
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, err := w.Reclaim(ctx, ""); err != nil && ctx.Err() == nil {
			w.logger.Warn("cold GC pass", "err", err)
		}
		if w.cfg.CompactInterval > 0 && w.now().Sub(lastCompact) >= w.cfg.CompactInterval {
			lastCompact = w.now()
			if err := w.Compact(ctx); err != nil && ctx.Err() == nil {
				w.logger.Warn("cold compaction pass", "err", err)
			}
		}
		if w.cfg.SweepInterval > 0 && w.now().Sub(lastSweep) >= w.cfg.SweepInterval {
			lastSweep = w.now()
			if _, err := w.Sweep(ctx); err != nil && ctx.Err() == nil {
				w.logger.Warn("orphan sweep", "err", err)
			}
		}
	}
}

// groupCount asks the node how many groups there are.
func (w *Worker) groupCount(ctx context.Context) (uint32, error) {
	r, err := w.node.GetGCQueue(ctx, &coldgcv1.GetGCQueueRequest{Group: 0, Limit: 1})
	if err != nil {
		return 0, err
	}
	return r.GetGroupCount(), nil
}

// Reclaim makes one pass over every group's GC queue, deleting what is
// due and acknowledging it; with a bucket, it takes only that bucket's
// entries, due or not (a purge). It returns the entries reclaimed.
func (w *Worker) Reclaim(ctx context.Context, bucket string) (int, error) {
	w.stats.Passes.Add(1)
	n, err := w.groupCount(ctx)
	if err != nil {
		return 0, err
	}
	total := 0
	var errs []error
	for g := range n {
		k, err := w.reclaimGroup(ctx, g, bucket)
		total += k
		if err != nil {
			errs = append(errs, fmt.Errorf("group %d: %w", g, err))
		}
	}
	return total, errors.Join(errs...)
}

func (w *Worker) reclaimGroup(ctx context.Context, g uint32, bucket string) (int, error) {
	q, err := w.node.GetGCQueue(ctx, &coldgcv1.GetGCQueueRequest{Group: g, Limit: 1024})
	if err != nil {
		return 0, err
	}
	if q.GetHeld() {
		w.stats.HeldSkips.Add(1)
		return 0, nil
	}
	now := w.now().UnixMilli()
	var done []uint64
	var errs []error
	for _, e := range q.GetEntries() {
		// A bucket's own pass (a purge) takes every entry at once: the
		// grace protects reads of live streams, and the bucket has none.
		if (bucket != "" && e.GetBucket() != bucket) || (bucket == "" && e.GetNotBeforeMs() > now) {
			continue
		}
		if err := w.reclaim(ctx, e); err != nil {
			w.stats.Errors.Add(1)
			errs = append(errs, err)
			continue
		}
		done = append(done, e.GetSeq())
	}
	if len(done) > 0 {
		if _, err := w.node.AckGC(ctx, &coldgcv1.AckGCRequest{Group: g, Seqs: done}); err != nil {
			return 0, errors.Join(append(errs, err)...)
		}
		w.stats.Reclaimed.Add(uint64(len(done)))
	}
	return len(done), errors.Join(errs...)
}

// reclaim deletes the objects of one GC entry. A missing object is
// reclaimed already.
func (w *Worker) reclaim(ctx context.Context, e *storagev1.GCEntry) error {
	switch e.GetKind() {
	case storagev1.GCKind_GC_KIND_OBJECT:
		return w.delete(ctx, e.GetKey())
	case storagev1.GCKind_GC_KIND_PREFIX:
		return w.deletePrefix(ctx, e.GetKey())
	case storagev1.GCKind_GC_KIND_PAGE:
		return w.deletePage(ctx, e.GetKey(), e.GetCrc32C(), 0)
	default:
		return fmt.Errorf("GC entry %d of unknown kind %v", e.GetSeq(), e.GetKind())
	}
}

func (w *Worker) delete(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	if err := w.store.Delete(ctx, keys...); err != nil {
		return err
	}
	w.stats.DeletedObjects.Add(uint64(len(keys)))
	return nil
}

// deletePrefix deletes every object under prefix (which ends in '/').
func (w *Worker) deletePrefix(ctx context.Context, prefix string) error {
	if !strings.HasSuffix(prefix, "/") || strings.Count(prefix, "/") < 1 {
		return fmt.Errorf("refusing to delete under %q: not a stream or bucket prefix", prefix)
	}
	var batch []string
	err := w.store.List(ctx, prefix, func(in objstore.Info) error {
		batch = append(batch, in.Key)
		if len(batch) == 1000 {
			err := w.delete(ctx, batch...)
			batch = batch[:0]
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return w.delete(ctx, batch...)
}

// deletePage deletes everything a sealed index page indexes, then the
// page: the page goes last, so an interrupted pass finds its entries again.
// A page whose body does not match its checksum (crc, from its reference)
// is never trusted to name objects to delete: only the page itself is
// deleted, and what it indexed, which nothing references any more, is left
// to the orphan sweep.
func (w *Worker) deletePage(ctx context.Context, key string, crc uint32, depth int) error {
	if depth > 64 {
		return fmt.Errorf("index page %q nests deeper than 64 levels", key)
	}
	body, err := w.store.Get(ctx, key)
	if errors.Is(err, objstore.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	entries, err := coldfmt.DecodePage(body, crc)
	if errors.Is(err, coldfmt.ErrCorrupt) {
		w.stats.CorruptObjects.Add(1)
		w.logger.Error("cold index page failed its checksum: deleting only the page, the orphan sweep takes what it indexed", "key", key, "err", err)
		return w.delete(ctx, key)
	}
	if err != nil {
		return err
	}
	var leaves []string
	for _, r := range entries {
		if r.GetKind() == storagev1.ColdKind_COLD_KIND_PAGE {
			if err := w.deletePage(ctx, r.GetKey(), r.GetCrc32C(), depth+1); err != nil {
				return err
			}
			continue
		}
		leaves = append(leaves, r.GetKey())
	}
	if err := w.delete(ctx, leaves...); err != nil {
		return err
	}
	return w.delete(ctx, key)
}

// Compact merges runs of small chunks in every group.
func (w *Worker) Compact(ctx context.Context) error {
	n, err := w.groupCount(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for g := range n {
		resp, err := w.node.ListCompactions(ctx, &coldgcv1.ListCompactionsRequest{Group: g, SmallBytes: w.cfg.SmallChunkBytes, MaxBytes: w.cfg.MaxChunkBytes})
		if err != nil {
			errs = append(errs, fmt.Errorf("group %d: %w", g, err))
			continue
		}
		for _, c := range resp.GetCompactions() {
			if err := w.compact(ctx, g, c); err != nil {
				w.stats.Errors.Add(1)
				errs = append(errs, fmt.Errorf("group %d, stream %s: %w", g, c.GetStream(), err))
			}
		}
	}
	return errors.Join(errs...)
}

func (w *Worker) compact(ctx context.Context, g uint32, c *coldgcv1.Compaction) error {
	run := c.GetRun()
	var segments [][]byte
	var records []uint64
	for _, r := range run {
		body, err := w.store.Get(ctx, r.GetKey())
		if err != nil {
			return err
		}
		// Verified before anything is merged: a compaction must never
		// give a damaged chunk's bytes a fresh, valid checksum.
		data, recs, err := coldfmt.DecodeChunk(r.GetStart(), r.GetEnd()-r.GetStart(), body, r.GetCrc32C())
		if err != nil {
			if errors.Is(err, coldfmt.ErrCorrupt) {
				w.stats.CorruptObjects.Add(1)
				w.logger.Error("cold chunk failed its checksum: not compacting it", "key", r.GetKey(), "bucket", c.GetBucket(), "err", err)
			}
			return fmt.Errorf("chunk %q: %w", r.GetKey(), err)
		}
		segments = append(segments, data)
		records = append(records, recs...)
	}
	start, end := run[0].GetStart(), run[len(run)-1].GetEnd()
	body, crc := coldfmt.EncodeChunk(start, segments, records)
	key := coldfmt.ChunkKey(coldfmt.StreamPrefix(c.GetBucket(), c.GetStream(), c.GetIncarnation()), start, end)
	if err := w.store.Put(ctx, key, body); err != nil {
		return err
	}
	swap := &storagev1.ColdSwap{
		Bucket: c.GetBucket(), Stream: c.GetStream(), Incarnation: c.GetIncarnation(), Replaced: run,
		Chunk: &storagev1.ColdRef{Start: start, End: end, Key: key, Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: uint64(len(body)), Records: uint32(len(records)),
			FirstRecord: run[0].GetFirstRecord(), NextRecord: run[len(run)-1].GetNextRecord(), Crc32C: crc},
	}
	if _, err := w.node.CommitCompaction(ctx, &coldgcv1.CommitCompactionRequest{Group: g, Swap: swap}); err != nil {
		w.stats.CompactRejected.Add(1)
		// Whether it was refused or lost, an unreferenced chunk is an
		// orphan; deleting it now saves the sweep a day. A swap that
		// did commit despite the error is impossible to tell apart here,
		// so keep the object in that one case: the sweep decides later.
		if !outcomeUnknown(err) {
			_ = w.delete(context.WithoutCancel(ctx), key)
		}
		return err
	}
	w.stats.Compactions.Add(1)
	return nil
}

// Sweep deletes objects under the cold root that no state references and
// that are older than OrphanAge; it returns how many it deleted. A sweep
// the node answers COLD_GC_HELD (a backup holds the cold GC) deletes
// nothing and is no error.
func (w *Worker) Sweep(ctx context.Context) (int, error) {
	w.stats.Sweeps.Add(1)
	n, err := w.sweep(ctx)
	if gcHeld(err) {
		w.stats.HeldSkips.Add(1)
		w.logger.Debug("orphan sweep skipped: a backup holds the cold GC")
		return 0, nil
	}
	return n, err
}

func (w *Worker) sweep(ctx context.Context) (int, error) {
	lp, err := w.node.ListLivePrefixes(ctx, &coldgcv1.ListLivePrefixesRequest{})
	if err != nil {
		return 0, err
	}
	live := make(map[string]bool, len(lp.GetPrefixes()))
	for _, p := range lp.GetPrefixes() {
		live[p] = true
	}
	cutoff := w.now().Add(-w.cfg.OrphanAge)
	refs := map[string]map[string]bool{} // live prefix → referenced keys
	var orphans []string
	err = w.store.List(ctx, "", func(in objstore.Info) error {
		if in.Key == coldfmt.FormatEpochKey || !in.Modified.Before(cutoff) {
			return nil
		}
		prefix, ok := streamPrefix(in.Key)
		if !ok {
			return nil // not laid out by Ursula: never ours to delete
		}
		if !live[prefix] {
			orphans = append(orphans, in.Key)
			return nil
		}
		keys, ok := refs[prefix]
		if !ok {
			r, err := w.node.GetColdReferences(ctx, &coldgcv1.GetColdReferencesRequest{Prefix: prefix})
			if err != nil {
				return err
			}
			keys = make(map[string]bool, len(r.GetKeys()))
			for _, k := range r.GetKeys() {
				keys[k] = true
			}
			if !r.GetLive() {
				keys = map[string]bool{}
			}
			refs[prefix] = keys
		}
		if !keys[in.Key] {
			orphans = append(orphans, in.Key)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := w.delete(ctx, orphans...); err != nil {
		return 0, err
	}
	w.stats.OrphansDeleted.Add(uint64(len(orphans)))
	return len(orphans), nil
}

// streamPrefix returns the stream prefix ("{bucket}/{hash}/{incarnation}/")
// of an object key laid out by Ursula.
func streamPrefix(key string) (string, bool) {
	parts := strings.SplitN(key, "/", 4)
	if len(parts) != 4 || len(parts[1]) != 32 || parts[3] == "" {
		return "", false
	}
	for _, c := range parts[2] {
		if c < '0' || c > '9' {
			return "", false
		}
	}
	return parts[0] + "/" + parts[1] + "/" + parts[2] + "/", true
}

// DeletePrefix deletes every object under a bucket's or stream's prefix.
func (w *Worker) DeletePrefix(ctx context.Context, prefix string) error {
	return w.deletePrefix(ctx, prefix)
}
