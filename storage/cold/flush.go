package cold

import (
	"context"
	"fmt"
	"hash/maphash"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// flushPieces bounds the pieces (chunks and external payloads) of one
// ColdFlush command.
const flushPieces = 16

// Run flushes the hot bytes of the groups this node leads until ctx ends,
// and runs the seed listings of their staged snapshot parts.
func (t *Tier) Run(ctx context.Context) error {
	if t.store == nil {
		<-ctx.Done()
		return nil
	}
	var seeding sync.WaitGroup
	seeding.Go(func() { t.seedLoop(ctx) })
	defer seeding.Wait()
	c := t
	tick := time.NewTicker(c.cfg.FlushInterval)
	defer tick.Stop()
	var candidates []stream.HotStream // reused: see Machine.HotStreams
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-c.kick:
		}
		var wg sync.WaitGroup
		nodeHot := c.nodeHotBytes()
		for g := range c.groups.GroupCount() {
			st := c.groups.Status(uint32(g))
			if !st.IsLeader {
				continue
			}
			// A term's staged-part totals start when the node finds it leads.
			c.startCounting(uint32(g), st.Term)
			candidates = c.flushCandidates(uint32(g), nodeHot, candidates[:0])
			for _, h := range candidates {
				if _, busy := c.flushing.LoadOrStore(h.Key, struct{}{}); busy {
					continue
				}
				w := c.uploadWeight(h)
				if err := c.inflight.Acquire(ctx, w); err != nil {
					c.flushing.Delete(h.Key)
					wg.Wait()
					return nil
				}
				select {
				case c.slots <- struct{}{}:
				case <-ctx.Done():
					c.inflight.Release(w)
					c.flushing.Delete(h.Key)
					wg.Wait()
					return nil
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					defer func() { <-c.slots; c.inflight.Release(w); c.flushing.Delete(h.Key) }()
					if err := c.flushStream(ctx, uint32(g), h); err != nil && ctx.Err() == nil {
						c.logger.Debug("cold flush", "group", g, "stream", h.Key.Stream, "err", err)
					}
				}()
			}
		}
		wg.Wait()
	}
}

// uploadWeight is the share of FlushInflightBytes a flush of h takes: the
// hot bytes one flush encodes (at most MaxChunkBytes), at least one.
func (t *Tier) uploadWeight(h stream.HotStream) int64 {
	return int64(max(1, min(h.HotBytes, t.cfg.MaxChunkBytes, t.cfg.FlushInflightBytes)))
}

// flushCandidates picks the streams of a group to flush now (see
// pickFlushes), listing them in buf's storage. While the node (holding
// nodeHot) is above half its cap, a group's threshold is its share of that
// half when smaller than GroupFlushBytes.
func (t *Tier) flushCandidates(g uint32, nodeHot uint64, buf []stream.HotStream) []stream.HotStream {
	hs := t.groups.Machine(g).HotStreams(buf)
	if len(hs) == 0 {
		return hs
	}
	limit := t.cfg.GroupFlushBytes
	if half := t.cfg.NodeHotCapBytes / 2; nodeHot > half {
		limit = min(limit, half/uint64(max(t.groups.GroupCount(), 1)))
	}
	return pickFlushes(hs, t.now().UnixMilli(), uint64(t.groups.Machine(g).HotBytes()), limit, t.cfg)
}

// pickFlushes filters hs, a group's hot streams, in place: those past the
// size or age threshold or holding external payloads, then, while the
// group holds more than limit hot bytes, the largest others. Only that
// pressure needs the largest first: the sort is skipped on the common
// path, where a group of many small streams holds thousands of hot ones.
func pickFlushes(hs []stream.HotStream, nowMs int64, groupHot, limit uint64, cfg Config) []stream.HotStream {
	if groupHot > limit {
		sort.Slice(hs, func(i, j int) bool { return hs[i].HotBytes > hs[j].HotBytes })
	}
	out := hs[:0]
	for _, h := range hs {
		due := h.HotBytes >= cfg.FlushBytes || agedOut(h, nowMs, cfg.FlushAge.Milliseconds()) ||
			h.Tail-h.ColdEnd > h.HotBytes
		if due || groupHot > limit {
			out = append(out, h)
			groupHot -= min(groupHot, h.HotBytes)
		}
	}
	return out
}

