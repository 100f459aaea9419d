package stream

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"unicode/utf8"
	"unique"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/hot"
)

// snapshotFormat is the version of the Snapshot encoding.
const snapshotFormat = 2

// Producer state bounds: a stream keeps at most MaxProducers producers and
// forgets one idle for longer than ProducerTTLMs (as the protocol allows);
// doc.go ("Producers") gives the eviction rule.
const (
	MaxProducers  = 4096
	ProducerTTLMs = 7 * 24 * 3600 * 1000
)

// Key names a stream.
type Key struct {
	Bucket string
	Stream string
}

// stream is one stream's state: its metadata in meta (meta.go), its hot
// bytes in buf, its units in records, its cold index encoded in cold.
type stream struct {
	// buf is held by value: one object less per stream for the collector
	// to find, of a million on a node.
	buf       hot.Buffer
	cold      coldIndex
	records   []uint64
	producers producerSet
	// marks are the JSON record checkpoints of the hot window (see
	// records.go): derived from the hot bytes, not replicated.
	marks  []recordMark
	signal hot.Signal
	// readTouchMs is the last read that restarted the TTL on this replica.
	// It is not replicated (the engine proposes Touch now and then).
	readTouchMs atomic.Int64
	// enc is where the stream's encoding for a snapshot (its cold index
	// and hot bytes aside) lies in the machine's snapshot cache
	// (snapshot_cache.go); a zero length means it changed since the last
	// capture.
	enc encSpan
	// meta is held by value, as buf is, and last: the collector scans an
	// object up to its last pointer word, and meta's pointers come first,
	// so its 128 bytes of numbers after them are never scanned.
	meta streamMeta
}

// intern returns the canonical copy of a string many streams share (a
// bucket name, a content type), so that a million streams of one bucket
// do not each keep their own copy of its name.
func intern(s string) string { return unique.Make(s).Value() }

// markHot indexes s as hot when its hot window holds positions.
// Callers hold m.mu for writing.
func (m *Machine) markHot(s *stream) {
	if s.buf.Len() > 0 {
		m.hot[s] = struct{}{}
	}
}

// unmarkHot drops s from the hot index once its hot window is empty.
// Callers hold m.mu for writing.
func (m *Machine) unmarkHot(s *stream) {
	if s.buf.Len() == 0 {
		delete(m.hot, s)
	}
}

// Machine is the state machine of one group. Apply runs on the group's
// shard worker; readers use the exported query methods concurrently.
type Machine struct {
	group uint32

	mu      sync.RWMutex
	applied uint64
	hotSize atomic.Int64
	tally   *atomic.Int64 // the node's hot bytes, when shared (TallyHotIn)
	// coldSize is the sum of coldBytes over the streams: kept as the cold
	// range or the retention of a stream moves, recomputed at install.
	coldSize atomic.Int64
	// removals and removedBytes count the streams dropped since the host
	// last asked (TakeRemoved; shard worker only).
	removals     int
	removedBytes uint64
	// cache holds the streams' encodings as of the last snapshot capture
	// (snapshot_cache.go).
	cache snapshotCache
	// state is what a snapshot holds (its encoding replaces it whole:
	// Restore, an import).
	state
}

// state is a group's replicated state, besides the applied index.
type state struct {
	buckets map[string]struct{}
	streams map[Key]*stream
	// hot indexes the streams whose hot window holds positions, so that
	// the cold tier's look for streams to flush (HotStreams, ten times a
	// second) costs what is hot, not what exists: at a million idle
	// streams the full scan took half a core on an idle node. It holds
	// exactly the streams of streams with a non-empty hot window: the
	// writers that fill, empty or drop a window update it (markHot,
	// unmarkHot, drop).
	hot map[*stream]struct{}
	// fenced buckets were purged; nothing creates or writes them again.
	fenced map[string]struct{}
	// gc is the replicated cold-GC queue, in seq order.
	gc          []*storagev1.GCEntry
	gcNextSeq   uint64
	gcReclaimed map[string]uint64
	// usage holds the committed usage counters per bucket (usage.go);
	// bucketCreated when each bucket was created (group 0).
	usage         map[string]*storagev1.BucketUsage
	bucketCreated map[string]int64
	// bucketGen is each bucket record's generation (group 0; absent: 0),
	// bucketFences the deletion fences of this group (buckets.go).
	bucketGen    map[string]uint64
	bucketFences map[string]uint64
	// history is the group's latest history event (nil: none).
	history *storagev1.HistoryRecord
	// incarnationOffset is added to the log index that names a new
	// incarnation (0 until an import sets it above the source's).
	incarnationOffset uint64
	// imported is the group's import from a backup (nil: none); gcHolds
	// maps backup holds on the cold GC to when they end (backup.go).
	imported *storagev1.ImportRecord
	gcHolds  map[string]int64
	// featureLevel is the group's feature level (features.go; 0: the
	// baseline); featureProbes counts the test-only FeatureProbe commands.
	featureLevel  uint32
	featureProbes uint64
}

