package engine

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/storage/tier"
)

// flushPieces bounds the pieces (chunks and external payloads) of one
// ColdFlush command.
const flushPieces = 16

// coldTier is the engine's link to the object store.
type coldTier struct {
	store    objstore.Store
	reader   *tier.Reader
	cfg      ColdConfig
	slots    chan struct{} // upload concurrency
	flushing sync.Map      // stream.Key → struct{}: one flush per stream at a time
	kick     chan struct{} // wakes the flush loop (a write hit the cap)
	stats    ColdStats
}

// ColdStats are the cold tier's counters.
type ColdStats struct {
	Flushes            atomic.Uint64
	FlushRejected      atomic.Uint64
	Uploads            atomic.Uint64
	UploadBytes        atomic.Uint64
	UploadErrors       atomic.Uint64
	ExternalPayloads   atomic.Uint64
	ReadErrors         atomic.Uint64
	BackpressureWrites atomic.Uint64
	SealedPages        atomic.Uint64
	Retired            atomic.Uint64
	Compactions        atomic.Uint64
	GCAcked            atomic.Uint64
}

// SetColdStore attaches the cold store; call it before Run. Without one,
// every committed byte stays in memory (tests of the hot path only).
func (e *Engine) SetColdStore(store objstore.Store) {
	cfg := e.cfg.Cold
	if cfg == (ColdConfig{}) {
		cfg = DefaultColdConfig()
	}
	e.cold = &coldTier{
		store:  store,
		reader: tier.NewReader(tier.NewCache(store, int64(cfg.BlockBytes), int64(cfg.CacheBytes))),
		cfg:    cfg,
		slots:  make(chan struct{}, cfg.FlushConcurrency),
		kick:   make(chan struct{}, 1),
	}
}

// ColdStore is the attached cold store (nil without one).
func (e *Engine) ColdStore() objstore.Store {
	if e.cold == nil {
		return nil
	}
	return e.cold.store
}

// ColdStats returns the cold tier's counters (nil without a cold store).
func (e *Engine) ColdStats() *ColdStats {
	if e.cold == nil {
		return nil
	}
	return &e.cold.stats
}

// ColdCacheStats returns the cold read cache's counters.
func (e *Engine) ColdCacheStats() tier.CacheStats {
	if e.cold == nil {
		return tier.CacheStats{}
	}
	return e.cold.reader.Cache().Stats()
}

// ColdConfig is the cold tier's effective configuration.
func (e *Engine) ColdConfig() ColdConfig {
	if e.cold == nil {
		return ColdConfig{}
	}
	return e.cold.cfg
}

// admitWrite refuses a write while the group holds more hot bytes than its
// cap: flushes must catch up first.
func (e *Engine) admitWrite(g uint32) error {
	c := e.cold
	if c == nil || uint64(e.machines[g].HotBytes()) < c.cfg.HotCapBytes {
		return nil
	}
	c.stats.BackpressureWrites.Add(1)
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return errcode.New(errcode.Overloaded, "group %d holds %d hot bytes, at or above its cap of %d: waiting for cold flushes", g, e.machines[g].HotBytes(), c.cfg.HotCapBytes).
		With(errcode.KeyRetryAfterMS, "1000")
}

// storeExternal uploads a large append body as an object of its own and
// returns its locator for the Append command.
func (e *Engine) storeExternal(ctx context.Context, m stream.Meta, body []byte) (*storagev1.ColdRef, error) {
	c := e.cold
	key := coldfmt.ExternalKey(coldfmt.StreamPrefix(m.Key.Bucket, m.Key.Stream, m.Incarnation))
	if err := c.store.Put(ctx, key, body); err != nil {
		c.stats.UploadErrors.Add(1)
		return nil, errcode.New(errcode.Unavailable, "store a %d-byte append in the cold store: %v", len(body), err).With(errcode.KeyRetryAfterMS, "1000")
	}
	c.stats.Uploads.Add(1)
	c.stats.UploadBytes.Add(uint64(len(body)))
	c.stats.ExternalPayloads.Add(1)
	return &storagev1.ColdRef{Key: key, Kind: storagev1.ColdKind_COLD_KIND_EXTERNAL, Size: uint64(len(body))}, nil
}

// discard deletes objects a rejected command named (best effort: the
// orphan sweep catches what this misses).
func (e *Engine) discard(keys ...string) {
	if len(keys) == 0 || e.cold == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.cold.store.Delete(ctx, keys...); err != nil {
		e.logger.Warn("delete objects of a rejected cold command", "err", err)
	}
}