// flushSpread is the share of FlushAge over which the age-based flushes of
// streams written together are spread: a stream's hot window is due at a
// point drawn in the last quarter of its age bound, never past it.
const flushSpread = 4

// spreadSeed keys the draws of agedOut (one per process: only their spread
// matters, not which stream goes first).
var spreadSeed = maphash.MakeSeed()

// agedOut reports whether h's hot window is due for its age-based flush:
// it is once it is ageMs old, or earlier, by up to a quarter of ageMs,
// by a draw of its own. Streams created or written in one burst (a
// benchmark's 500 writers, a deployment's clients after a restart) have
// hot windows that start together and, flushed at exactly ageMs, would
// flush together every ageMs for ever: 500 uploads in one burst that took
// the node's cores from the requests beside them (the fan-out benchmark
// run right after the 500-stream one: p99 31-63 ms in six runs before the
// draw, 26-36 ms with it, ~20 ms on an idle node). The draw depends on the
// window's start too, so no stream is always among the early ones. It is
// made only inside the last quarter, so a tick over a group of many hot
// streams hashes only those near their bound.
func agedOut(h stream.HotStream, nowMs, ageMs int64) bool {
	age := nowMs - h.HotSinceMs
	if age >= ageMs {
		return true
	}
	early := ageMs / flushSpread
	if age < ageMs-early || early <= 0 {
		return false
	}
	draw := maphash.String(spreadSeed, h.Key.Stream) ^ uint64(h.HotSinceMs)*0x9e3779b97f4a7c15
	draw ^= draw >> 31 // a finalizer, so that consecutive starts draw apart
	draw *= 0xbf58476d1ce4e5b9
	draw ^= draw >> 29
	return age >= ageMs-int64(draw%uint64(early+1))
}

// Flush flushes a stream's hot bytes now; the caller runs on the group's
// leader.
func (t *Tier) Flush(ctx context.Context, g uint32, k stream.Key) error {
	if t.store == nil {
		return errNoStore("a cold flush")
	}
	m, ok := t.groups.Machine(g).Lookup(k)
	if !ok {
		return fault.Errorf(fault.ErrStreamNotFound, "stream %s not found", k.Stream)
	}
	for {
		if _, busy := t.flushing.LoadOrStore(k, struct{}{}); !busy {
			break
		}
		// The flush loop is uploading this stream: wait for it.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	defer t.flushing.Delete(k)
	for {
		cur, ok := t.groups.Machine(g).Lookup(k)
		if !ok || cur.Incarnation != m.Incarnation || cur.ColdEnd >= cur.Tail {
			return nil
		}
		h := stream.HotStream{Key: k, Incarnation: m.Incarnation, ColdEnd: cur.ColdEnd, Tail: cur.Tail}
		if err := t.flushStream(ctx, g, h); err != nil {
			return err
		}
	}
}

// flushStream uploads the oldest part of a stream's hot window and commits
// it to the cold index.
func (t *Tier) flushStream(ctx context.Context, g uint32, h stream.HotStream) error {
	c := t
	m := t.groups.Machine(g)
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
		c.Discard(uploaded...)
		return err
	}
	chunks := make([]*storagev1.ColdRef, 0, len(pieces))
	for _, p := range pieces {
		if p.External != nil {
			chunks = append(chunks, proto.CloneOf(p.External))
			continue
		}
		body, crc := coldfmt.EncodeChunk(p.Start, p.Data, p.Records)
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
			FirstRecord: p.FirstRecord, NextRecord: p.NextRecord, Crc32C: crc,
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
				FirstRecord: run[0].GetFirstRecord(), NextRecord: run[len(run)-1].GetNextRecord(), Crc32C: digest}
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
	if _, err := c.groups.Propose(ctx, g, cmd); err != nil {
		switch fault.KindOf(err) {
		case nil, fault.ErrOutcomeUnknown, fault.ErrUnavailable, fault.ErrNotLeader:
			// It may have committed, or may yet: keep the objects (the
			// orphan sweep takes them if nothing names them).
		default:
			// Refused by apply: nothing names the objects.
			c.stats.FlushRejected.Add(1)
			c.Discard(uploaded...)
		}
		return err
	}
	c.stats.Flushes.Add(1)
	c.stats.SealedPages.Add(uint64(len(seals)))
	if c.nodeHotBytes() < c.cfg.NodeHotCapBytes {
		c.admit.wakeHead() // room for the write waiting longest
	}
	return nil
}