// NewMachine returns an empty state machine for a group.
func NewMachine(group uint32) *Machine {
	return &Machine{group: group, state: state{buckets: map[string]struct{}{}, streams: map[Key]*stream{}, hot: map[*stream]struct{}{},
		fenced: map[string]struct{}{}, gcNextSeq: 1, gcReclaimed: map[string]uint64{},
		usage: map[string]*storagev1.BucketUsage{}, bucketCreated: map[string]int64{}, gcHolds: map[string]int64{},
		bucketGen: map[string]uint64{}, bucketFences: map[string]uint64{}}}
}

// Group is the group this machine belongs to.
func (m *Machine) Group() uint32 { return m.group }

// TallyHotIn makes the machine also count its hot bytes in tally, which
// the machines of a node share, so that the node's total is one load
// (the cold tier's admission reads it at every write). Call it before the
// machine applies anything.
func (m *Machine) TallyHotIn(tally *atomic.Int64) { m.tally = tally }

// addHot changes the machine's hot bytes (and the node's tally) by d.
func (m *Machine) addHot(d int64) {
	m.hotSize.Add(d)
	if m.tally != nil {
		m.tally.Add(d)
	}
}

// SnapshotCost estimates the size of a snapshot: the hot bytes, plus a
// few hundred bytes of metadata per stream.
func (m *Machine) SnapshotCost() uint64 {
	m.mu.RLock()
	n := len(m.streams) + len(m.gc)
	m.mu.RUnlock()
	return uint64(m.hotSize.Load()) + 256*uint64(n)
}

// TakeRemoved implements multiraft.Remover: the streams dropped for good
// since the last call (deleted, expired or purged with their bucket; a
// deleted stream that forks still reference is not dropped yet) and their
// bytes. Called on the shard worker only.
func (m *Machine) TakeRemoved() (int, uint64) {
	n, b := m.removals, m.removedBytes
	m.removals, m.removedBytes = 0, 0
	return n, b
}

// HotBytes is the number of stream bytes held in memory.
func (m *Machine) HotBytes() int64 { return m.hotSize.Load() }

// Result is the outcome of applying one command.
type Result struct {
	Err       *fault.Error
	Created   bool
	Meta      Meta
	Duplicate bool
	// ProducerEpoch/ProducerSeq are the producer state after an append.
	ProducerEpoch, ProducerSeq uint64
	// RecordStart/RecordNext are an append's JSON record range (for a
	// duplicate, the range of the producer's last accepted write).
	RecordStart, RecordNext uint64
	// Frames describes each frame of an append batch.
	Frames []FrameResult
	// Release lists fork origins whose references the engine must drop in
	// the sources' groups (a removed fork, cascading).
	Release []*storagev1.ForkOrigin
	// Index is the log index the command applied at.
	Index uint64
	// Removed, GCPending and GCReclaimed answer a PurgeBucket.
	Removed, GCPending, GCReclaimed uint64
	// EventIndex answers a StartHistory or an ImportGroup: the index of
	// the event that started the group's history (for a repeat, the
	// recorded one); Streams the streams that took a new incarnation. A
	// repeated import is Duplicate.
	EventIndex uint64
	Streams    uint64
}

// ErrUnknownCommand reports a committed command this build cannot apply:
// it does not decode, or names an operation this build does not know (a
// newer node proposed it). Applying it would make this replica diverge
// from the others, so the node must stop instead (see multiraft).
var ErrUnknownCommand = errors.New("stream: command this build cannot apply")

// Apply applies one committed command and returns its *Result; a command
// the state machine rejects is a Result with Err, and changes nothing. A
// command it cannot apply at all returns ErrUnknownCommand, and one that
// raises the group to a feature level this build does not know a
// *FeatureLevelError; either changes nothing and leaves the applied index
// where it was.
func (m *Machine) Apply(index uint64, data []byte) (any, error) {
	var cmd storagev1.Command
	if err := proto.Unmarshal(data, &cmd); err != nil {
		return nil, fmt.Errorf("%w: index %d: %v", ErrUnknownCommand, index, err)
	}
	if err := m.checkFeatureLevel(index, &cmd); err != nil {
		return nil, err
	}
	r := m.apply(index, &cmd)
	if r == nil {
		return nil, fmt.Errorf("%w: index %d holds an operation this build does not know", ErrUnknownCommand, index)
	}
	r.Index = index
	return r, nil
}

