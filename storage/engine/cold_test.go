package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/cold"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/tests/await"
)

// flakyStore fails every call while down is set, like an unreachable S3.
type flakyStore struct {
	objstore.Store
	down atomic.Bool
}

var errStoreDown = errors.New("store down")

func (f *flakyStore) Put(ctx context.Context, key string, body []byte) error {
	if f.down.Load() {
		return errStoreDown
	}
	return f.Store.Put(ctx, key, body)
}

func (f *flakyStore) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if f.down.Load() {
		return nil, errStoreDown
	}
	return f.Store.GetRange(ctx, key, off, n)
}

func (f *flakyStore) Get(ctx context.Context, key string) ([]byte, error) {
	if f.down.Load() {
		return nil, errStoreDown
	}
	return f.Store.Get(ctx, key)
}

// coldTestConfig flushes almost at once into tiny chunks, so that tests
// cross the hot/cold boundary and seal index pages with little data.
func coldTestConfig(dir string) Config {
	cfg := testConfig(dir)
	cfg.Cold = cold.DefaultConfig()
	cfg.Cold.FlushBytes = 64
	cfg.Cold.FlushAge = 20 * time.Millisecond
	cfg.Cold.GroupFlushBytes = 256
	cfg.Cold.HotCapBytes = 1 << 20
	cfg.Cold.MaxChunkBytes = 200
	cfg.Cold.ExternalMinBytes = 4 << 10
	cfg.Cold.BlockBytes = 128
	cfg.Cold.CacheBytes = 4 << 10
	cfg.Cold.FlushInterval = 5 * time.Millisecond
	cfg.Cold.GCGrace = 0
	return cfg
}

func startColdEngine(tb testing.TB, cfg Config, store objstore.Store) *testEngine {
	tb.Helper()
	te := openEngine(tb, cfg, Deps{ColdStore: store})
	te.run(tb)
	te.waitReady(tb)
	if _, err := te.CreateBucket(tb.Context(), &streamv1.CreateBucketRequest{Bucket: testBucket}); err != nil {
		tb.Fatalf("CreateBucket: %v", err)
	}
	return te
}

// readPaged reads a stream from the start with a small byte limit per
// request, checking that every read ends where the next one starts.
func readPaged(tb testing.TB, e *testEngine, name string, limit uint64) string {
	tb.Helper()
	var out bytes.Buffer
	offset := stream.OffsetStart
	for i := 0; ; i++ {
		resp, err := e.Read(tb.Context(), &streamv1.ReadRequest{Ref: ref(name), Offset: offset, MaxBytes: limit, NoTouch: true})
		if err != nil {
			tb.Fatalf("Read %s at %s: %v", name, offset, err)
		}
		out.Write(resp.GetData())
		if resp.GetUpToDate() {
			return out.String()
		}
		if len(resp.GetData()) == 0 {
			tb.Fatalf("Read %s at %s: no data and not up to date", name, offset)
		}
		offset = resp.GetNextOffset()
		if i > 100000 {
			tb.Fatal("read does not end")
		}
	}
}

func waitFlushed(tb testing.TB, e *testEngine, name string) {
	tb.Helper()
	await.True(tb, name+" flushed", func() bool {
		m, ok := e.machine(key(name)).Lookup(key(name))
		return ok && m.ColdEnd == m.Tail
	})
}