// flushLoop flushes the hot bytes of the groups this node leads.
func (e *Engine) flushLoop(ctx context.Context) {
	c := e.cold
	t := time.NewTicker(c.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.kick:
		}
		var wg sync.WaitGroup
		for g := range e.machines {
			if !e.host.Status(uint32(g)).IsLeader {
				continue
			}
			for _, h := range e.flushCandidates(uint32(g)) {
				if _, busy := c.flushing.LoadOrStore(h.Key, struct{}{}); busy {
					continue
				}
				select {
				case c.slots <- struct{}{}:
				case <-ctx.Done():
					c.flushing.Delete(h.Key)
					wg.Wait()
					return
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-c.slots; c.flushing.Delete(h.Key) }()
					if err := e.flushStream(ctx, uint32(g), h); err != nil && ctx.Err() == nil {
						e.logger.Debug("cold flush", "group", g, "stream", h.Key.Stream, "err", err)
					}
				}()
			}
		}
		wg.Wait()
	}
}

// flushCandidates picks the streams of a group to flush now: those past
// the size or age threshold or holding external payloads, then the largest
// others while the group holds more than its flush threshold.
func (e *Engine) flushCandidates(g uint32) []stream.HotStream {
	c := e.cold
	hs := e.machines[g].HotStreams()
	if len(hs) == 0 {
		return nil
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].HotBytes > hs[j].HotBytes })
	now := e.nowMs()
	groupHot := uint64(e.machines[g].HotBytes())
	var out []stream.HotStream
	for _, h := range hs {
		due := h.HotBytes >= c.cfg.FlushBytes || now-h.HotSinceMs >= c.cfg.FlushAge.Milliseconds() ||
			h.Tail-h.ColdEnd > h.HotBytes
		if due || groupHot > c.cfg.GroupFlushBytes {
			out = append(out, h)
			groupHot -= min(groupHot, h.HotBytes)
		}
	}
	return out
}