func (m *Machine) apply(index uint64, cmd *storagev1.Command) *Result {
	if cmd.GetOp() == nil {
		return nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.applied = index
	r := m.applyOp(index, cmd)
	m.changed(cmd.GetOp())
	if verifySnapshotCache != nil {
		verifySnapshotCache(m, cmd)
	}
	return r
}

// applyOp applies cmd; callers hold m.mu for writing.
func (m *Machine) applyOp(index uint64, cmd *storagev1.Command) *Result {
	now := cmd.GetNowMs()
	switch op := cmd.GetOp().(type) {
	case *storagev1.Command_CreateBucket:
		return m.applyCreateBucket(index, now, op.CreateBucket)
	case *storagev1.Command_CreateStream:
		return m.applyCreate(index, now, op.CreateStream)
	case *storagev1.Command_Append:
		return m.applyAppend(now, op.Append)
	case *storagev1.Command_DeleteStream:
		c := op.DeleteStream
		return m.applyRemove(now, Key{c.GetBucket(), c.GetStream()}, c.GetIncarnation(), false)
	case *storagev1.Command_Expire:
		c := op.Expire
		r := m.applyRemove(now, Key{c.GetBucket(), c.GetStream()}, c.GetIncarnation(), true)
		for _, k := range c.GetMore() {
			r.Release = append(r.Release, m.applyRemove(now, Key{k.GetBucket(), k.GetStream()}, k.GetIncarnation(), true).Release...)
		}
		return r
	case *storagev1.Command_SetAttrs:
		return m.applySetAttrs(op.SetAttrs)
	case *storagev1.Command_DeleteBucket:
		return m.applyDeleteBucket(op.DeleteBucket)
	case *storagev1.Command_FenceBucket:
		return m.applyFenceBucket(op.FenceBucket)
	case *storagev1.Command_AddForkRef:
		return m.applyAddForkRef(op.AddForkRef)
	case *storagev1.Command_ReleaseForkRef:
		return m.applyReleaseForkRef(now, op.ReleaseForkRef)
	case *storagev1.Command_ColdFlush:
		return m.applyColdFlush(now, op.ColdFlush)
	case *storagev1.Command_SetRetention:
		return m.applySetRetention(op.SetRetention)
	case *storagev1.Command_ColdRetire:
		return m.applyColdRetire(now, op.ColdRetire)
	case *storagev1.Command_ColdSwap:
		return m.applyColdSwap(now, op.ColdSwap)
	case *storagev1.Command_GcAck:
		return m.applyGCAck(op.GcAck)
	case *storagev1.Command_PurgeBucket:
		return m.applyPurgeBucket(now, op.PurgeBucket)
	case *storagev1.Command_PublishSnapshot:
		return m.applyPublishSnapshot(now, op.PublishSnapshot)
	case *storagev1.Command_Barrier:
		return &Result{}
	case *storagev1.Command_StartHistory:
		return m.applyStartHistory(index, now, op.StartHistory)
	case *storagev1.Command_ImportGroup:
		return m.applyImportGroup(index, now, op.ImportGroup)
	case *storagev1.Command_HoldColdGc:
		return m.applyHoldColdGC(now, op.HoldColdGc)
	case *storagev1.Command_SetFeatureLevel:
		return m.applySetFeatureLevel(op.SetFeatureLevel)
	case *storagev1.Command_FeatureProbe:
		return m.applyFeatureProbe(op.FeatureProbe)
	case *storagev1.Command_Touch:
		c := op.Touch
		if s := m.streams[Key{c.GetBucket(), c.GetStream()}]; s != nil && s.meta.GetIncarnation() == c.GetIncarnation() && c.GetTouchedMs() > s.meta.GetTouchedMs() {
			s.meta.TouchedMs = c.GetTouchedMs()
		}
		return &Result{}
	default:
		return nil // an operation this build does not know
	}
}

func (m *Machine) applyCreateBucket(index uint64, now int64, c *storagev1.CreateBucket) *Result {
	if _, ok := m.fenced[c.GetBucket()]; ok {
		return &Result{Err: fault.Errorf(fault.ErrBucketNotFound, "bucket %s was purged", c.GetBucket())}
	}
	if _, ok := m.buckets[c.GetBucket()]; ok {
		return &Result{}
	}
	m.buckets[c.GetBucket()] = struct{}{}
	m.bucketCreated[c.GetBucket()] = now
	// The index is above every generation the bucket had before, so a
	// deletion fence of an earlier record never refuses this one's streams.
	m.bucketGen[c.GetBucket()] = index
	return &Result{Created: true}
}

func (m *Machine) applyCreate(index uint64, now int64, c *storagev1.CreateStream) *Result {
	key := Key{intern(c.GetBucket()), c.GetStream()}
	if _, ok := m.fenced[key.Bucket]; ok {
		return &Result{Err: fault.Errorf(fault.ErrBucketNotFound, "bucket %s was purged", key.Bucket)}
	}
	if r := m.checkBucketFence(key.Bucket, c.GetBucketGeneration()); r != nil {
		return r
	}
	var release []*storagev1.ForkOrigin
	if s := m.streams[key]; s != nil {
		if inc := c.GetReplaceIncarnation(); inc != 0 && s.meta.GetIncarnation() == inc && !s.meta.GetSoftDeleted() {
			release = m.remove(now, key, s)
		}
	}
	if s := m.streams[key]; s != nil {
		if s.meta.GetSoftDeleted() {
			return &Result{Err: fault.Errorf(fault.ErrStreamExists, "stream %s is deleted but still referenced by forks", key.Stream), Release: release}
		}
		if !sameConfig(&s.meta, c) {
			return &Result{Err: fault.Errorf(fault.ErrStreamExists, "stream %s exists with a different configuration", key.Stream), Release: release}
		}
		return &Result{Meta: s.metaView(), Release: release}
	}
	var base uint64
	if f := c.GetFork(); f != nil {
		base = f.GetPosition()
	}
	s := &stream{buf: hot.MakeBuffer(base)}
	s.meta = streamMeta{
		Bucket:      key.Bucket,
		Stream:      key.Stream,
		Incarnation: m.newIncarnation(index),
		ContentType: intern(c.GetContentType()),
		Json:        c.GetJson(),
		HasTtl:      c.GetHasTtl(),
		TtlSeconds:  c.GetTtlSeconds(),
		ExpiresAtMs: c.GetExpiresAtMs(),
		CreatedMs:   now,
		TouchedMs:   now,
		LastWriteMs: now,
		Closed:      c.GetClosed(),
		Base:        base,
		ColdEnd:     base,
		BaseRecord:  c.GetBaseRecord(),
		HotRecord:   c.GetBaseRecord(),
		RecordNext:  c.GetBaseRecord(),
	}
	st := &s.meta
	if c.GetExpiresAt() != "" || c.GetFork() != nil {
		st.rare = &metaRare{ExpiresAt: c.GetExpiresAt(), Fork: c.GetFork()}
	}
	s.appendStored(now, c.GetBody(), nil, c.GetBodyRecords(), m)
	n := uint64(len(c.GetBody()))
	m.countWrite(key.Bucket, n, writeRecords(n, c.GetBodyRecords()))
	m.streams[key] = s
	m.markHot(s)
	return &Result{Created: true, Meta: s.metaView(), Release: release}
}

// sameConfig decides whether a create of an existing stream is an
// idempotent repeat (200) or a conflict (409).
func sameConfig(st *streamMeta, c *storagev1.CreateStream) bool {
	if !SameContentType(st.GetContentType(), c.GetContentType()) {
		return false
	}
	if st.GetHasTtl() != c.GetHasTtl() || st.GetTtlSeconds() != c.GetTtlSeconds() || st.GetExpiresAt() != c.GetExpiresAt() {
		return false
	}
	if st.GetClosed() != c.GetClosed() {
		return false
	}
	a, b := st.GetFork(), c.GetFork()
	if (a == nil) != (b == nil) {
		return false
	}
	if a != nil {
		if a.GetSourceBucket() != b.GetSourceBucket() || a.GetSourceStream() != b.GetSourceStream() || a.GetSubOffset() != b.GetSubOffset() {
			return false
		}
		if b.GetOffsetRaw() != "" && a.GetOffsetRaw() != b.GetOffsetRaw() && a.GetPosition() != b.GetPosition() {
			return false
		}
	}
	return true
}

func (m *Machine) applyAppend(now int64, c *storagev1.Append) *Result {
	key := Key{c.GetBucket(), c.GetStream()}
	s := m.streams[key]
	if s == nil {
		return &Result{Err: fault.Errorf(fault.ErrStreamNotFound, "stream %s not found", key.Stream)}
	}
	st := &s.meta
	if st.GetSoftDeleted() {
		return &Result{Err: fault.Errorf(fault.ErrStreamGone, "stream %s is deleted", key.Stream)}
	}
	if inc := c.GetIncarnation(); inc != 0 && inc != st.GetIncarnation() {
		return &Result{Err: fault.Errorf(fault.ErrIncarnationMismatch, "stream %s was recreated", key.Stream).
			With(fault.DetailIncarnation, strconv.FormatUint(st.GetIncarnation(), 10))}
	}
	p := c.GetProducer()
	body, rel := c.GetBody(), c.GetRecords()
	if fr := c.GetFrames(); len(fr) > 0 {
		body, rel = batchBody(fr)
	}
	ext := c.GetExternal()
	size := uint64(len(body)) + externalBytes(ext)
	if st.GetClosed() {
		if p != nil {
			if cb := st.GetClosedBy(); cb != nil && cb.GetId() == p.GetId() && cb.GetEpoch() == p.GetEpoch() && cb.GetSeq() == p.GetSeq() {
				r := &Result{Meta: s.metaView(), Duplicate: true, ProducerEpoch: p.GetEpoch(), ProducerSeq: p.GetSeq()}
				r.RecordStart, r.RecordNext = st.GetRecordNext(), st.GetRecordNext()
				if cur := s.producers.get(p.GetId()); cur != nil && cur.GetSeq() == p.GetSeq() {
					r.RecordStart, r.RecordNext = cur.GetRecordStart(), cur.GetRecordNext()
				}
				return r
			}
		} else if size == 0 && c.GetClose() {
			return &Result{Meta: s.metaView()} // closing a closed stream is idempotent
		}
		return &Result{Err: closedErr(s)}
	}
	if size > 0 && !SameContentType(st.GetContentType(), c.GetContentType()) {
		return &Result{Err: fault.Errorf(fault.ErrContentTypeMismatch, "content type %q does not match the stream's %q", c.GetContentType(), st.GetContentType())}
	}
	var ps *storagev1.ProducerState
	if p != nil {
		cur := s.producers.get(p.GetId())
		if cur != nil && now-cur.GetUpdatedMs() > ProducerTTLMs {
			s.producers.remove(p.GetId())
			cur = nil
		}
		switch {
		case cur == nil:
			if p.GetSeq() != 0 {
				return &Result{Err: seqGap(0, p.GetSeq())}
			}
		case p.GetEpoch() < cur.GetEpoch():
			return &Result{Err: fault.Errorf(fault.ErrProducerStaleEpoch, "producer epoch %d is older than %d", p.GetEpoch(), cur.GetEpoch()).
				With(fault.DetailProducerEpoch, strconv.FormatUint(cur.GetEpoch(), 10))}
		case p.GetEpoch() > cur.GetEpoch():
			if p.GetSeq() != 0 {
				return &Result{Err: fault.Errorf(fault.ErrProducerEpochSeq, "a new producer epoch must start at seq 0, got %d", p.GetSeq())}
			}
		case p.GetSeq() <= cur.GetSeq():
			return &Result{Meta: s.metaView(), Duplicate: true, ProducerEpoch: cur.GetEpoch(), ProducerSeq: cur.GetSeq(),
				RecordStart: cur.GetRecordStart(), RecordNext: cur.GetRecordNext()}
		case cur.GetEpochClosed():
			return &Result{Err: closedEpoch(cur)}
		case p.GetSeq() != cur.GetSeq()+1:
			return &Result{Err: seqGap(cur.GetSeq()+1, p.GetSeq())}
		}
		// The id is shared: a writer's producer id names its state in
		// every stream it writes, a million of them on a node, and each
		// append decodes the id anew.
		var id string
		if cur != nil {
			id = cur.GetId()
		} else {
			id = intern(p.GetId())
		}
		ps = &storagev1.ProducerState{Id: id, Epoch: p.GetEpoch(), Seq: p.GetSeq(), UpdatedMs: now}
	}
	if c.RecordMatch != nil && c.GetRecordMatch() != st.GetRecordNext() {
		return &Result{Err: recordMismatch(s, c.GetRecordMatch())}
	}
	if seq := c.GetStreamSeq(); seq != "" {
		if last := st.GetLastStreamSeq(); last != "" && seq <= last {
			return &Result{Err: fault.Errorf(fault.ErrStreamSeqConflict, "Stream-Seq %q is not greater than %q", seq, last)}
		}
		st.r().LastStreamSeq = seq
	}
	start, recStart := s.buf.End(), st.GetRecordNext()
	wasEmpty := s.buf.Len() == 0
	s.appendStored(now, body, ext, rel, m)
	if wasEmpty {
		m.markHot(s) // a stream already hot is in the index: no map write per append
	}
	if ps != nil {
		ps.RecordStart, ps.RecordNext = recStart, st.GetRecordNext()
		s.putProducer(ps)
	}
	if c.GetClose() {
		st.Closed = true
		if p != nil {
			st.ClosedBy = &storagev1.ProducerRef{Id: p.GetId(), Epoch: p.GetEpoch(), Seq: p.GetSeq()}
		}
	}
	st.TouchedMs = max(st.GetTouchedMs(), now)
	st.LastWriteMs = now
	m.countWrite(key.Bucket, size, writeRecords(size, c.GetRecords()))
	s.signal.Notify()
	r := &Result{Meta: s.metaView(), RecordStart: recStart, RecordNext: st.GetRecordNext()}
	if fr := c.GetFrames(); len(fr) > 0 {
		r.Frames = s.frameResults(fr, start, recStart)
	}
	if p != nil {
		r.ProducerEpoch, r.ProducerSeq = p.GetEpoch(), p.GetSeq()
	}
	return r
}

// externalBytes is the stream bytes an Append's external payload stands
// for: [start, end) of its locator, relative (start 0) in the command.
func externalBytes(ext *storagev1.ColdRef) uint64 {
	if ext.GetEnd() < ext.GetStart() {
		return 0
	}
	return ext.GetEnd() - ext.GetStart()
}

func closedErr(s *stream) *fault.Error {
	return fault.Errorf(fault.ErrStreamClosed, "stream %s is closed", s.meta.GetStream()).
		With(fault.DetailNextOffset, FormatOffset(s.buf.End())).
		With(fault.DetailClosed, "true")
}

func seqGap(expected, received uint64) *fault.Error {
	return fault.Errorf(fault.ErrProducerSeqGap, "producer sequence gap: expected %d, received %d", expected, received).
		With(fault.DetailExpectedSeq, strconv.FormatUint(expected, 10)).
		With(fault.DetailReceivedSeq, strconv.FormatUint(received, 10))
}

// putProducer stores a producer's state, evicting the least recently
// updated producer (ties by id) when the bound is reached.
func (s *stream) putProducer(ps *storagev1.ProducerState) {
	if s.producers.get(ps.GetId()) == nil && s.producers.len() >= MaxProducers {
		var victim *storagev1.ProducerState
		s.producers.each(func(p *storagev1.ProducerState) {
			if victim == nil || p.GetUpdatedMs() < victim.GetUpdatedMs() ||
				(p.GetUpdatedMs() == victim.GetUpdatedMs() && p.GetId() < victim.GetId()) {
				victim = p
			}
		})
		s.producers.remove(victim.GetId())
	}
	s.producers.put(ps)
}

// appendStored adds stored-form bytes (or an external payload holding
// them) and their record ends (relative to body) to the stream. A body
// with no records counts as one record.
func (s *stream) appendStored(now int64, body []byte, ext *storagev1.ColdRef, rel []uint64, m *Machine) {
	n := uint64(len(body))
	if ext != nil {
		n = externalBytes(ext)
	}
	if n == 0 {
		return
	}
	start := s.buf.End()
	if s.buf.Len() == 0 {
		s.meta.HotSinceMs = now
	}
	if ext != nil {
		ref := proto.CloneOf(ext)
		ref.Start, ref.End, ref.Kind = start, start+n, storagev1.ColdKind_COLD_KIND_EXTERNAL
		s.addRecords(nil, ref)
		s.buf.AppendHole(n, ref)
		s.markRecords(start, nil)
	} else {
		s.addRecords(body, nil)
		s.buf.Append(body)
		m.addHot(int64(n))
		s.markRecords(start, body)
	}
	if len(rel) == 0 {
		s.records = append(s.records, start+n)
		return
	}
	for _, r := range rel {
		s.records = append(s.records, start+r)
	}
}

// applyRemove deletes (or, for expiry, expires) a stream. With forks still
// referencing it, the stream is only soft-deleted.
func (m *Machine) applyRemove(now int64, key Key, inc uint64, expiry bool) *Result {
	s := m.streams[key]
	if s == nil || (inc != 0 && s.meta.GetIncarnation() != inc) {
		if expiry {
			return &Result{}
		}
		return &Result{Err: fault.Errorf(fault.ErrStreamNotFound, "stream %s not found", key.Stream)}
	}
	if s.meta.GetSoftDeleted() {
		if expiry {
			return &Result{}
		}
		return &Result{Err: fault.Errorf(fault.ErrStreamGone, "stream %s is already deleted", key.Stream)}
	}
	return &Result{Release: m.remove(now, key, s)}
}

// remove drops a stream, or soft-deletes it when forks reference it, and
// returns the fork origin to release (if it was removed and is a fork).
func (m *Machine) remove(now int64, key Key, s *stream) []*storagev1.ForkOrigin {
	defer s.signal.Notify()
	if s.meta.GetForkRefs() > 0 {
		s.meta.SoftDeleted = true
		return nil
	}
	return m.drop(now, key, s)
}

// drop removes a stream for good and queues its cold objects for GC.
func (m *Machine) drop(now int64, key Key, s *stream) []*storagev1.ForkOrigin {
	delete(m.streams, key)
	delete(m.hot, s)
	m.removals++
	m.removedBytes += s.buf.End() - s.meta.GetBase()
	m.addHot(-int64(s.buf.Bytes()))
	m.coldSize.Add(-coldBytes(&s.meta))
	// Objects of the stream's earlier incarnations (before a new history)
	// live under their own prefixes.
	for _, e := range s.meta.GetEarlier() {
		m.enqueueGC(key.Bucket, storagev1.GCKind_GC_KIND_PREFIX, coldfmt.StreamPrefix(key.Bucket, key.Stream, e.GetIncarnation()), now)
	}
	m.enqueueGC(key.Bucket, storagev1.GCKind_GC_KIND_PREFIX, coldfmt.StreamPrefix(key.Bucket, key.Stream, s.meta.GetIncarnation()), now)
	if f := s.meta.GetFork(); f != nil {
		return []*storagev1.ForkOrigin{f}
	}
	return nil
}

func (m *Machine) applyAddForkRef(c *storagev1.AddForkRef) *Result {
	key := Key{c.GetBucket(), c.GetStream()}
	s := m.streams[key]
	if s == nil || s.meta.GetIncarnation() != c.GetIncarnation() {
		return &Result{Err: fault.Errorf(fault.ErrStreamNotFound, "fork source %s not found", key.Stream)}
	}
	if s.meta.GetSoftDeleted() {
		return &Result{Err: fault.Errorf(fault.ErrForkSourceGone, "fork source %s is deleted", key.Stream)}
	}
	if c.GetPosition() > s.buf.End() {
		return &Result{Err: fault.Errorf(fault.ErrOffsetOutOfRange, "fork offset is beyond the source's tail")}
	}
	s.meta.ForkRefs++
	return &Result{Meta: s.metaView()}
}

func (m *Machine) applyReleaseForkRef(now int64, c *storagev1.ReleaseForkRef) *Result {
	key := Key{c.GetBucket(), c.GetStream()}
	s := m.streams[key]
	// A fork names the incarnation it was made from, which a new history
	// may have replaced since.
	if s == nil || !s.namesIncarnation(c.GetIncarnation()) || s.meta.GetForkRefs() == 0 {
		return &Result{}
	}
	s.meta.ForkRefs--
	if s.meta.GetForkRefs() == 0 && s.meta.GetSoftDeleted() {
		return &Result{Release: m.remove(now, key, s)}
	}
	return &Result{}
}

// Meta is a copy of a stream's metadata, safe to use after the lock is
// released.
type Meta struct {
	Key         Key
	Incarnation uint64
	ContentType string
	JSON        bool
	HasTTL      bool
	TTLSeconds  uint64
	ExpiresAt   string
	ExpiresAtMs int64
	// TouchedMs is the later of the replicated touch and this replica's
	// last read touch.
	TouchedMs     int64
	ReplTouchedMs int64
	Closed        bool
	SoftDeleted   bool
	// Base is where the stream's own bytes start (a fork's divergence
	// point); below it reads go to the fork's source.
	Base uint64
	// ColdEnd: own bytes [Base, ColdEnd) are in the cold index.
	ColdEnd uint64
	// Retained: reads below it answer 410.
	Retained uint64
	Tail     uint64
	Fork     *storagev1.ForkOrigin
	ForkRefs uint64
	// RecordFirst/RecordNext: the retained JSON record range; BaseRecord
	// the ordinal at Base (records below it are the fork source's).
	RecordFirst, RecordNext, BaseRecord uint64
	// PreviousIncarnation and InheritedOffset (a position) describe the
	// latest new history of the stream's group (0: none): the token before
	// it and the tail it kept.
	PreviousIncarnation, InheritedOffset uint64
	// Earlier lists earlier incarnations objects or forks may still name
	// (shared with the state: read only).
	Earlier []*storagev1.EarlierIncarnation

	// self is the stream this describes on this replica (SameStream).
	self *stream
}

// SameStream reports whether m and o describe the same stream of this
// replica, whatever their incarnations: a new history keeps the stream
// (and its bytes) under a new incarnation, where a delete and create make
// another stream. Metadata from another node never matches.
func (m Meta) SameStream(o Meta) bool { return m.self != nil && m.self == o.self }

// ExpiryMs is when the stream expires, in ms since the Unix epoch: the
// earlier of its last touch plus its TTL and its Expires-At;
// math.MaxInt64 when it has neither. The sum saturates instead of
// wrapping, so a TTL that passed no validation (a command of another
// build, a restored snapshot) means "not for a long time", never "expired
// already".
func (m Meta) ExpiryMs() int64 {
	exp := int64(math.MaxInt64)
	if m.HasTTL {
		exp = AddMs(m.TouchedMs, TTLMs(m.TTLSeconds))
	}
	if m.ExpiresAtMs > 0 {
		exp = min(exp, m.ExpiresAtMs)
	}
	return exp
}

// ExpiredAt reports whether the stream's TTL or expiry has passed at nowMs.
func (m Meta) ExpiredAt(nowMs int64) bool { return nowMs >= m.ExpiryMs() }

func (s *stream) metaView() Meta {
	st := &s.meta
	return Meta{
		Key:           Key{st.GetBucket(), st.GetStream()},
		Incarnation:   st.GetIncarnation(),
		ContentType:   st.GetContentType(),
		JSON:          st.GetJson(),
		HasTTL:        st.GetHasTtl(),
		TTLSeconds:    st.GetTtlSeconds(),
		ExpiresAt:     st.GetExpiresAt(),
		ExpiresAtMs:   st.GetExpiresAtMs(),
		TouchedMs:     max(st.GetTouchedMs(), s.readTouchMs.Load()),
		ReplTouchedMs: st.GetTouchedMs(),
		Closed:        st.GetClosed(),
		SoftDeleted:   st.GetSoftDeleted(),
		Base:          st.GetBase(),
		ColdEnd:       st.GetColdEnd(),
		Retained:      st.GetRetained(),
		Tail:          s.buf.End(),
		Fork:          st.GetFork(),
		ForkRefs:      st.GetForkRefs(),
		RecordFirst:   st.GetRecordFirst(),
		RecordNext:    st.GetRecordNext(),
		BaseRecord:    st.GetBaseRecord(),

		PreviousIncarnation: st.GetPreviousIncarnation(),
		InheritedOffset:     st.GetInheritedOffset(),
		Earlier:             st.GetEarlier(),

		self: s,
	}
}

// Lookup returns a stream's metadata.
func (m *Machine) Lookup(key Key) (Meta, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil {
		return Meta{}, false
	}
	return s.metaView(), true
}

// HasBucket reports whether a bucket was created in this group.
func (m *Machine) HasBucket(name string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	_, ok := m.buckets[name]
	return ok
}

// Applied is the index of the last applied command.
func (m *Machine) Applied() uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.applied
}

