package stream

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/hot"
)

// Snapshot encodes the whole state deterministically (see the package doc).
func (m *Machine) Snapshot() ([]byte, error) { return m.CaptureSnapshot()(nil) }

// CaptureSnapshot captures the state as of the last applied command and
// returns the function that encodes the capture. The capture is cheap: it
// copies metadata, but not stream bytes, which the hot window never changes
// once stored (package hot); so the shard worker captures between two
// applies, and the encoding (the expensive part) runs elsewhere,
// concurrently with further applies. The encoding may reuse buf's storage;
// it runs once (a second call fails), and releases the capture's buffers
// for later captures.
func (m *Machine) CaptureSnapshot() func(buf []byte) ([]byte, error) {
	encode, _ := m.CaptureSnapshotAt()
	return encode
}

// CaptureSnapshotAt is CaptureSnapshot, and the applied index the capture
// holds (an export reports it beside the encoding).
func (m *Machine) CaptureSnapshotAt() (encode func(buf []byte) ([]byte, error), applied uint64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	m.cache.mu.Lock()
	defer m.cache.mu.Unlock()
	return m.captureLocked()
}

// captureLocked is CaptureSnapshotAt; callers hold m.mu and m.cache.mu.
func (m *Machine) captureLocked() (encode func(buf []byte) ([]byte, error), applied uint64) {
	snap := &storagev1.Snapshot{Format: snapshotFormat, AppliedIndex: m.applied, GcNextSeq: m.gcNextSeq, History: m.history,
		IncarnationOffset: m.incarnationOffset, Imported: m.imported, FeatureLevel: m.featureLevel, FeatureProbes: m.featureProbes}
	if len(m.gcHolds) > 0 {
		snap.GcHolds = maps.Clone(m.gcHolds)
	}
	for b := range m.buckets {
		snap.Buckets = append(snap.Buckets, b)
	}
	sort.Strings(snap.Buckets)
	for b := range m.fenced {
		snap.FencedBuckets = append(snap.FencedBuckets, b)
	}
	sort.Strings(snap.FencedBuckets)
	if len(m.bucketGen) > 0 {
		snap.BucketGenerations = maps.Clone(m.bucketGen)
	}
	if len(m.bucketFences) > 0 {
		snap.BucketFences = maps.Clone(m.bucketFences)
	}
	// The queue is filtered in place by acknowledgements: copy the slice
	// (its entries are never modified).
	snap.GcQueue = slices.Clone(m.gc)
	m.snapshotUsage(snap)
	if len(m.gcReclaimed) > 0 {
		snap.GcReclaimed = maps.Clone(m.gcReclaimed)
	}
	// Each stream's metadata is encoded here, into one pointer-free buffer,
	// rather than cloned for the encoder: a group of many idle streams
	// used to allocate a clone of every one of them per snapshot, and the
	// collector then scanned them all (see streamEncoding). The capture
	// runs on the shard worker, which serves every group of its shard
	// meanwhile: the streams are encoded in the map's order, and the
	// encoder puts them in the snapshot's order (a group of 62,500
	// streams took 320 ms to capture: a sixth of it looking each stream up
	// again after sorting the names, a seventh sorting them). A stream
	// unchanged since the last capture is copied from it, not encoded
	// again (snapshot_cache.go); the buffer becomes the cache. Its
	// buffers are a released capture's where one is spare (takeEncoding).
	enc := takeEncoding(len(m.streams), m.cache.arenaSize(len(m.streams)))
	for k, s := range m.streams {
		start := len(enc.metas)
		if err := enc.add(k, s, m.cache.cached(s)); err != nil {
			// Streams already seen hold spans of the discarded arena.
			m.cache.drop()
			return func([]byte) ([]byte, error) {
				return nil, fmt.Errorf("stream: encode %q/%q: %w", k.Bucket, k.Stream, err)
			}, snap.AppliedIndex
		}
		s.enc = spanOf(start, len(enc.metas))
	}
	enc.streams = len(enc.keys)
	m.cache.replace(enc)
	var used atomic.Bool
	return func(buf []byte) ([]byte, error) {
		// The encoding releases the capture's buffers for reuse.
		if used.Swap(true) {
			return nil, errors.New("stream: a snapshot capture is encoded once")
		}
		defer enc.encoded()
		head, err := snapshotMarshal.MarshalAppend(buf[:0], snap)
		if err != nil {
			return nil, err
		}
		return enc.appendTo(head), nil
	}, snap.AppliedIndex
}

