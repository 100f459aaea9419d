package node

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coldgcv1 "github.com/ursula/ursula/proto/gen/go/ursula/coldgc/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/coldgc"
	"github.com/ursula/ursula/storage/cold"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/engine"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/storage/tier"
	"github.com/ursula/ursula/tests/await"
)

// startColdEngine runs a single-node engine whose cold store is store and
// which flushes within milliseconds into tiny chunks.
func startColdEngine(tb testing.TB, store objstore.Store) *engine.Node {
	tb.Helper()
	cold := cold.DefaultConfig()
	cold.FlushBytes, cold.FlushAge, cold.GroupFlushBytes = 32, 10*time.Millisecond, 64
	cold.MaxChunkBytes, cold.FlushInterval, cold.GCGrace = 64, 5*time.Millisecond, 0
	eng, err := engine.Open(engine.Config{
		DataDir: tb.TempDir(), NodeID: 1, ClusterID: testClusterID, GroupCount: 4, ShardCount: 2, Fsync: "never",
		ReadChunkBytes: 1 << 20, SnapshotEntries: 64, SnapshotBytes: 64 << 10,
		TickInterval: 100 * time.Millisecond, ExpirySweepInterval: 100 * time.Millisecond, Cold: cold,
	}, engine.Deps{ColdStore: store, Logger: testLogger(tb)})
	if err != nil {
		tb.Fatal(err)
	}
	runEngine(tb, eng)
	return eng
}

// fill creates bucket/name and appends n small records, waiting until all
// of them are cold; it returns the stream's bytes.
func fill(tb testing.TB, eng *engine.Node, bucket, name string, n int) string {
	tb.Helper()
	ctx := tb.Context()
	if _, err := eng.Engine.CreateBucket(ctx, &streamv1.CreateBucketRequest{Bucket: bucket}); err != nil {
		tb.Fatal(err)
	}
	ref := &streamv1.StreamRef{Bucket: bucket, Stream: name}
	if _, err := eng.Engine.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: ref, ContentType: "text/plain"}); err != nil {
		tb.Fatal(err)
	}
	var all strings.Builder
	for i := range n {
		s := fmt.Sprintf("%s-%d;", name, i)
		if _, err := eng.Engine.Append(ctx, &streamv1.AppendRequest{Ref: ref, ContentType: "text/plain", Body: []byte(s)}); err != nil {
			tb.Fatal(err)
		}
		all.WriteString(s)
	}
	k := stream.Key{Bucket: bucket, Stream: name}
	await.True(tb, bucket+"/"+name+" flushed", func() bool {
		m, _ := eng.Engine.Lookup(k)
		return m.ColdEnd == m.Tail
	})
	return all.String()
}

func readWhole(tb testing.TB, eng *engine.Node, bucket, name string) string {
	tb.Helper()
	var out strings.Builder
	off := "-1"
	for {
		r, err := eng.Engine.Read(tb.Context(), &streamv1.ReadRequest{Ref: &streamv1.StreamRef{Bucket: bucket, Stream: name}, Offset: off, MaxBytes: 50, NoTouch: true})
		if err != nil {
			tb.Fatal(err)
		}
		out.Write(r.GetData())
		if r.GetUpToDate() {
			return out.String()
		}
		off = r.GetNextOffset()
	}
}