// Touch records a read at nowMs on this replica (restarting a sliding TTL).
func (m *Machine) Touch(key Key, inc uint64, nowMs int64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if s := m.streams[key]; s != nil && s.meta.GetIncarnation() == inc {
		for {
			cur := s.readTouchMs.Load()
			if nowMs <= cur || s.readTouchMs.CompareAndSwap(cur, nowMs) {
				return
			}
		}
	}
}

// Changed returns a channel closed at the stream's next change (append,
// close, delete), together with its current metadata. ok is false when the
// stream (of that incarnation) does not exist.
func (m *Machine) Changed(key Key, inc uint64) (<-chan struct{}, Meta, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil || s.meta.GetIncarnation() != inc {
		return nil, Meta{}, false
	}
	return s.signal.C(), s.metaView(), true
}

// ReadOwn reads the stream's own stored bytes from position from, up to
// limit bytes but not past to, cut on a unit boundary where one exists
// (JSON: a message; text: a rune; any stream: an append). It returns the
// bytes and the position they end at. ok is false when the stream (of that
// incarnation) is gone. When from lies in the cold range or in an external
// payload, it returns no bytes but the cold reference covering from (a
// chunk, an external payload or an index page to descend), and the caller
// reads it from the object store; a read of hot bytes stops before the
// next external payload.
//
// With an empty dst the bytes are usually not copied: the result is then a
// slice of the stored bytes, which are immutable, and must not be
// modified. A read that would cross the end of a storage chunk stops there
// when that still returns at least half of what it would (the chunk end is
// an append boundary); otherwise it is copied.
func (m *Machine) ReadOwn(key Key, inc uint64, from, to, limit uint64, dst []byte) ([]byte, uint64, *storagev1.ColdRef, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil || s.meta.GetIncarnation() != inc {
		return dst, from, nil, false
	}
	to = min(to, s.buf.End())
	if from >= to {
		return dst, from, nil, true
	}
	if from < s.buf.Base() {
		return dst, from, s.coldRef(from), true
	}
	if _, _, tag, ok := s.buf.Hole(from); ok {
		return dst, from, tag.(*storagev1.ColdRef), true
	}
	to = s.buf.NextHole(from, to)
	end := to
	if limit > 0 && to-from > limit {
		end = s.cutPoint(from, from+limit, to)
	}
	if len(dst) == 0 {
		if ce := s.buf.ChunkEnd(from); end > ce && ce-from >= (end-from)/2 {
			end = ce
		}
		if p, ok := s.buf.Slice(from, end); ok {
			return p, end, nil, true
		}
	}
	return s.buf.ReadAt(dst, from, end), end, nil, true
}