func TestColdFlushAndTieredReads(t *testing.T) {
	store := objstore.NewMemory()
	cfg := coldTestConfig(t.TempDir())
	e := startColdEngine(t, cfg, store)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("bin"), ContentType: "application/octet-stream"})
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("js"), ContentType: "application/json"})
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("txt"), ContentType: "text/plain"})
	var bin, txt strings.Builder
	for i := range 400 {
		s := fmt.Sprintf("record-%04d|%s;", i, strings.Repeat("x", i%37))
		mustAppend(t, e, "bin", "application/octet-stream", s)
		bin.WriteString(s)
		j := fmt.Sprintf(`[{"i":%d,"s":"%s"},{"k":"é✓"}]`, i, strings.Repeat("y", i%23))
		mustAppend(t, e, "js", "application/json", j)
		w := fmt.Sprintf("ünï-%d-✓;", i)
		mustAppend(t, e, "txt", "text/plain", w)
		txt.WriteString(w)
	}
	for _, n := range []string{"bin", "js", "txt"} {
		waitFlushed(t, e, n)
	}
	lv, _ := e.machine(key("bin")).ColdLevels(key("bin"), mustLookup(t, e, "bin").Incarnation)
	if len(lv) < 2 {
		t.Fatalf("cold index of bin has %d levels, want sealed pages (level 1)", len(lv))
	}
	if got := e.machine(key("bin")).HotBytes(); got != 0 {
		t.Fatalf("group holds %d hot bytes after every stream flushed", got)
	}
	check := func(e *testEngine) {
		t.Helper()
		for _, limit := range []uint64{0, 1, 7, 100, 1000} {
			if got := readPaged(t, e, "bin", limit); got != bin.String() {
				t.Fatalf("bin with limit %d: %d bytes differ from the %d appended", limit, len(got), bin.Len())
			}
			if got := readPaged(t, e, "txt", limit); got != txt.String() {
				t.Fatalf("txt with limit %d differs", limit)
			}
		}
		got := readPaged(t, e, "js", 50)
		if n := strings.Count(got, "\n"); n != 800 {
			t.Fatalf("js: %d messages, want 800", n)
		}
		if !strings.HasPrefix(got, `{"i":0,"s":""}`+"\n") {
			t.Fatalf("js starts %q", got[:40])
		}
		if got := readAll(t, e, "bin"); got != bin.String() {
			t.Fatalf("one read of bin: %d bytes, want %d", len(got), bin.Len())
		}
	}
	check(e)
	// More appends stay hot for a moment: reads cross cold into hot.
	mustAppend(t, e, "bin", "application/octet-stream", "tail!")
	bin.WriteString("tail!")
	if got := readAll(t, e, "bin"); got != bin.String() {
		t.Fatalf("read across cold and hot differs")
	}
}

func mustLookup(tb testing.TB, e *testEngine, name string) stream.Meta {
	tb.Helper()
	m, ok := e.machine(key(name)).Lookup(key(name))
	if !ok {
		tb.Fatalf("%s not found", name)
	}
	return m
}

func TestColdSurvivesRestart(t *testing.T) {
	store := objstore.NewMemory()
	cfg := coldTestConfig(t.TempDir())
	e := startColdEngine(t, cfg, store)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), ContentType: "application/octet-stream"})
	var want strings.Builder
	for i := range 300 {
		s := fmt.Sprintf("<%d>", i)
		mustAppend(t, e, "s", "application/octet-stream", s)
		want.WriteString(s)
	}
	waitFlushed(t, e, "s")
	e.stop(t)
	e2 := openEngine(t, cfg, Deps{ColdStore: store})
	e2.run(t)
	e2.waitReady(t)
	if got := readPaged(t, e2, "s", 64); got != want.String() {
		t.Fatalf("after restart: %q", got)
	}
}

func TestColdExternalPayload(t *testing.T) {
	store := objstore.NewMemory()
	e := startColdEngine(t, coldTestConfig(t.TempDir()), store)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("big"), ContentType: "application/octet-stream"})
	big := bytes.Repeat([]byte("0123456789abcdef"), 1024) // 16 KiB, above external_min_bytes
	mustAppend(t, e, "big", "application/octet-stream", "head;")
	mustAppend(t, e, "big", "application/octet-stream", string(big))
	mustAppend(t, e, "big", "application/octet-stream", ";tail")
	want := "head;" + string(big) + ";tail"
	if got := readPaged(t, e, "big", 1000); got != want {
		t.Fatalf("read with an external payload in the hot window differs (%d bytes)", len(got))
	}
	if n := e.node.Cold.Stats().ExternalPayloads.Load(); n != 1 {
		t.Fatalf("external payloads = %d, want 1", n)
	}
	waitFlushed(t, e, "big")
	if got := readAll(t, e, "big"); got != want {
		t.Fatalf("read after the flush differs")
	}
}

func TestColdOutageBackpressureAndRecovery(t *testing.T) {
	store := &flakyStore{Store: objstore.NewMemory()}
	cfg := coldTestConfig(t.TempDir())
	cfg.Cold.HotCapBytes = 8 << 10
	cfg.Cold.GroupFlushBytes = 1 << 10
	e := startColdEngine(t, cfg, store)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), ContentType: "application/octet-stream"})
	var want strings.Builder
	for i := range 50 {
		s := fmt.Sprintf("early-%d;", i)
		mustAppend(t, e, "s", "application/octet-stream", s)
		want.WriteString(s)
	}
	waitFlushed(t, e, "s")
	store.down.Store(true)
	// Nothing was read yet, so the cache holds none of the cold blocks.
	_, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("s"), Offset: off(1), NoTouch: true})
	wantCode(t, "cold read during the outage", err, fault.ErrColdStoreFailed)
	// Writes go on until the group's hot bytes reach the cap, then 503.
	var refused error
	for i := 0; i < 10000 && refused == nil; i++ {
		s := fmt.Sprintf("during-%d;", i)
		if _, refused = e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("s"), ContentType: "application/octet-stream", Body: []byte(s)}); refused == nil {
			want.WriteString(s)
		}
	}
	wantCode(t, "append above the hot cap", refused, fault.ErrOverloaded)
	store.down.Store(false)
	waitFlushed(t, e, "s")
	mustAppend(t, e, "s", "application/octet-stream", "after;")
	want.WriteString("after;")
	if got := readPaged(t, e, "s", 300); got != want.String() {
		t.Fatalf("after the outage: %d bytes, want %d", len(got), want.Len())
	}
}

