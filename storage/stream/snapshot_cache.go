package stream

import (
	"math"
	"slices"
	"sync"
	"unsafe"

	"google.golang.org/protobuf/proto"

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
	// last is the last capture, whose arena (streamEncoding.metas) holds
	// its encodings, one after another, in the map's order. The arena is
	// never written again once the capture is done: the capture's encoder
	// reads it on another goroutine, and the next capture builds another,
	// copying from this one. The cache holds one of last's holds.
	last *streamEncoding
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
	return c.last.metas[s.enc.off : s.enc.off+s.enc.n]
}

// drop forgets every encoding: the next capture encodes every stream.
func (c *snapshotCache) drop() { c.replace(nil) }

// replace makes e (nil: none) the last capture, releasing the cache's hold
// on the one it replaces.
func (c *snapshotCache) replace(e *streamEncoding) {
	if c.last != nil {
		c.last.release()
	}
	c.last, c.allStale = e, e == nil
}

// arenaSize is what the arena of a capture of n streams is expected to
// take: what the last capture's streams took each.
func (c *snapshotCache) arenaSize(n int) int {
	if c.last == nil || c.allStale || c.last.streams == 0 {
		return 96 * n
	}
	return (len(c.last.metas)/c.last.streams + 1) * n
}

// A capture's buffers serve later captures, of any group, once nothing
// reads them: at a million streams, allocating them anew per capture was
// an eighth of a saturated node's allocations, each charged with the
// collector's marking of the whole heap. Its lists (names, spans,
// references: about 100 bytes per stream) are read by its encoder only,
// and are spare once it is done. Its arena is also the cache of the
// group's next capture, so it has two holds: the cache's, released when
// a later capture (or a drop) replaces it, and the encoder's. A capture
// whose encoder never runs (a node stopping) is never reused; the
// collector takes it.
const (
	// spareKeep bounds the arenas, and the lists, kept for reuse: about
	// one per shard worker in flight.
	spareKeep = 4
	// spareBytes bounds the size of an arena or lists kept for reuse (a
	// group of ~90,000 streams): a larger group's buffers are not worth
	// holding between captures.
	spareBytes = 16 << 20
)

var spares struct {
	mu     sync.Mutex
	arenas [][]byte
	lists  []*encodingLists
}

// takeEncoding returns an empty encoding with room for n streams and an
// arena of at least size bytes and a little more, reusing spare buffers
// where they are large enough. Its two holds on the arena are its
// caller's to hand out.
func takeEncoding(n, size int) *streamEncoding {
	e := &streamEncoding{}
	// The smallest spare arena with room for what the streams took last
	// time and a little more (an arena that overflows is grown by
	// copying): the groups of a node differ in size, and grow.
	room := size + size/32
	spares.mu.Lock()
	best := -1
	for i, a := range spares.arenas {
		if cap(a) >= room && (best < 0 || cap(a) < cap(spares.arenas[best])) {
			best = i
		}
	}
	if best >= 0 {
		e.metas = spares.arenas[best]
		spares.arenas = slices.Delete(spares.arenas, best, best+1)
	}
	if k := len(spares.lists); k > 0 {
		e.encodingLists, spares.lists[k-1], spares.lists = spares.lists[k-1], nil, spares.lists[:k-1]
	}
	spares.mu.Unlock()
	if e.encodingLists == nil {
		e.encodingLists = &encodingLists{}
	}
	if e.metas == nil {
		// A quarter more, so that the arena serves later captures of
		// groups a little larger, or grown since: groups whose streams
		// gain producers or records between captures outgrew arenas
		// allocated an eighth larger within a few captures.
		e.metas = make([]byte, 0, size+size/4)
	}
	e.metas, e.keys, e.ends = e.metas[:0], emptyWithRoom(e.keys, n), emptyWithRoom(e.ends, n)
	e.colds, e.segs, e.segEnds = emptyWithRoom(e.colds, n), emptyWithRoom(e.segs, n), emptyWithRoom(e.segEnds, n)
	e.holds.Store(2)
	return e
}

// emptyWithRoom is s emptied, or a new slice when s has no room for n.
func emptyWithRoom[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, 0, n)
	}
	return s[:0]
}

// encoded is called by e's encoder when it is done: the lists become
// spare, and the encoder's hold on the arena is released.
func (e *streamEncoding) encoded() {
	l := e.encodingLists
	e.encodingLists = nil
	e.release()
	if l.size() > spareBytes {
		return
	}
	// A spare must not keep the names, cold indexes and hot bytes of the
	// streams it encoded alive.
	clear(l.keys)
	clear(l.colds)
	clear(l.segs)
	proto.Reset(&l.scratch)
	spares.mu.Lock()
	defer spares.mu.Unlock()
	spares.lists = keepNewest(spares.lists, l)
}

// release gives up one of the holds on e's arena; the last one makes it
// spare (the oldest spare giving way), unless it is too large to keep.
func (e *streamEncoding) release() {
	if e.holds.Add(-1) != 0 || cap(e.metas) > spareBytes {
		return
	}
	spares.mu.Lock()
	defer spares.mu.Unlock()
	spares.arenas = keepNewest(spares.arenas, e.metas)
}

// keepNewest adds x to the spares list, dropping its oldest one when
// full: the newest spares have the sizes the groups have now, and a list
// of old ones too small for any would keep the new ones out.
func keepNewest[T any](list []T, x T) []T {
	if len(list) == spareKeep {
		list = slices.Delete(list, 0, 1)
	}
	return append(list, x)
}

// size is the bytes l's buffers take.
func (l *encodingLists) size() int {
	return cap(l.keys)*int(unsafe.Sizeof(Key{})) + (cap(l.ends)+cap(l.segEnds)+cap(l.order))*8 +
		(cap(l.colds)+cap(l.segs))*int(unsafe.Sizeof([]byte(nil)))
}

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