// cutPoint picks where a read limited to [from, want) ends, given that
// the bytes it may look at end at stop.
func (s *stream) cutPoint(from, want, stop uint64) uint64 {
	// The last append boundary within the limit.
	i := sort.Search(len(s.records), func(i int) bool { return s.records[i] > want })
	if i > 0 && s.records[i-1] > from {
		return s.records[i-1]
	}
	if s.meta.GetJson() {
		// One append larger than the limit: cut after a whole message.
		for p := want; p > from; p-- {
			if s.buf.ByteAt(p-1) == '\n' {
				return p
			}
		}
		for p := want; p < stop; p++ {
			if s.buf.ByteAt(p) == '\n' {
				return p + 1
			}
		}
		return stop
	}
	if isText(s.meta.GetContentType()) && want < stop {
		for p := want; p > from && want-p < utf8.UTFMax; p-- {
			if utf8.RuneStart(s.buf.ByteAt(p)) {
				return p
			}
		}
		// A limit inside the first rune: return that rune whole.
		p := from + 1
		for p < stop && p-from < utf8.UTFMax && !utf8.RuneStart(s.buf.ByteAt(p)) {
			p++
		}
		return p
	}
	return want
}

// IsText reports a text/* content type (reads never split a rune).
func IsText(ct string) bool { return isText(ct) }

