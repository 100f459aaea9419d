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
	m.mu.RLock()
	defer m.mu.RUnlock()
	snap := &storagev1.Snapshot{Format: snapshotFormat, AppliedIndex: m.applied, GcNextSeq: m.gcNextSeq, History: m.history}
	for b := range m.buckets {
		snap.Buckets = append(snap.Buckets, b)
	}
	sort.Strings(snap.Buckets)
	for b := range m.fenced {
		snap.FencedBuckets = append(snap.FencedBuckets, b)
	}
	sort.Strings(snap.FencedBuckets)
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
	}
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
// machine is unchanged.
func (m *Machine) Restore(data []byte) error {
	var snap storagev1.Snapshot
	if err := proto.Unmarshal(data, &snap); err != nil {
		return fmt.Errorf("stream: decode snapshot of group %d: %w", m.group, err)
	}
	if f := snap.GetFormat(); f != snapshotFormat && f != 1 {
		return fmt.Errorf("stream: snapshot of group %d has format %d, want %d", m.group, f, snapshotFormat)
	}
	usage, created, err := restoreUsage(&snap)
	if err != nil {
		return fmt.Errorf("stream: snapshot of group %d: %w", m.group, err)
	}
	buckets := make(map[string]struct{}, len(snap.GetBuckets()))
	for _, b := range snap.GetBuckets() {
		buckets[b] = struct{}{}
	}
	streams := make(map[Key]*stream, len(snap.GetStreams()))
	var hotBytes int64
	for _, st := range snap.GetStreams() {
		// Format 1 had no cold tier: every byte from base was hot.
		st.ColdEnd = max(st.GetColdEnd(), st.GetBase())
		s := &stream{buf: hot.NewBuffer(st.GetColdEnd()), producers: make(map[string]*storagev1.ProducerState, len(st.GetProducers()))}
		if err := fillHot(s.buf, st.GetData(), st.GetHotExternal()); err != nil {
			return fmt.Errorf("stream: snapshot of group %d, stream %q: %w", m.group, st.GetStream(), err)
		}
		hotBytes += int64(len(st.GetData()))
		s.records = st.GetRecords()
		for _, p := range st.GetProducers() {
			s.producers[p.GetId()] = p
		}
		st.Data, st.Records, st.Producers, st.HotExternal = nil, nil, nil, nil
		s.meta = st
		streams[Key{st.GetBucket(), st.GetStream()}] = s
	}
	fenced := make(map[string]struct{}, len(snap.GetFencedBuckets()))
	for _, b := range snap.GetFencedBuckets() {
		fenced[b] = struct{}{}
	}
	reclaimed := snap.GetGcReclaimed()
	if reclaimed == nil {
		reclaimed = map[string]uint64{}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.streams
	m.applied = snap.GetAppliedIndex()
	m.buckets = buckets
	m.streams = streams
	m.fenced = fenced
	m.gc = snap.GetGcQueue()
	m.gcNextSeq = max(snap.GetGcNextSeq(), 1)
	m.gcReclaimed = reclaimed
	m.usage, m.bucketCreated = usage, created
	m.history = snap.GetHistory() // nil in a snapshot from before any history event
	m.hotSize.Store(hotBytes)
	for _, s := range old {
		s.signal.Notify() // wake readers of the replaced state
	}
	return nil
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
