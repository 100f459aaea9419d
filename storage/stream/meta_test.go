package stream

import (
	"fmt"
	"runtime"
	"testing"
	"unsafe"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// toProto returns m as a fresh message.
func (m *streamMeta) toProto() *storagev1.StreamState {
	st := &storagev1.StreamState{}
	m.fillProto(st)
	return st
}

// heldElsewhere are the StreamState fields a stream keeps outside its
// metadata.
var heldElsewhere = map[protoreflect.Name]bool{
	"data": true, "records": true, "cold_index": true, "hot_external": true, "producers": true,
}

// TestStreamMetaCarriesEveryField: every metadata field of StreamState,
// set, survives the trip through streamMeta; a field added to the message
// and not to the struct fails here rather than vanishing from snapshots.
func TestStreamMetaCarriesEveryField(t *testing.T) {
	st := &storagev1.StreamState{}
	r := st.ProtoReflect()
	fields := r.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if heldElsewhere[fd.Name()] {
			continue
		}
		switch {
		case fd.IsList():
			l := r.Mutable(fd).List()
			l.Append(l.NewElement())
		case fd.Message() != nil:
			r.Set(fd, r.NewField(fd))
		default:
			r.Set(fd, nonZero(fd, uint64(i+1)))
		}
	}
	m := metaFromProto(proto.CloneOf(st))
	got := m.toProto()
	if !proto.Equal(got, st) {
		t.Fatalf("round trip lost fields:\n got %v\nwant %v", got, st)
	}

	// Without the rare fields set, none are allocated.
	plain := &storagev1.StreamState{Bucket: "b", Stream: "s", Incarnation: 3, ContentType: "text/plain", ColdEnd: 9}
	if m := metaFromProto(plain); m.rare != nil {
		t.Fatalf("a stream with only common fields got rare fields: %+v", m.rare)
	}
}

// The metadata stays within 192 bytes, a third of the message's, and a
// stream with its metadata within the 384-byte size class: one object per
// idle stream, where the stream and its metadata used to be two of 192.
func TestStreamMetaSize(t *testing.T) {
	if n := unsafe.Sizeof(streamMeta{}); n > 192 {
		t.Fatalf("streamMeta is %d bytes, past 192", n)
	}
	if n := unsafe.Sizeof(stream{}); n > 384 {
		t.Fatalf("stream is %d bytes, past its 384-byte size class", n)
	}
}

func nonZero(fd protoreflect.FieldDescriptor, n uint64) protoreflect.Value {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(string(fd.Name()))
	case protoreflect.BytesKind:
		return protoreflect.ValueOfBytes([]byte(fd.Name()))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(n))
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(n))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(n))
	case protoreflect.EnumKind:
		return protoreflect.ValueOfEnum(protoreflect.EnumNumber(1))
	default:
		return protoreflect.ValueOfUint64(n)
	}
}

// BenchmarkHeapPerStream reports the live heap a group holds per stream
// (B/stream and objects/stream) for 100,000 streams, idle (created, never written) and
// written (created and appended to once, 256 bytes with a producer), after
// a snapshot capture, as docs/scaling.md quotes it. It measures memory,
// not time: run it with -benchtime 1x.
func BenchmarkHeapPerStream(b *testing.B) {
	const n = 100_000
	for _, written := range []bool{false, true} {
		b.Run(fmt.Sprintf("written=%t", written), func(b *testing.B) {
			for b.Loop() {
				bytes, objects := liveHeap()
				a := newApplier(b)
				fillStreams(a, n, func(i int) string { return fmt.Sprintf("s-%07d", i) }, written)
				a.m.CaptureSnapshot()
				bytesAfter, objectsAfter := liveHeap()
				b.ReportMetric(float64(bytesAfter-bytes)/n, "B/stream")
				// The collector's marking cost goes by objects as much as by
				// bytes: each is a visit to memory of its own.
				b.ReportMetric(float64(objectsAfter-objects)/n, "objects/stream")
				runtime.KeepAlive(a)
			}
		})
	}
}

// liveHeap is the heap in use after a full collection: bytes and objects.
func liveHeap() (bytes, objects int64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc), int64(ms.HeapObjects)
}
