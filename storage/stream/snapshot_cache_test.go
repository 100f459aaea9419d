package stream

import (
	"bytes"
	"fmt"
	"testing"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// verifyCacheStreams bounds the machines the package's tests verify after
// every command: each check encodes every stream again.
const verifyCacheStreams = 200

// Every command any test of this package applies is followed by a check
// of every cached encoding against a fresh one, then by a capture, so
// that the next command finds every stream cached: a command that changes
// a stream without marking it fails whichever test applies it.
func init() {
	verifySnapshotCache = func(m *Machine, cmd *storagev1.Command) {
		if len(m.streams) > verifyCacheStreams {
			return
		}
		m.cache.mu.Lock()
		defer m.cache.mu.Unlock()
		if err := m.checkCache(); err != nil {
			panic(fmt.Sprintf("after %T: %v", cmd.GetOp(), err))
		}
		// Encoded, as the snapshot worker would, so that the next
		// captures reuse its buffers: a capture that wrote into buffers
		// something still reads fails the next check.
		encode, _ := m.captureLocked()
		if _, err := encode(nil); err != nil {
			panic(fmt.Sprintf("after %T: %v", cmd.GetOp(), err))
		}
	}
}

// checkCache compares every stream's cached encoding with a fresh one.
// Callers hold m.mu and m.cache.mu.
func (m *Machine) checkCache() error {
	for k, s := range m.streams {
		cached := m.cache.cached(s)
		if cached == nil {
			continue
		}
		fresh, err := appendStream(nil, s, &storagev1.StreamState{})
		if err != nil {
			return err
		}
		if !bytes.Equal(cached, fresh) {
			return fmt.Errorf("stream %s/%s changed without being marked: its cached snapshot encoding is stale", k.Bucket, k.Stream)
		}
	}
	return nil
}

// The check the package's tests rely on finds a stream changed behind the
// cache's back, and a capture after a marked change writes what changed.
func TestSnapshotCacheCheckFindsAStaleStream(t *testing.T) {
	a := newApplier(t)
	a.apply(1, &storagev1.CreateStream{Bucket: "b", Stream: "s", ContentType: "text/plain"})
	a.apply(2, &storagev1.AddForkRef{Bucket: "b", Stream: "s", Incarnation: a.m.streams[Key{"b", "s"}].meta.GetIncarnation()})
	s := a.m.streams[Key{"b", "s"}]
	if s.enc.n == 0 {
		t.Fatal("the stream has no cached encoding after a capture")
	}
	s.meta.ForkRefs++ // what a command that forgot to mark would do
	a.m.cache.mu.Lock()
	err := a.m.checkCache()
	a.m.cache.mu.Unlock()
	if err == nil {
		t.Fatal("a stream changed without being marked passed the check")
	}
	s.meta.ForkRefs--
	a.apply(3, &storagev1.AddForkRef{Bucket: "b", Stream: "s", Incarnation: s.meta.GetIncarnation()})
	if got := restored(t, a.m).streams[Key{"b", "s"}].meta.GetForkRefs(); got != 2 {
		t.Fatalf("restored fork refs %d, want 2", got)
	}
}

// restored is a new machine restored from m's snapshot.
func restored(t *testing.T, m *Machine) *Machine {
	t.Helper()
	data, err := m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	r := NewMachine(m.Group())
	if err := r.Restore(data); err != nil {
		t.Fatal(err)
	}
	return r
}

// A snapshot taken from the cache is the bytes of one taken without it,
// across commands that change one stream, some, or all of them.
func TestSnapshotCacheMatchesFreshEncoding(t *testing.T) {
	a := newApplier(t)
	a.apply(1, &storagev1.CreateBucket{Bucket: "b"})
	a.apply(1, &storagev1.CreateBucket{Bucket: "c"})
	for i := range 20 {
		bucket := []string{"b", "c"}[i%2]
		name := fmt.Sprintf("s-%02d", i)
		a.apply(2, &storagev1.CreateStream{Bucket: bucket, Stream: name, ContentType: "text/plain"})
		a.apply(3, &storagev1.Append{Bucket: bucket, Stream: name, ContentType: "text/plain", Body: []byte(name), Producer: producer("p", 0, 0)})
	}
	same := func(step string) {
		t.Helper()
		cached, err := a.m.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		a.m.mu.Lock()
		a.m.cache.allStale = true
		a.m.mu.Unlock()
		fresh, err := a.m.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(cached, fresh) {
			t.Fatalf("after %s: the snapshot from the cache differs from a fresh one", step)
		}
	}
	same("creates and appends")
	a.apply(4, &storagev1.Append{Bucket: "b", Stream: "s-00", ContentType: "text/plain", Body: []byte("more"), Producer: producer("p", 0, 1)})
	same("an append")
	inc := a.m.streams[Key{"c", "s-01"}].meta.GetIncarnation()
	a.apply(5, &storagev1.Expire{Bucket: "c", Stream: "s-01", Incarnation: inc})
	a.apply(5, &storagev1.Touch{Bucket: "b", Stream: "s-02", Incarnation: a.m.streams[Key{"b", "s-02"}].meta.GetIncarnation(), TouchedMs: 5})
	same("an expiry and a touch")
	src := a.m.streams[Key{"b", "s-04"}].meta.GetIncarnation()
	a.apply(6, &storagev1.AddForkRef{Bucket: "b", Stream: "s-04", Incarnation: src})
	a.apply(6, &storagev1.AddForkRef{Bucket: "b", Stream: "s-04", Incarnation: src})
	a.apply(6, &storagev1.ReleaseForkRef{Bucket: "b", Stream: "s-04", Incarnation: src})
	same("fork references added and one released")
	a.apply(7, &storagev1.Expire{Bucket: "b", Stream: "s-06", Incarnation: a.m.streams[Key{"b", "s-06"}].meta.GetIncarnation(),
		More: []*storagev1.StreamKey{{Bucket: "b", Stream: "s-04", Incarnation: src}}})
	if !a.m.streams[Key{"b", "s-04"}].meta.GetSoftDeleted() {
		t.Fatal("an expired fork source was not soft-deleted")
	}
	same("an expiry of two streams, one a fork source")
	a.apply(6, &storagev1.PurgeBucket{Bucket: "c"})
	same("a purge of one bucket")
	if got := len(restored(t, a.m).streams); got != 9 {
		t.Fatalf("%d streams restored, want bucket b's 10 less the expired one", got)
	}
}
