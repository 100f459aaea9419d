package stream

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"sort"

	"google.golang.org/protobuf/proto"

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
	keys := make([]Key, 0, len(m.streams))
	for k := range m.streams {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Bucket != keys[j].Bucket {
			return keys[i].Bucket < keys[j].Bucket
		}
		return keys[i].Stream < keys[j].Stream
	})
	data := make([][][]byte, len(keys)) // per stream: its hot bytes, as stored
	for i, k := range keys {
		s := m.streams[k]
		st := proto.CloneOf(s.meta)
		data[i] = hotSegments(s)
		s.buf.Holes(func(_, _ uint64, tag any) {
			st.HotExternal = append(st.HotExternal, &storagev1.HotExternal{Ref: tag.(*storagev1.ColdRef)})
		})
		st.Records = append([]uint64(nil), s.records...)
		ids := make([]string, 0, len(s.producers))
		for id := range s.producers {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		for _, id := range ids {
			st.Producers = append(st.Producers, proto.CloneOf(s.producers[id]))
		}
		snap.Streams = append(snap.Streams, st)
	}
	return func() ([]byte, error) {
		for i, st := range snap.Streams {
			st.Data = join(data[i])
		}
		return proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	}, snap.AppliedIndex
}

// join concatenates stored segments; one segment needs no copy (Marshal
// only reads it).
func join(segs [][]byte) []byte {
	switch len(segs) {
	case 0:
		return nil
	case 1:
		return segs[0]
	}
	return bytes.Join(segs, nil)
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
		s := &stream{buf: hot.NewBuffer(st.GetColdEnd()), producers: make(map[string]*storagev1.ProducerState, len(st.GetProducers()))}
		if err := fillHot(s.buf, st.GetData(), st.GetHotExternal()); err != nil {
			return nil, 0, fmt.Errorf("stream %q: %w", st.GetStream(), err)
		}
		hotBytes += int64(len(st.GetData()))
		s.records = st.GetRecords()
		for _, p := range st.GetProducers() {
			s.producers[p.GetId()] = p
		}
		st.Data, st.Records, st.Producers, st.HotExternal = nil, nil, nil, nil
		s.meta = st
		s.numberLegacyRecords()
		s.rebuildMarks()
		out.streams[Key{st.GetBucket(), st.GetStream()}] = s
	}
	return out, hotBytes, nil
}

// install replaces the machine's state (the applied index aside) and
// wakes the readers of the state it replaces. Callers hold m.mu.
func (m *Machine) install(st *state, hotBytes int64) {
	old := m.streams
	m.state = *st
	m.hotSize.Store(hotBytes)
	var cold int64
	for _, s := range m.streams {
		cold += coldBytes(s.meta)
	}
	m.coldSize.Store(cold)
	for _, s := range old {
		s.signal.Notify() // wake readers of the replaced state
	}
}

// hotSegments returns the bytes of a stream's hot window, holes left
// out, as slices of the stored chunks (never modified, so they may be read
// after the machine's lock is released).
func hotSegments(s *stream) [][]byte {
	b := s.buf
	if b.Bytes() == 0 {
		return nil
	}
	var out [][]byte
	pos := b.Base()
	for pos < b.End() {
		if _, he, _, hole := b.Hole(pos); hole {
			pos = he
			continue
		}
		stop := b.NextHole(pos, b.End())
		out = append(out, b.Segments(pos, stop)...)
		pos = stop
	}
	return out
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