func listKeys(tb testing.TB, store objstore.Store, prefix string) []string {
	tb.Helper()
	var keys []string
	if err := store.List(tb.Context(), prefix, func(in objstore.Info) error {
		keys = append(keys, in.Key)
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return keys
}

func newWorker(tb testing.TB, s *Server, store objstore.Store) *coldgc.Worker {
	tb.Helper()
	w, err := coldgc.New(coldgc.Config{Interval: time.Second, SmallChunkBytes: 1 << 10, MaxChunkBytes: 4 << 10, OrphanAge: time.Hour}, coldgcv1.NewColdGCServiceClient(s.Conn()), store, testLogger(tb))
	if err != nil {
		tb.Fatal(err)
	}
	return w
}

func TestColdGCReclaimsDeletedStreams(t *testing.T) {
	store := objstore.NewMemory()
	eng := startColdEngine(t, store)
	s := newServer(t, eng)
	w := newWorker(t, s, store)
	fill(t, eng, "gc", "gone", 50)
	want := fill(t, eng, "gc2", "kept", 50)
	inc := func(b, n string) uint64 {
		k := stream.Key{Bucket: b, Stream: n}
		m, _ := eng.Engine.Lookup(k)
		return m.Incarnation
	}
	gonePrefix := coldfmt.StreamPrefix("gc", "gone", inc("gc", "gone"))
	keptPrefix := coldfmt.StreamPrefix("gc2", "kept", inc("gc2", "kept"))
	if len(listKeys(t, store, gonePrefix)) == 0 {
		t.Fatal("no cold objects for the stream")
	}
	if _, err := eng.Engine.DeleteStream(t.Context(), &streamv1.DeleteStreamRequest{Ref: &streamv1.StreamRef{Bucket: "gc", Stream: "gone"}}); err != nil {
		t.Fatal(err)
	}
	if n, err := w.Reclaim(t.Context(), ""); err != nil || n != 1 {
		t.Fatalf("reclaim: %d entries, %v", n, err)
	}
	if keys := listKeys(t, store, gonePrefix); len(keys) != 0 {
		t.Fatalf("objects of the deleted stream remain: %v", keys)
	}
	if len(listKeys(t, store, keptPrefix)) == 0 || readWhole(t, eng, "gc2", "kept") != want {
		t.Fatal("another stream's objects were touched")
	}
	for g := range eng.Engine.GroupCount() {
		if _, n, _, _ := eng.Cold.GCQueue(t.Context(), uint32(g), 10); n != 0 {
			t.Fatalf("group %d queue holds %d entries after the pass", g, n)
		}
	}
}

func TestColdGCCompactsSmallChunks(t *testing.T) {
	store := objstore.NewMemory()
	eng := startColdEngine(t, store)
	s := newServer(t, eng)
	w := newWorker(t, s, store)
	want := fill(t, eng, "cmp", "s", 300)
	k := stream.Key{Bucket: "cmp", Stream: "s"}
	m := eng.Cluster.Machine(eng.Engine.GroupOf(k))
	meta, _ := m.Lookup(k)
	before, _ := m.ColdLevels(k, meta.Incarnation)
	if err := w.Compact(t.Context()); err != nil {
		t.Fatal(err)
	}
	after, _ := m.ColdLevels(k, meta.Incarnation)
	if len(after[0].GetEntries()) >= len(before[0].GetEntries()) {
		t.Fatalf("level 0 has %d entries after compaction, %d before", len(after[0].GetEntries()), len(before[0].GetEntries()))
	}
	if got := readWhole(t, eng, "cmp", "s"); got != want {
		t.Fatalf("after compaction the stream reads %d bytes, want %d", len(got), len(want))
	}
	objects := len(listKeys(t, store, coldfmt.StreamPrefix("cmp", "s", meta.Incarnation)))
	if n, err := w.Reclaim(t.Context(), ""); err != nil || n == 0 {
		t.Fatalf("reclaim of the replaced chunks: %d, %v", n, err)
	}
	if left := len(listKeys(t, store, coldfmt.StreamPrefix("cmp", "s", meta.Incarnation))); left >= objects {
		t.Fatalf("replaced chunks not deleted: %d objects, %d before", left, objects)
	}
	if got := readWhole(t, eng, "cmp", "s"); got != want {
		t.Fatal("after reclaiming the replaced chunks the stream differs")
	}
}

func TestColdGCSweepsOnlyOldOrphans(t *testing.T) {
	// Objects are stamped by the store's clock: everything but the young
	// object is two hours old to the worker, referenced chunks included.
	var now atomic.Int64
	now.Store(time.Now().Add(-2 * time.Hour).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	store := objstore.NewMemory(objstore.WithClock(clock))
	eng := startColdEngine(t, store)
	s := newServer(t, eng)
	if err := tier.CheckFormatEpoch(t.Context(), store); err != nil {
		t.Fatal(err)
	}
	want := fill(t, eng, "sw", "live", 80)
	k := stream.Key{Bucket: "sw", Stream: "live"}
	meta, _ := eng.Engine.Lookup(k)
	live := coldfmt.StreamPrefix("sw", "live", meta.Incarnation)
	deadOld := coldfmt.StreamPrefix("sw", "gone", 999) + "c/x"
	strayOld := live + "c/00000000000000000000-00000000000000000001-ffff"
	_ = store.Put(t.Context(), deadOld, []byte("old"))
	_ = store.Put(t.Context(), strayOld, []byte("old"))
	_ = store.Put(t.Context(), "not-ours.txt", []byte("x"))
	now.Store(time.Now().UnixNano())
	young := live + "c/young"
	_ = store.Put(t.Context(), young, []byte("young"))
	w := newWorker(t, s, store)
	n, err := w.Sweep(t.Context())
	if err != nil || n != 2 {
		t.Fatalf("sweep deleted %d, %v; want the 2 old orphans", n, err)
	}
	for _, key := range []string{deadOld, strayOld} {
		if _, err := store.Head(t.Context(), key); err == nil {
			t.Errorf("orphan %s survived", key)
		}
	}
	for _, key := range []string{young, "not-ours.txt", coldfmt.FormatEpochKey} {
		if _, err := store.Head(t.Context(), key); err != nil {
			t.Errorf("%s was deleted: %v", key, err)
		}
	}
	if got := readWhole(t, eng, "sw", "live"); got != want {
		t.Fatal("the sweep broke a live stream")
	}
}

func TestPurgeReport(t *testing.T) {
	store := objstore.NewMemory()
	eng := startColdEngine(t, store)
	s := newServer(t, eng)
	fill(t, eng, "tenant-a", "one", 40)
	if _, err := eng.Engine.CreateStream(t.Context(), &streamv1.CreateStreamRequest{Ref: &streamv1.StreamRef{Bucket: "tenant-a", Stream: "two"}, ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	want := fill(t, eng, "tenant-b", "other", 40)
	rep, err := s.purge(t.Context(), "tenant-a")
	if err != nil {
		t.Fatal(err)
	}
	if rep.RemovedStreams != 2 || !rep.ColdGcComplete || rep.ColdGcPendingEntries != 0 || rep.ColdGcError != nil || !rep.BucketPrefixAbsent {
		t.Fatalf("report %+v", rep)
	}
	if keys := listKeys(t, store, "tenant-a/"); len(keys) != 0 {
		t.Fatalf("tenant-a/ still lists %v", keys)
	}
	if got := readWhole(t, eng, "tenant-b", "other"); got != want {
		t.Fatal("tenant-b changed")
	}
	again, err := s.purge(t.Context(), "tenant-a")
	if err != nil || again.RemovedStreams != 0 || !again.BucketPrefixAbsent || !again.ColdGcComplete {
		t.Fatalf("second purge: %+v, %v", again, err)
	}
	if _, err := eng.Engine.CreateBucket(t.Context(), &streamv1.CreateBucketRequest{Bucket: "tenant-a"}); err == nil {
		t.Fatal("a purged bucket was created again")
	}
}