func isText(ct string) bool {
	mt := MediaType(ct)
	return len(mt) >= 5 && mt[:5] == "text/"
}

// UnitEnd resolves a fork sub-offset within the stream's own range: the
// position after n units of the append that starts at pos (bytes for
// ordinary streams, messages for JSON), where that append is taken to end
// no later than clip. ok is false when no append starts at pos in the own
// range or n exceeds its size.
func (m *Machine) UnitEnd(key Key, inc uint64, pos, n, clip uint64) (uint64, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	s := m.streams[key]
	if s == nil || s.meta.GetIncarnation() != inc || pos < s.buf.Base() || pos >= s.buf.End() {
		return 0, false
	}
	if _, _, _, hole := s.buf.Hole(pos); hole {
		return 0, false
	}
	i := sort.Search(len(s.records), func(i int) bool { return s.records[i] > pos })
	if i == len(s.records) {
		return 0, false
	}
	end := min(s.records[i], clip, s.buf.NextHole(pos, s.buf.End()))
	if !s.meta.GetJson() {
		if pos+n > end {
			return 0, false
		}
		return pos + n, true
	}
	p := pos
	for k := uint64(0); k < n; k++ {
		if p >= end {
			return 0, false
		}
		seg, ok := s.buf.Slice(p, end)
		if !ok {
			seg = s.buf.ReadAt(nil, p, end)
		}
		j := bytes.IndexByte(seg, '\n')
		if j < 0 {
			return 0, false
		}
		p += uint64(j) + 1
	}
	return p, true
}