// FlushCold flushes a stream's hot bytes now, on its group's leader.
func (e *Engine) FlushCold(ctx context.Context, k stream.Key) error {
	if e.cold == nil {
		return errcode.New(errcode.InvalidArgument, "no cold store is configured")
	}
	if err := validKey(k); err != nil {
		return err
	}
	if !e.leads(k) {
		return e.notLeader(k)
	}
	m, ok := e.machine(k).Lookup(k)
	if !ok {
		return errcode.New(errcode.StreamNotFound, "stream %s not found", k.Stream)
	}
	c := e.cold
	for {
		if _, busy := c.flushing.LoadOrStore(k, struct{}{}); !busy {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	defer c.flushing.Delete(k)
	g := e.GroupOf(k)
	for {
		cur, ok := e.machines[g].Lookup(k)
		if !ok || cur.Incarnation != m.Incarnation || cur.ColdEnd >= cur.Tail {
			return nil
		}
		h := stream.HotStream{Key: k, Incarnation: m.Incarnation, ColdEnd: cur.ColdEnd, Tail: cur.Tail}
		if err := e.flushStream(ctx, g, h); err != nil {
			return err
		}
	}
}

// flushStream uploads the oldest part of a stream's hot window and commits
// it to the cold index.
func (e *Engine) flushStream(ctx context.Context, g uint32, h stream.HotStream) error {
	c := e.cold
	m := e.machines[g]
	pieces, levels, ok := m.FlushPlan(h.Key, h.Incarnation, c.cfg.MaxChunkBytes)
	if !ok || len(pieces) == 0 {
		return nil
	}
	if len(pieces) > flushPieces {
		pieces = pieces[:flushPieces]
	}
	prefix := coldfmt.StreamPrefix(h.Key.Bucket, h.Key.Stream, h.Incarnation)
	var uploaded []string
	fail := func(err error) error {
		c.stats.UploadErrors.Add(1)
		e.discard(uploaded...)
		return err
	}
	chunks := make([]*storagev1.ColdRef, 0, len(pieces))
	for _, p := range pieces {
		if p.External != nil {
			chunks = append(chunks, proto.CloneOf(p.External))
			continue
		}
		body := coldfmt.EncodeChunk(p.Start, p.Data, p.Records)
		key := coldfmt.ChunkKey(prefix, p.Start, p.End)
		if err := c.store.Put(ctx, key, body); err != nil {
			return fail(fmt.Errorf("upload chunk [%d, %d): %w", p.Start, p.End, err))
		}
		uploaded = append(uploaded, key)
		c.stats.Uploads.Add(1)
		c.stats.UploadBytes.Add(uint64(len(body)))
		chunks = append(chunks, &storagev1.ColdRef{
			Start: p.Start, End: p.End, Key: key, Kind: storagev1.ColdKind_COLD_KIND_CHUNK,
			Size: uint64(len(body)), Records: uint32(len(p.Records)),
			FirstRecord: p.FirstRecord, NextRecord: p.NextRecord,
		})
	}
	// Seal full levels, as apply will: the pages are uploaded first.
	if len(levels) == 0 {
		levels = []*storagev1.ColdLevel{{}}
	}
	levels[0].Entries = append(levels[0].Entries, chunks...)
	var seals []*storagev1.ColdSeal
	for k := 0; k < len(levels); k++ {
		for len(levels[k].GetEntries()) >= coldfmt.PageFanout {
			run := levels[k].Entries[:coldfmt.PageFanout]
			body, digest := coldfmt.EncodePage(run)
			key := coldfmt.PageKey(prefix, uint32(k+1), run[0].GetStart(), run[len(run)-1].GetEnd())
			if err := c.store.Put(ctx, key, body); err != nil {
				return fail(fmt.Errorf("upload index page: %w", err))
			}
			uploaded = append(uploaded, key)
			c.stats.Uploads.Add(1)
			c.stats.UploadBytes.Add(uint64(len(body)))
			seals = append(seals, &storagev1.ColdSeal{Level: uint32(k), Count: coldfmt.PageFanout, Key: key, Size: uint64(len(body)), Digest: digest})
			page := &storagev1.ColdRef{Start: run[0].GetStart(), End: run[len(run)-1].GetEnd(), Key: key, Kind: storagev1.ColdKind_COLD_KIND_PAGE, Size: uint64(len(body)), Records: coldfmt.PageFanout, Level: uint32(k + 1),
				FirstRecord: run[0].GetFirstRecord(), NextRecord: run[len(run)-1].GetNextRecord()}
			levels[k].Entries = levels[k].Entries[coldfmt.PageFanout:]
			if k+1 == len(levels) {
				levels = append(levels, &storagev1.ColdLevel{})
			}
			levels[k+1].Entries = append(levels[k+1].Entries, page)
		}
	}
	cmd := &storagev1.Command{Op: &storagev1.Command_ColdFlush{ColdFlush: &storagev1.ColdFlush{
		Bucket: h.Key.Bucket, Stream: h.Key.Stream, Incarnation: h.Incarnation,
		Chunks: chunks, Seals: seals, GraceMs: c.cfg.GCGrace.Milliseconds(),
	}}}
	if _, err := e.propose(ctx, g, cmd); err != nil {
		var de *errcode.Error
		if errors.As(err, &de) && de.Code != errcode.OutcomeUnknown && de.Code != errcode.Unavailable && de.Code != errcode.NotLeader {
			// Refused by apply: nothing names the objects.
			c.stats.FlushRejected.Add(1)
			e.discard(uploaded...)
		}
		return err
	}
	c.stats.Flushes.Add(1)
	c.stats.SealedPages.Add(uint64(len(seals)))
	return nil
}

// readCold reads bytes of a stream from a cold reference covering from.
func (e *Engine) readCold(ctx context.Context, m stream.Meta, ref *storagev1.ColdRef, from, to, limit uint64) ([]byte, uint64, error) {
	if e.cold == nil {
		return nil, from, errcode.New(errcode.Internal, "stream %s has cold bytes but no cold store is configured", m.Key.Stream)
	}
	if ref == nil {
		if from < m.Retained {
			return nil, from, trimmed(m, from)
		}
		return nil, from, errcode.New(errcode.Internal, "stream %s: no cold index entry covers position %d", m.Key.Stream, from)
	}
	r := e.cold.reader
	leaf, err := r.Leaf(ctx, ref, from)
	if err == nil {
		var data []byte
		var end uint64
		data, end, err = r.Read(ctx, leaf, from, to, limit, tier.Unit{JSON: m.JSON, Text: stream.IsText(m.ContentType)})
		if err == nil {
			return data, end, nil
		}
	}
	if ctx.Err() != nil {
		return nil, from, ctx.Err()
	}
	e.cold.stats.ReadErrors.Add(1)
	return nil, from, errcode.New(errcode.ColdStoreFailed, "read cold bytes of stream %s at %d: %v", m.Key.Stream, from, err)
}

// trimmed is the error of a read below a stream's retention.
func trimmed(m stream.Meta, pos uint64) error {
	return errcode.New(errcode.OffsetTrimmed, "offset %s is below the stream's retention %s", stream.FormatOffset(pos), stream.FormatOffset(m.Retained)).
		With(errcode.KeyNextOffset, stream.FormatOffset(m.Retained))
}

// coldUnitEnd resolves a fork sub-offset whose append lies in the cold range.
func (e *Engine) coldUnitEnd(ctx context.Context, m stream.Meta, ref *storagev1.ColdRef, pos, n, clip uint64) (uint64, bool, error) {
	if e.cold == nil || ref == nil {
		return 0, false, nil
	}
	leaf, err := e.cold.reader.Leaf(ctx, ref, pos)
	if err != nil {
		return 0, false, errcode.New(errcode.ColdStoreFailed, "read the cold index of %s: %v", m.Key.Stream, err)
	}
	end, ok, err := e.cold.reader.UnitEnd(ctx, leaf, pos, n, clip, m.JSON)
	if err != nil {
		return 0, false, errcode.New(errcode.ColdStoreFailed, "read cold bytes of %s: %v", m.Key.Stream, err)
	}
	return end, ok, nil
}