func TestColdRetention(t *testing.T) {
	store := objstore.NewMemory()
	e := startColdEngine(t, coldTestConfig(t.TempDir()), store)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("r"), ContentType: "application/octet-stream"})
	var all strings.Builder
	for i := range 200 {
		s := fmt.Sprintf("[%03d]", i)
		mustAppend(t, e, "r", "application/octet-stream", s)
		all.WriteString(s)
	}
	waitFlushed(t, e, "r")
	// Retention goes no further than the visible snapshot.
	_, err := e.SetRetention(t.Context(), &streamv1.SetRetentionRequest{Ref: ref("r"), Offset: off(500)})
	wantCode(t, "retention without a snapshot", err, fault.ErrSnapshotConflict)
	if _, err := putSnap(t, e, "r", off(500), "application/x", "state at 500", ""); err != nil {
		t.Fatal(err)
	}
	resp, err := e.SetRetention(t.Context(), &streamv1.SetRetentionRequest{Ref: ref("r"), Offset: off(500)})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetRetainedOffset() != off(500) {
		t.Fatalf("retained %s", resp.GetRetainedOffset())
	}
	_, err = e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("r"), Offset: off(100), NoTouch: true})
	wantCode(t, "read below retention", err, fault.ErrOffsetTrimmed)
	if got := readPaged(t, e, "r", 64); got != all.String()[500:] {
		t.Fatalf("read from the start after retention = %q", got[:20])
	}
	// Retention never moves back.
	resp, err = e.SetRetention(t.Context(), &streamv1.SetRetentionRequest{Ref: ref("r"), Offset: off(10)})
	if err != nil || resp.GetRetainedOffset() != off(500) {
		t.Fatalf("lower retention: %v %v", resp, err)
	}
	_, err = e.SetRetention(t.Context(), &streamv1.SetRetentionRequest{Ref: ref("r"), Offset: off(5000)})
	wantCode(t, "retention past the tail", err, fault.ErrOffsetOutOfRange)
	_, err = e.SetRetention(t.Context(), &streamv1.SetRetentionRequest{Ref: ref("r"), Offset: off(505)})
	wantCode(t, "retention past the snapshot", err, fault.ErrSnapshotConflict)
	g := e.GroupOf(key("r"))
	if q, n := e.node.machines[g].GCQueue(1000); n == 0 {
		t.Fatalf("no GC entries after retention retired chunks")
	} else {
		for _, en := range q {
			if !strings.HasPrefix(en.GetKey(), coldfmt.StreamPrefix(testBucket, "r", mustLookup(t, e, "r").Incarnation)) {
				t.Fatalf("GC entry %q outside the stream's prefix", en.GetKey())
			}
		}
	}
}

// gatedStore holds every chunk and page upload until the test releases it,
// and records how many were held at once.
type gatedStore struct {
	objstore.Store
	release        chan struct{}
	held, mostHeld atomic.Int64
}