// Expired lists up to limit streams expired at nowMs (not yet soft-deleted).
func (m *Machine) Expired(nowMs int64, limit int) []Meta {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []Meta
	for _, s := range m.streams {
		if s.meta.GetSoftDeleted() || (!s.meta.GetHasTtl() && s.meta.GetExpiresAtMs() == 0) {
			continue
		}
		if mv := s.metaView(); mv.ExpiredAt(nowMs) {
			out = append(out, mv)
			if len(out) >= limit {
				break
			}
		}
	}
	return out
}

// Stats are counters for metrics.
type Stats struct {
	Streams  int
	Buckets  int
	HotBytes int64
	// ColdBytes is the streams' own bytes in the cold tier above their
	// retention (coldBytes, summed).
	ColdBytes int64
	Applied   uint64
}

// coldBytes is a stream's own bytes that the cold index covers and that
// are still readable: [max(Base, Retained), ColdEnd).
func coldBytes(st *streamMeta) int64 {
	from := max(st.GetBase(), st.GetRetained())
	if st.GetColdEnd() <= from {
		return 0
	}
	return int64(st.GetColdEnd() - from)
}

// Stats returns current counters.
func (m *Machine) Stats() Stats {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return Stats{Streams: len(m.streams), Buckets: len(m.buckets), HotBytes: m.hotSize.Load(), ColdBytes: m.coldSize.Load(), Applied: m.applied}
}
