package stream

import (
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/hot"
)

// Snapshot encodes the whole state deterministically (see the package doc).
func (m *Machine) Snapshot() ([]byte, error) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	snap := &storagev1.Snapshot{Format: snapshotFormat, AppliedIndex: m.applied}
	for b := range m.buckets {
		snap.Buckets = append(snap.Buckets, b)
	}
	sort.Strings(snap.Buckets)
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
	for _, k := range keys {
		s := m.streams[k]
		st := proto.CloneOf(s.meta)
		// Marshal only reads Data, so stored bytes need no copy.
		if p, ok := s.buf.Slice(s.buf.Base(), s.buf.End()); ok {
			st.Data = p
		} else {
			st.Data = s.buf.ReadAt(make([]byte, 0, s.buf.Len()), s.buf.Base(), s.buf.End())
		}
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
	return proto.MarshalOptions{Deterministic: true}.Marshal(snap)
}

// Restore replaces the state with a snapshot's encoding. On error the
// machine is unchanged.
func (m *Machine) Restore(data []byte) error {
	var snap storagev1.Snapshot
	if err := proto.Unmarshal(data, &snap); err != nil {
		return fmt.Errorf("stream: decode snapshot of group %d: %w", m.group, err)
	}
	if f := snap.GetFormat(); f != snapshotFormat {
		return fmt.Errorf("stream: snapshot of group %d has format %d, want %d", m.group, f, snapshotFormat)
	}
	buckets := make(map[string]struct{}, len(snap.GetBuckets()))
	for _, b := range snap.GetBuckets() {
		buckets[b] = struct{}{}
	}
	streams := make(map[Key]*stream, len(snap.GetStreams()))
	var hotBytes int64
	for _, st := range snap.GetStreams() {
		s := &stream{buf: hot.NewBuffer(st.GetBase()), producers: make(map[string]*storagev1.ProducerState, len(st.GetProducers()))}
		s.buf.Append(st.GetData())
		hotBytes += int64(len(st.GetData()))
		s.records = st.GetRecords()
		for _, p := range st.GetProducers() {
			s.producers[p.GetId()] = p
		}
		st.Data, st.Records, st.Producers = nil, nil, nil
		s.meta = st
		streams[Key{st.GetBucket(), st.GetStream()}] = s
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old := m.streams
	m.applied = snap.GetAppliedIndex()
	m.buckets = buckets
	m.streams = streams
	m.hotSize.Store(hotBytes)
	for _, s := range old {
		s.signal.Notify() // wake readers of the replaced state
	}
	return nil
}