func (g *gatedStore) Put(ctx context.Context, key string, body []byte) error {
	if strings.Contains(key, "/c/") || strings.Contains(key, "/p/") {
		n := g.held.Add(1)
		for m := g.mostHeld.Load(); n > m && !g.mostHeld.CompareAndSwap(m, n); m = g.mostHeld.Load() {
		}
		defer g.held.Add(-1)
		select {
		case <-g.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g.Store.Put(ctx, key, body)
}

// TestFlushUploadsStayWithinTheirByteBudget runs the flush loop with room
// for eight uploads but hot bytes for two: it must never hold more than
// two chunk uploads at once, and must still flush every stream.
func TestFlushUploadsStayWithinTheirByteBudget(t *testing.T) {
	store := &gatedStore{Store: objstore.NewMemory(), release: make(chan struct{})}
	cfg := coldTestConfig(t.TempDir())
	cfg.Cold.FlushConcurrency = 8
	cfg.Cold.MaxChunkBytes = 200
	cfg.Cold.FlushInflightBytes = 400 // two uploads of at least 150 bytes
	e := startColdEngine(t, cfg, store)
	const streams = 12
	for i := range streams {
		name := fmt.Sprintf("s%d", i)
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref(name), ContentType: "application/octet-stream"})
		mustAppend(t, e, name, "application/octet-stream", strings.Repeat("a", 150))
		mustAppend(t, e, name, "application/octet-stream", strings.Repeat("b", 150))
	}
	flushed := func() bool {
		for i := range streams {
			name := fmt.Sprintf("s%d", i)
			m, ok := e.machine(key(name)).Lookup(key(name))
			if !ok || m.ColdEnd != m.Tail {
				return false
			}
		}
		return true
	}
	for !flushed() {
		// Let the loop start all it may before releasing one upload.
		if !await.Until(time.Second, func() bool { return store.held.Load() >= 2 || flushed() }) && store.held.Load() == 0 {
			continue
		}
		select {
		case store.release <- struct{}{}:
		case <-time.After(10 * time.Millisecond):
		}
	}
	if got := store.mostHeld.Load(); got > 2 {
		t.Fatalf("%d uploads ran at once, want at most 2 (flush_inflight_bytes 400, chunks of 150 to 200 bytes)", got)
	}
	if got := store.mostHeld.Load(); got < 2 {
		t.Fatalf("at most %d upload ran at once, want 2: the budget holds two", got)
	}
	for i := range streams {
		name := fmt.Sprintf("s%d", i)
		if got, want := readAll(t, e, name), strings.Repeat("a", 150)+strings.Repeat("b", 150); got != want {
			t.Fatalf("%s reads %q", name, got)
		}
	}
}

// TestNodeHotCapHoldsWritersUntilFlushesMakeRoom fills the node's hot cap
// while the store is down, across streams of several groups (no group
// reaches its own cap): a write then waits for room, and goes through once
// the store is back; with a short wait it is refused with 503 instead.
func TestNodeHotCapHoldsWritersUntilFlushesMakeRoom(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait time.Duration
	}{{"waits", time.Minute}, {"refuses", time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			store := &flakyStore{Store: objstore.NewMemory()}
			cfg := coldTestConfig(t.TempDir())
			cfg.Cold.NodeHotCapBytes = 4 << 10
			cfg.Cold.AdmitWait = tc.wait
			e := startColdEngine(t, cfg, store)
			store.down.Store(true)
			const streams = 16 // over 8 groups
			name := func(i int) string { return fmt.Sprintf("s%d", i%streams) }
			nodeHot := func() int64 {
				machines := map[*stream.Machine]bool{}
				var n int64
				for i := range streams {
					if m := e.machine(key(name(i))); !machines[m] {
						machines[m] = true
						n += m.HotBytes()
					}
				}
				return n
			}
			var want [streams]string
			for i := range streams {
				mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref(name(i)), ContentType: "application/octet-stream"})
			}
			// About 300 hot bytes per stream and 600 per group, far from
			// the group cap (1 MiB): the node's cap is what fills.
			body := strings.Repeat("x", 100)
			for i := 0; nodeHot() < int64(cfg.Cold.NodeHotCapBytes); i++ {
				mustAppend(t, e, name(i), "application/octet-stream", body)
				want[i%streams] += body
			}
			if got := e.cold.Stats().AdmitWaits.Load(); got != 0 {
				t.Fatalf("%d writes waited below the node's cap", got)
			}
			done := make(chan error, 1)
			go func() {
				_, err := e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref(name(0)), ContentType: "application/octet-stream", Body: []byte("late")})
				done <- err
			}()
			if tc.wait != time.Minute {
				err := <-done
				wantCode(t, "append above the node's hot cap", err, fault.ErrOverloaded)
				if fault.Detail(err, fault.DetailRetryAfterMS) == "" {
					t.Fatalf("refusal without %s: %v", fault.DetailRetryAfterMS, err)
				}
				if got := e.cold.Stats().BackpressureWrites.Load(); got == 0 {
					t.Fatal("the refused write is not counted")
				}
				return
			}
			await.True(t, "the write waits for room", func() bool { return e.cold.Stats().AdmitWaits.Load() == 1 })
			select {
			case err := <-done:
				t.Fatalf("a write above the node's cap went through while the store was down: %v", err)
			default:
			}
			store.down.Store(false)
			if err := <-done; err != nil {
				t.Fatalf("the waiting write, once the store is back: %v", err)
			}
			want[0] += "late"
			for i := range streams {
				waitFlushed(t, e, name(i))
				if got := readAll(t, e, name(i)); got != want[i] {
					t.Fatalf("%s holds %d bytes, want %d", name(i), len(got), len(want[i]))
				}
			}
		})
	}
}
