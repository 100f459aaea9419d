package cold

import (
	"context"
	"sort"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// checkGroup validates a group id.
func (t *Tier) checkGroup(g uint32) error {
	if int(g) >= t.groups.GroupCount() {
		return fault.Errorf(fault.ErrInvalidArgument, "group %d out of range [0, %d)", g, t.groups.GroupCount())
	}
	return nil
}

// GCQueue returns up to limit entries of group g's cold-GC queue and its
// length, as current as the group's leader when called. While a backup
// holds the group's cold GC (an unexpired HoldColdGC by this node's clock)
// it hands out no entry and reports held: the worker deletes nothing the
// group queued, so objects an export references stay until the backup
// copied them.
func (t *Tier) GCQueue(ctx context.Context, g uint32, limit int) (entries []*storagev1.GCEntry, total int, held bool, err error) {
	if err := t.checkGroup(g); err != nil {
		return nil, 0, false, err
	}
	if err := t.groups.ReadBarrier(ctx, g); err != nil {
		return nil, 0, false, err
	}
	m := t.groups.Machine(g)
	q, n := m.GCQueue(limit)
	if m.GCHeld(t.now().UnixMilli()) {
		return nil, n, true, nil
	}
	return q, n, false, nil
}

// GCHeld reports whether a backup holds the cold GC of any group on this
// node's replicas (by this node's clock), without a read barrier.
func (t *Tier) GCHeld() bool {
	now := t.now().UnixMilli()
	for g := range t.groups.GroupCount() {
		if t.groups.Machine(uint32(g)).GCHeld(now) {
			return true
		}
	}
	return false
}

// errGCHeld answers the orphan sweep while a backup holds the cold GC.
func errGCHeld() error {
	return fault.Errorf(fault.ErrColdGCHeld, "cold GC held by a backup: the orphan sweep waits until every hold ends").With(fault.DetailRetryAfterMS, "60000")
}

// AckGC removes reclaimed entries from group g's cold-GC queue.
func (t *Tier) AckGC(ctx context.Context, g uint32, seqs []uint64) error {
	if err := t.checkGroup(g); err != nil {
		return err
	}
	if len(seqs) == 0 {
		return nil
	}
	_, err := t.groups.Propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_GcAck{GcAck: &storagev1.GCAck{Seqs: seqs}}})
	if err == nil {
		t.stats.GCAcked.Add(uint64(len(seqs)))
	}
	return err
}

// Compaction is a run of adjacent small chunks of one stream's newest
// index level that one chunk could replace.
type Compaction struct {
	Key         stream.Key
	Incarnation uint64
	Run         []*storagev1.ColdRef
}

// CompactionCandidates lists runs of at least two adjacent chunks of
// group g, each below small bytes and together at most max bytes.
func (t *Tier) CompactionCandidates(ctx context.Context, g uint32, small, max uint64) ([]Compaction, error) {
	if err := t.checkGroup(g); err != nil {
		return nil, err
	}
	if err := t.groups.ReadBarrier(ctx, g); err != nil {
		return nil, err
	}
	var out []Compaction
	for k, s := range t.groups.Machine(g).StreamsWithColdIndex(2) {
		var run []*storagev1.ColdRef
		var size uint64
		flush := func() {
			if len(run) >= 2 {
				out = append(out, Compaction{Key: k, Incarnation: s.Incarnation, Run: run})
			}
			run, size = nil, 0
		}
		for _, r := range s.Entries {
			n := r.GetEnd() - r.GetStart()
			if r.GetKind() != storagev1.ColdKind_COLD_KIND_CHUNK || n >= small {
				flush()
				continue
			}
			if size+n > max {
				flush()
			}
			run = append(run, r)
			size += n
		}
		flush()
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Key != out[j].Key {
			return out[i].Key.Bucket+"/"+out[i].Key.Stream < out[j].Key.Bucket+"/"+out[j].Key.Stream
		}
		return out[i].Run[0].GetStart() < out[j].Run[0].GetStart()
	})
	return out, nil
}

// CommitCompaction swaps a run of chunks for the compacted chunk that
// replaces them; the replaced objects are deleted after the GC grace.
func (t *Tier) CommitCompaction(ctx context.Context, g uint32, swap *storagev1.ColdSwap) error {
	if err := t.checkGroup(g); err != nil {
		return err
	}
	if swap.GetGraceMs() == 0 {
		swap.GraceMs = t.cfg.GCGrace.Milliseconds()
	}
	if err := stream.ValidateColdSwap(swap); err != nil {
		return err
	}
	_, err := t.groups.Propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_ColdSwap{ColdSwap: swap}})
	if err == nil {
		t.stats.Compactions.Add(1)
	}
	return err
}