var snapshotMarshal = proto.MarshalOptions{Deterministic: true}

// Field numbers of the snapshot's streams and of the parts of a stream's
// state that the machine keeps outside its metadata message.
var (
	snapshotStreamsField = fieldNumber(&storagev1.Snapshot{}, "streams")
	producersField       = fieldNumber(&storagev1.StreamState{}, "producers")
	recordsField         = fieldNumber(&storagev1.StreamState{}, "records")
	hotExternalField     = fieldNumber(&storagev1.StreamState{}, "hot_external")
	dataField            = fieldNumber(&storagev1.StreamState{}, "data")
)

func fieldNumber(m proto.Message, name protoreflect.Name) protowire.Number {
	return m.ProtoReflect().Descriptor().Fields().ByName(name).Number()
}

// streamEncoding is the streams of a captured snapshot: every stream's
// StreamState encoded without its cold index and hot bytes (its metadata
// message as the machine keeps it, followed by its producers, records and
// hot external payloads, which the machine keeps outside that message),
// its cold index as the stream holds it encoded, and the hot bytes as
// slices of the stored chunks; neither of the last two is ever changed in
// place. A message's fields may come in any order on the wire, so
// appending the parts the metadata message lacks yields a valid
// StreamState, decoded by Restore like any other.
type streamEncoding struct {
	// metas is the arena: the streams' encodings, one after another. It
	// outlives the rest as the cache of the next capture.
	metas []byte
	// holds counts who still reads metas (see takeEncoding).
	holds atomic.Int32
	// streams is how many streams metas holds (to size the next arena).
	streams int
	*encodingLists
}

// encodingLists are the parts of a streamEncoding only its encoder reads.
type encodingLists struct {
	keys  []Key    // the streams, in the order they were added
	ends  []int    // ends[i]: where stream i's part of metas ends
	colds [][]byte // colds[i]: stream i's cold_index fields
	// segs are the streams' hot bytes, in one list rather than a list
	// per stream (an allocation per stream less); segEnds[i]: where
	// stream i's slices in it end.
	segs    [][]byte
	segEnds []int
	// scratch is the message each changed stream's metadata is encoded
	// from in turn.
	scratch storagev1.StreamState
	// order is the streams' order in the snapshot, built by appendTo.
	order []int
}

// add adds stream s, named k, as the next stream: cached, its encoding
// as of the last capture if it has not changed since (nil: encode it).
func (e *streamEncoding) add(k Key, s *stream, cached []byte) error {
	var err error
	if cached != nil {
		e.metas = append(e.metas, cached...)
	} else {
		e.metas, err = appendStream(e.metas, s, &e.scratch)
	}
	e.keys = append(e.keys, k)
	e.ends = append(e.ends, len(e.metas))
	e.colds = append(e.colds, s.cold.enc) // replaced, never changed, by setColdLevels
	e.segs = s.buf.AppendHeld(e.segs)     // never modified: read after the lock is released
	e.segEnds = append(e.segEnds, len(e.segs))
	return err
}

// appendStream appends the encoding of s, its cold index and hot bytes
// aside, to b, encoding its metadata from scratch. streamMeta has no
// data, records, producers, hot externals or cold index of its own, so
// nothing is written twice.
func appendStream(b []byte, s *stream, scratch *storagev1.StreamState) ([]byte, error) {
	s.meta.fillProto(scratch)
	b, err := snapshotMarshal.MarshalAppend(b, scratch)
	if err != nil {
		return b, err
	}
	err = s.producers.inOrder(func(p *storagev1.ProducerState) error {
		b, err = appendMessageField(b, producersField, p)
		return err
	})
	if err != nil {
		return b, err
	}
	if len(s.records) > 0 {
		n := 0
		for _, r := range s.records {
			n += protowire.SizeVarint(r)
		}
		b = protowire.AppendTag(b, recordsField, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(n))
		for _, r := range s.records {
			b = protowire.AppendVarint(b, r)
		}
	}
	s.buf.Holes(func(_, _ uint64, tag any) {
		if err == nil {
			b, err = appendMessageField(b, hotExternalField, &storagev1.HotExternal{Ref: tag.(*storagev1.ColdRef)})
		}
	})
	return b, err
}

