package stream

import (
	"math"
	"sync"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// snapshotCache keeps every stream's snapshot encoding (its metadata,
// producers, records and hot externals: all of it but the cold index and
// the hot bytes, which the stream holds in forms the capture can take
// without copying) from one capture to the next, so that a capture
// encodes only the streams that changed since the last one and copies the
// others' bytes. Encoding a stream costs about 3 µs, on the shard worker
// that serves every group of its shard: a group of 62,500 idle streams
// took 180 ms to capture, time in which no other group of the shard sent
// a heartbeat.
//
// What makes a stale encoding impossible to miss is where it is marked:
// the apply of a command, the only writer of a stream besides Restore
// (which replaces them all), marks the streams the command names
// (Machine.changed), whatever the command did to them; a command that can
// change streams it does not name marks them all. The package's tests
// check every cached encoding against a fresh one after every command
// they apply (snapshot_cache_test.go).
type snapshotCache struct {
	// mu serializes captures, which run under the machine's read lock
	// (the shard worker's and an export's) and write the streams' spans.
	mu sync.Mutex
	// arena is the last capture's encodings, one after another, in the
	// map's order. It is never written again once the capture is done:
	// the capture's encoder reads it on another goroutine, and the next
	// capture builds a new one.
	arena []byte
	// streams is how many streams the arena holds (to size the next).
	streams int
	// allStale is set when the spans cannot be trusted: a command that
	// changes streams it does not name, a capture that failed midway.
	allStale bool
}

// encSpan is where a stream's encoding lies in the arena; n == 0: none.
// Two offsets rather than a slice: no pointer per stream for the
// collector to follow.
type encSpan struct{ off, n uint32 }

// cached returns s's encoding as of the last capture, or nil when it
// changed since (or was never captured). Callers hold c.mu.
func (c *snapshotCache) cached(s *stream) []byte {
	if c.allStale || s.enc.n == 0 {
		return nil
	}
	return c.arena[s.enc.off : s.enc.off+s.enc.n]
}

// drop forgets every encoding: the next capture encodes every stream.
func (c *snapshotCache) drop() { c.allStale, c.arena, c.streams = true, nil, 0 }

// spanOf is the span [start, end) of an arena being built, or none when
// the arena has outgrown what a span can address.
func spanOf(start, end int) encSpan {
	if end > math.MaxUint32 {
		return encSpan{}
	}
	return encSpan{uint32(start), uint32(end - start)}
}

// keyed is a command that names one stream.
type keyed interface {
	GetBucket() string
	GetStream() string
}

// changed marks stale the encodings of the streams op may have changed.
// Every command is listed: one added later changes, until it is, every
// stream's encoding (the default case). Callers hold m.mu for writing.
func (m *Machine) changed(op any) {
	switch o := op.(type) {
	case *storagev1.Command_CreateStream:
		m.stale(o.CreateStream)
	case *storagev1.Command_Append:
		m.stale(o.Append)
	case *storagev1.Command_DeleteStream:
		m.stale(o.DeleteStream)
	case *storagev1.Command_AddForkRef:
		m.stale(o.AddForkRef)
	case *storagev1.Command_ReleaseForkRef:
		m.stale(o.ReleaseForkRef)
	case *storagev1.Command_Touch:
		m.stale(o.Touch)
	case *storagev1.Command_ColdFlush:
		m.stale(o.ColdFlush)
	case *storagev1.Command_SetRetention:
		m.stale(o.SetRetention)
	case *storagev1.Command_ColdRetire:
		m.stale(o.ColdRetire)
	case *storagev1.Command_ColdSwap:
		m.stale(o.ColdSwap)
	case *storagev1.Command_PublishSnapshot:
		m.stale(o.PublishSnapshot)
	case *storagev1.Command_SetAttrs:
		m.stale(o.SetAttrs)
	case *storagev1.Command_Expire:
		m.stale(o.Expire)
		for _, k := range o.Expire.GetMore() {
			m.stale(k)
		}
	case *storagev1.Command_CreateBucket, *storagev1.Command_DeleteBucket, *storagev1.Command_FenceBucket,
		*storagev1.Command_GcAck, *storagev1.Command_HoldColdGc, *storagev1.Command_SetFeatureLevel,
		*storagev1.Command_FeatureProbe, *storagev1.Command_Barrier:
		// They change the group's state, not its streams.
	default:
		// PurgeBucket, StartHistory and ImportGroup change many streams.
		m.cache.drop()
	}
}

// stale marks the encoding of the stream k names stale.
func (m *Machine) stale(k keyed) {
	if s := m.streams[Key{k.GetBucket(), k.GetStream()}]; s != nil {
		s.enc = encSpan{}
	}
}

// verifySnapshotCache, when set (by the package's tests), runs after
// every command the machine applies, with m.mu held for writing.
var verifySnapshotCache func(m *Machine, cmd *storagev1.Command)