// LivePrefixes returns the cold prefix of every stream incarnation of
// every group on this replica, each group read after a read barrier. It
// answers COLD_GC_HELD while a backup holds the cold GC of any group: a
// restore holds the groups it imports while it copies their objects into
// the store, where nothing references them yet, so the sweep must not run.
func (t *Tier) LivePrefixes(ctx context.Context) (map[string]bool, error) {
	now := t.now().UnixMilli()
	out := map[string]bool{}
	for g := range t.groups.GroupCount() {
		if err := t.groups.ReadBarrier(ctx, uint32(g)); err != nil {
			return nil, err
		}
		m := t.groups.Machine(uint32(g))
		if m.GCHeld(now) {
			return nil, errGCHeld()
		}
		for p := range m.LivePrefixes() {
			out[p] = true
		}
	}
	return out, nil
}

// ColdReferences returns every object key the stream incarnation under
// prefix references: its index (walking sealed pages) and the external
// payloads in its hot window. live is false when no such stream exists.
// Like LivePrefixes it answers COLD_GC_HELD while a backup holds the cold
// GC of any group (checked on this node's replicas: LivePrefixes, at the
// start of a sweep, checked after read barriers).
func (t *Tier) ColdReferences(ctx context.Context, prefix string) (keys []string, live bool, err error) {
	if t.GCHeld() {
		return nil, false, errGCHeld()
	}
	for g := range t.groups.GroupCount() {
		m := t.groups.Machine(uint32(g))
		k, ok := m.LivePrefixes()[prefix]
		if !ok {
			continue
		}
		if err := t.groups.ReadBarrier(ctx, uint32(g)); err != nil {
			return nil, true, err
		}
		meta, ok := m.Lookup(k)
		if !ok {
			return nil, false, nil
		}
		levels, ok := m.ColdLevels(k, meta.Incarnation)
		if !ok {
			return nil, false, nil
		}
		keys = append(keys, m.HotExternalKeys(k, meta.Incarnation)...)
		if snap := m.SnapshotOf(k, meta.Incarnation); snap != nil {
			// Committed parts only: staged ones no commit named are
			// orphans for the sweep.
			if snap.GetKey() != "" {
				keys = append(keys, snap.GetKey())
			}
			keys = append(keys, snap.GetPartKeys()...)
		}
		var walk func(refs []*storagev1.ColdRef) error
		walk = func(refs []*storagev1.ColdRef) error {
			for _, r := range refs {
				keys = append(keys, r.GetKey())
				if r.GetKind() != storagev1.ColdKind_COLD_KIND_PAGE {
					continue
				}
				if t.store == nil {
					return errNoStore("walking a sealed index page")
				}
				entries, err := t.reader.Page(ctx, r)
				if err != nil {
					return t.readFailed(ctx, k, "walk index page "+r.GetKey(), err)
				}
				if err := walk(entries); err != nil {
					return err
				}
			}
			return nil
		}
		for _, lv := range levels {
			if err := walk(lv.GetEntries()); err != nil {
				return nil, true, err
			}
		}
		return keys, true, nil
	}
	return nil, false, nil
}

// PurgeReport is the replicated part of a bucket purge.
type PurgeReport struct {
	// Removed counts the streams this round removed.
	Removed uint64
	// GroupsWithStreams lists the groups where this round removed streams.
	GroupsWithStreams []uint32
	// GCPending counts the bucket's GC entries still queued, all groups.
	GCPending uint64
	// GCReclaimed counts the bucket's GC entries reclaimed so far.
	GCReclaimed uint64
}

// PurgeBucket erases a (valid) bucket in every group and fences it for good:
// idempotent, so an interrupted purge converges when sent again. A group
// without a reachable leader fails the call with 503 (retry it).
func (t *Tier) PurgeBucket(ctx context.Context, bucket string) (PurgeReport, error) {
	var r PurgeReport
	for g := range t.groups.GroupCount() {
		res, err := t.groups.Propose(ctx, uint32(g), &storagev1.Command{Op: &storagev1.Command_PurgeBucket{PurgeBucket: &storagev1.PurgeBucket{Bucket: bucket}}})
		if err != nil {
			return r, err
		}
		r.Removed += res.Removed
		if res.Removed > 0 {
			r.GroupsWithStreams = append(r.GroupsWithStreams, uint32(g))
		}
		r.GCPending += res.GCPending
		r.GCReclaimed += res.GCReclaimed
	}
	return r, nil
}