// appendMessageField appends m as field num of the message being encoded.
func appendMessageField(b []byte, num protowire.Number, m proto.Message) ([]byte, error) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(snapshotMarshal.Size(m)))
	return snapshotMarshal.MarshalAppend(b, m)
}

// appendTo appends the streams, as the snapshot's streams field, to head
// (the snapshot without them), in the order of their names, bucket first.
func (e *streamEncoding) appendTo(head []byte) []byte {
	size := len(head) + len(e.metas)
	for _, seg := range e.segs {
		size += len(seg)
	}
	for _, c := range e.colds {
		size += len(c)
	}
	e.order = emptyWithRoom(e.order, len(e.keys))
	for i := range e.keys {
		e.order = append(e.order, i)
	}
	slices.SortFunc(e.order, func(a, b int) int {
		if c := strings.Compare(e.keys[a].Bucket, e.keys[b].Bucket); c != 0 {
			return c
		}
		return strings.Compare(e.keys[a].Stream, e.keys[b].Stream)
	})
	out := slices.Grow(head, size-len(head)+24*len(e.ends))
	for _, i := range e.order {
		meta := e.metas[partStart(e.ends, i):e.ends[i]]
		segs := e.segs[partStart(e.segEnds, i):e.segEnds[i]]
		n := 0
		for _, seg := range segs {
			n += len(seg)
		}
		body := len(meta) + len(e.colds[i])
		if n > 0 {
			body += protowire.SizeTag(dataField) + protowire.SizeVarint(uint64(n)) + n
		}
		out = protowire.AppendTag(out, snapshotStreamsField, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(body))
		out = append(out, meta...)
		out = append(out, e.colds[i]...)
		if n > 0 {
			out = protowire.AppendTag(out, dataField, protowire.BytesType)
			out = protowire.AppendVarint(out, uint64(n))
			for _, seg := range segs {
				out = append(out, seg...)
			}
		}
	}
	return out
}

// partStart is where part i begins, given where each part ends.
func partStart(ends []int, i int) int {
	if i == 0 {
		return 0
	}
	return ends[i-1]
}

