package stream

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/hot"
)

// Snapshot encodes the whole state deterministically (see the package doc).
func (m *Machine) Snapshot() ([]byte, error) { return m.CaptureSnapshot()() }

// CaptureSnapshot captures the state as of the last applied command and
// returns the function that encodes the capture. The capture is cheap: it
// copies metadata, but not stream bytes, which the hot window never changes
// once stored (package hot); so the shard worker captures between two
// applies, and the encoding (the expensive part) runs elsewhere,
// concurrently with further applies.
func (m *Machine) CaptureSnapshot() func() ([]byte, error) {
	encode, _ := m.CaptureSnapshotAt()
	return encode
}

// CaptureSnapshotAt is CaptureSnapshot, and the applied index the capture
// holds (an export reports it beside the encoding).
func (m *Machine) CaptureSnapshotAt() (encode func() ([]byte, error), applied uint64) {
	m.mu.RLock()
	defer m.mu.RUnlock()
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
	// again after sorting the names, a seventh sorting them).
	enc := streamEncoding{keys: make([]Key, 0, len(m.streams)), metas: make([]byte, 0, 128*len(m.streams)),
		ends: make([]int, 0, len(m.streams)), segEnds: make([]int, 0, len(m.streams))}
	for k, s := range m.streams {
		if err := enc.add(k, s); err != nil {
			return func() ([]byte, error) {
				return nil, fmt.Errorf("stream: encode %q/%q: %w", k.Bucket, k.Stream, err)
			}, snap.AppliedIndex
		}
	}
	return func() ([]byte, error) {
		head, err := snapshotMarshal.Marshal(snap)
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
// StreamState encoded without its hot bytes (its metadata message as the
// machine keeps it, followed by its producers, records and hot external
// payloads, which the machine keeps outside that message), and the hot
// bytes as slices of the stored chunks, which never change. A message's
// fields may come in any order on the wire, so appending the parts the
// metadata message lacks yields a valid StreamState, decoded by Restore
// like any other.
type streamEncoding struct {
	keys  []Key // the streams, in the order they were added
	metas []byte
	ends  []int // ends[i]: where stream i's part of metas ends
	// segs are the streams' hot bytes, in one list rather than a list
	// per stream (an allocation per stream less); segEnds[i]: where
	// stream i's slices in it end.
	segs    [][]byte
	segEnds []int
}

// add encodes stream s, named k, as the next stream. The metadata message
// never holds data, records, producers or hot externals of its own (install
// and create leave them empty), so nothing is written twice.
func (e *streamEncoding) add(k Key, s *stream) error {
	var err error
	if e.metas, err = snapshotMarshal.MarshalAppend(e.metas, s.meta); err != nil {
		return err
	}
	e.metas = append(e.metas, s.cold.enc...) // its cold_index fields
	if len(s.producers) == 1 {
		// Most streams have one producer, or none: no order to settle.
		for _, p := range s.producers {
			if e.metas, err = appendMessageField(e.metas, producersField, p); err != nil {
				return err
			}
		}
	} else if len(s.producers) > 1 {
		ids := make([]string, 0, len(s.producers))
		for id := range s.producers {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			if e.metas, err = appendMessageField(e.metas, producersField, s.producers[id]); err != nil {
				return err
			}
		}
	}
	if len(s.records) > 0 {
		n := 0
		for _, r := range s.records {
			n += protowire.SizeVarint(r)
		}
		e.metas = protowire.AppendTag(e.metas, recordsField, protowire.BytesType)
		e.metas = protowire.AppendVarint(e.metas, uint64(n))
		for _, r := range s.records {
			e.metas = protowire.AppendVarint(e.metas, r)
		}
	}
	s.buf.Holes(func(_, _ uint64, tag any) {
		if err == nil {
			e.metas, err = appendMessageField(e.metas, hotExternalField, &storagev1.HotExternal{Ref: tag.(*storagev1.ColdRef)})
		}
	})
	e.keys = append(e.keys, k)
	e.ends = append(e.ends, len(e.metas))
	e.segs = appendHotSegments(e.segs, s)
	e.segEnds = append(e.segEnds, len(e.segs))
	return err
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
	order := make([]int, len(e.keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := strings.Compare(e.keys[a].Bucket, e.keys[b].Bucket); c != 0 {
			return c
		}
		return strings.Compare(e.keys[a].Stream, e.keys[b].Stream)
	})
	out := make([]byte, 0, size+24*len(e.ends))
	out = append(out, head...)
	for _, i := range order {
		meta := e.metas[partStart(e.ends, i):e.ends[i]]
		segs := e.segs[partStart(e.segEnds, i):e.segEnds[i]]
		n := 0
		for _, seg := range segs {
			n += len(seg)
		}
		body := len(meta)
		if n > 0 {
			body += protowire.SizeTag(dataField) + protowire.SizeVarint(uint64(n)) + n
		}
		out = protowire.AppendTag(out, snapshotStreamsField, protowire.BytesType)
		out = protowire.AppendVarint(out, uint64(body))
		out = append(out, meta...)
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
		if len(st.GetProducers()) > 0 {
			s.producers = make(map[string]*storagev1.ProducerState, len(st.GetProducers()))
		}
		if err := fillHot(&s.buf, st.GetData(), st.GetHotExternal()); err != nil {
			return nil, 0, fmt.Errorf("stream %q: %w", st.GetStream(), err)
		}
		hotBytes += int64(len(st.GetData()))
		s.records = st.GetRecords()
		for _, p := range st.GetProducers() {
			s.producers[p.GetId()] = p
		}
		s.meta = st
		s.setColdLevels(st.GetColdIndex())
		st.Data, st.Records, st.Producers, st.HotExternal, st.ColdIndex = nil, nil, nil, nil, nil
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
	m.addHot(hotBytes - m.hotSize.Load())
	var cold int64
	for _, s := range m.streams {
		cold += coldBytes(s.meta)
	}
	m.coldSize.Store(cold)
	for _, s := range old {
		s.signal.Notify() // wake readers of the replaced state
	}
}

// appendHotSegments appends the bytes of a stream's hot window, holes
// left out, to dst as slices of the stored chunks (never modified, so they
// may be read after the machine's lock is released).
func appendHotSegments(dst [][]byte, s *stream) [][]byte {
	b := &s.buf
	if b.Bytes() == 0 {
		return dst
	}
	pos := b.Base()
	for pos < b.End() {
		if _, he, _, hole := b.Hole(pos); hole {
			pos = he
			continue
		}
		stop := b.NextHole(pos, b.End())
		dst = b.AppendSegments(dst, pos, stop)
		pos = stop
	}
	return dst
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
