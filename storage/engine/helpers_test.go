package engine

import (
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/stream"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testBucket is created by startEngine on every single-node engine.
const testBucket = "b"

// testConfig is the flags' defaults scaled down for tests: few groups, two
// shards, small snapshot thresholds (so restarts replay a snapshot and a
// WAL tail) and a fast expiry sweep.
func testConfig(dir string) Config {
	return Config{
		DataDir:             dir,
		NodeID:              1,
		GroupCount:          8,
		ShardCount:          2,
		Fsync:               "never",
		ReadChunkBytes:      1 << 20,
		SnapshotEntries:     16,
		SnapshotBytes:       16 << 10,
		TickInterval:        100 * time.Millisecond,
		ExpirySweepInterval: 100 * time.Millisecond,
	}
}

func testLogger(tb testing.TB) *slog.Logger {
	tb.Helper()
	level := slog.LevelError
	if os.Getenv("ENGINE_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// fakeClock is the engine's clock in tests that need control over time
// (TTL, determinism). Raft ticks keep real time.
type fakeClock struct{ ms atomic.Int64 }

func newFakeClock(start time.Time) *fakeClock {
	c := &fakeClock{}
	c.ms.Store(start.UnixMilli())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }

// testEngine is an Engine with its Run goroutine.
type testEngine struct {
	*Engine
	node   *Node
	deps   Deps
	cancel context.CancelFunc
	done   chan error
}

// newEngine opens an engine without running it; clock, when set, is the
// engine's clock.
func newEngine(tb testing.TB, cfg Config, clock *fakeClock) *testEngine {
	tb.Helper()
	var deps Deps
	if clock != nil {
		deps.Now = clock.Now
	}
	return openEngine(tb, cfg, deps)
}

// openEngine opens an engine with deps (its logger is the test's).
func openEngine(tb testing.TB, cfg Config, deps Deps) *testEngine {
	tb.Helper()
	deps.Logger = testLogger(tb)
	n, err := Open(cfg, deps)
	if err != nil {
		tb.Fatalf("engine.Open: %v", err)
	}
	return &testEngine{Engine: n.Engine, node: n, deps: deps}
}

// status is group g's Raft status on this node.
func (te *testEngine) status(g uint32) multiraft.GroupStatus { return te.node.Cluster.Status(g) }

// run starts the engine; it is stopped when the test ends (or by stop).
func (te *testEngine) run(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	te.cancel = cancel
	te.done = make(chan error, 1)
	go func() { te.done <- te.node.Run(ctx) }()
	tb.Cleanup(func() { te.stop(tb) })
}

// stop ends Run and waits for it; the engine cannot be run again.
func (te *testEngine) stop(tb testing.TB) {
	tb.Helper()
	if te.cancel == nil {
		return
	}
	te.cancel()
	te.cancel = nil
	select {
	case err := <-te.done:
		if err != nil {
			tb.Errorf("engine Run: %v", err)
		}
	case <-time.After(15 * time.Second):
		tb.Fatalf("engine Run did not return after cancel")
	}
}

func (te *testEngine) waitReady(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 20*time.Second)
	defer cancel()
	if err := te.node.WaitReady(ctx); err != nil {
		tb.Fatalf("WaitReady: %v", err)
	}
}

// startEngine runs a single-node engine on a fresh directory, waits until
// it is ready and creates testBucket.
func startEngine(tb testing.TB, clock *fakeClock) *testEngine {
	tb.Helper()
	return startEngineAt(tb, testConfig(tb.TempDir()), clock)
}

func startEngineAt(tb testing.TB, cfg Config, clock *fakeClock) *testEngine {
	tb.Helper()
	te := newEngine(tb, cfg, clock)
	te.run(tb)
	te.waitReady(tb)
	if _, err := te.CreateBucket(tb.Context(), &streamv1.CreateBucketRequest{Bucket: testBucket}); err != nil {
		tb.Fatalf("CreateBucket: %v", err)
	}
	return te
}

// restart stops te and runs a new engine on the same directory.
func restart(tb testing.TB, te *testEngine, clock *fakeClock) *testEngine {
	tb.Helper()
	cfg, deps := te.Config(), te.deps
	te.stop(tb)
	deps.Now = nil
	if clock != nil {
		deps.Now = clock.Now
	}
	ne := openEngine(tb, cfg, deps)
	ne.run(tb)
	ne.waitReady(tb)
	return ne
}

func ref(name string) *streamv1.StreamRef {
	return &streamv1.StreamRef{Bucket: testBucket, Stream: name}
}

func key(name string) stream.Key { return stream.Key{Bucket: testBucket, Stream: name} }

// errNotStorage stands for an error that is no storage kind.
var errNotStorage = &fault.Kind{}

// codeOf returns the kind of err (nil for nil, errNotStorage for an error
// of no kind).
func codeOf(err error) *fault.Kind {
	if err == nil {
		return nil
	}
	if k := fault.KindOf(err); k != nil {
		return k
	}
	return errNotStorage
}

func wantCode(tb testing.TB, what string, err error, want *fault.Kind) {
	tb.Helper()
	if got := codeOf(err); got != want {
		tb.Fatalf("%s: error %v (kind %v), want kind %v", what, err, got, want)
	}
}

func mustCreate(tb testing.TB, e *testEngine, req *streamv1.CreateStreamRequest) *streamv1.CreateStreamResponse {
	tb.Helper()
	resp, err := e.CreateStream(tb.Context(), req)
	if err != nil {
		tb.Fatalf("CreateStream %s: %v", req.GetRef().GetStream(), err)
	}
	return resp
}

func mustAppend(tb testing.TB, e *testEngine, name, contentType string, body string) *streamv1.AppendResponse {
	tb.Helper()
	resp, err := e.Append(tb.Context(), &streamv1.AppendRequest{Ref: ref(name), ContentType: contentType, Body: []byte(body)})
	if err != nil {
		tb.Fatalf("Append %s: %v", name, err)
	}
	return resp
}

// readAll reads a stream's whole view from the start in one request.
func readAll(tb testing.TB, e *testEngine, name string) string {
	tb.Helper()
	resp, err := e.Read(tb.Context(), &streamv1.ReadRequest{Ref: ref(name), Offset: stream.OffsetStart, NoTouch: true})
	if err != nil {
		tb.Fatalf("Read %s: %v", name, err)
	}
	if !resp.GetUpToDate() {
		tb.Fatalf("Read %s: not up to date after %q", name, resp.GetData())
	}
	return string(resp.GetData())
}

func off(pos uint64) string { return stream.FormatOffset(pos) }