// Restore replaces the state with a snapshot's encoding. On error the
// machine is unchanged; a snapshot of a group at a feature level this
// build does not know is a *FeatureLevelError.
func (m *Machine) Restore(data []byte) error {
	var snap storagev1.Snapshot
	if err := proto.Unmarshal(data, &snap); err != nil {
		return fmt.Errorf("stream: decode snapshot of group %d: %w", m.group, err)
	}
	if f := snap.GetFormat(); f != snapshotFormat && f != 1 {
		return fmt.Errorf("stream: snapshot of group %d has format %d, want %d", m.group, f, snapshotFormat)
	}
	if l := snap.GetFeatureLevel(); l > MaxFeatureLevel {
		return &FeatureLevelError{Group: m.group, Level: l}
	}
	st, hotBytes, err := decodeState(&snap)
	if err != nil {
		return fmt.Errorf("stream: snapshot of group %d: %w", m.group, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.applied = snap.GetAppliedIndex()
	m.install(st, hotBytes)
	return nil
}

// decodeState builds a group's state from a decoded snapshot, taking
// ownership of its messages (the stream states become the streams'
// metadata), and counts its hot bytes.
func decodeState(snap *storagev1.Snapshot) (*state, int64, error) {
	usage, created, err := restoreUsage(snap)
	if err != nil {
		return nil, 0, err
	}
	out := &state{
		buckets: make(map[string]struct{}, len(snap.GetBuckets())),
		streams: make(map[Key]*stream, len(snap.GetStreams())),
		hot:     map[*stream]struct{}{},
		fenced:  make(map[string]struct{}, len(snap.GetFencedBuckets())),
		gc:      snap.GetGcQueue(), gcNextSeq: max(snap.GetGcNextSeq(), 1), gcReclaimed: snap.GetGcReclaimed(),
		usage: usage, bucketCreated: created,
		history:           snap.GetHistory(), // nil in a snapshot from before any history event
		incarnationOffset: snap.GetIncarnationOffset(),
		imported:          snap.GetImported(),
		gcHolds:           snap.GetGcHolds(),
		featureLevel:      snap.GetFeatureLevel(),
		featureProbes:     snap.GetFeatureProbes(),
	}
	var hotBytes int64
	if out.gcReclaimed == nil {
		out.gcReclaimed = map[string]uint64{}
	}
	if out.gcHolds == nil {
		out.gcHolds = map[string]int64{}
	}
	// Both are absent in a snapshot from before bucket generations.
	out.bucketGen, out.bucketFences = snap.GetBucketGenerations(), snap.GetBucketFences()
	if out.bucketGen == nil {
		out.bucketGen = map[string]uint64{}
	}
	if out.bucketFences == nil {
		out.bucketFences = map[string]uint64{}
	}
	for _, b := range snap.GetBuckets() {
		out.buckets[b] = struct{}{}
	}
	for _, b := range snap.GetFencedBuckets() {
		out.fenced[b] = struct{}{}
	}
	for _, st := range snap.GetStreams() {
		// Format 1 had no cold tier: every byte from base was hot.
		st.ColdEnd = max(st.GetColdEnd(), st.GetBase())
		st.Bucket, st.ContentType = intern(st.GetBucket()), intern(st.GetContentType())
		s := &stream{buf: hot.MakeBuffer(st.GetColdEnd())}
		if err := fillHot(&s.buf, st.GetData(), st.GetHotExternal()); err != nil {
			return nil, 0, fmt.Errorf("stream %q: %w", st.GetStream(), err)
		}
		hotBytes += int64(len(st.GetData()))
		s.records = st.GetRecords()
		for _, p := range st.GetProducers() {
			p.Id = intern(p.GetId())
			s.producers.put(p)
		}
		s.meta = metaFromProto(st)
		s.setColdLevels(st.GetColdIndex())
		s.numberLegacyRecords()
		s.rebuildMarks()
		out.streams[Key{st.GetBucket(), st.GetStream()}] = s
		if s.buf.Len() > 0 {
			out.hot[s] = struct{}{}
		}
	}
	return out, hotBytes, nil
}

// install replaces the machine's state (the applied index aside) and
// wakes the readers of the state it replaces. Callers hold m.mu.
func (m *Machine) install(st *state, hotBytes int64) {
	old := m.streams
	m.state = *st
	m.cache.drop() // the new streams have no encodings in it
	m.addHot(hotBytes - m.hotSize.Load())
	var cold int64
	for _, s := range m.streams {
		cold += coldBytes(&s.meta)
	}
	m.coldSize.Store(cold)
	for _, s := range old {
		s.signal.Notify() // wake readers of the replaced state
	}
}

// fillHot rebuilds a hot window from its bytes and its external payloads.
func fillHot(b *hot.Buffer, data []byte, exts []*storagev1.HotExternal) error {
	for _, x := range exts {
		r := x.GetRef()
		if r.GetStart() < b.End() || r.GetEnd() <= r.GetStart() {
			return fmt.Errorf("external payload [%d, %d) out of order", r.GetStart(), r.GetEnd())
		}
		n := r.GetStart() - b.End()
		if n > uint64(len(data)) {
			return fmt.Errorf("external payload at %d lies past the hot bytes", r.GetStart())
		}
		b.Append(data[:n])
		data = data[n:]
		b.AppendHole(r.GetEnd()-r.GetStart(), r)
	}
	b.Append(data)
	return nil
}
