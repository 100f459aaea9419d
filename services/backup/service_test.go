package backup

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	"github.com/ursula/ursula/services/platform/telemetry"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/tests/await"
)

// serviceHarness runs a Service whose schedule the test drives: the
// service's waits read ticks, and each wait is announced on waiting.
type serviceHarness struct {
	t       *testing.T
	e       *env
	svc     *Service
	ticks   chan time.Time
	waiting chan time.Duration
	cancel  context.CancelFunc
	done    chan error
}

func startService(t *testing.T, e *env, cfg Config) *serviceHarness {
	t.Helper()
	cfg.Location = e.loc.String()
	if cfg.Interval == 0 {
		cfg.Interval = time.Hour
	}
	cfg.HoldTTL, cfg.Concurrency = DefaultHoldTTL, 2
	svc, err := New(cfg, e.nodes, nil, discard)
	if err != nil {
		t.Fatal(err)
	}
	h := &serviceHarness{t: t, e: e, svc: svc, ticks: make(chan time.Time), waiting: make(chan time.Duration, 16), done: make(chan error, 1)}
	var mu sync.Mutex
	clock := e.clock
	svc.now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(time.Second)
		return clock
	}
	svc.after = func(d time.Duration) (<-chan time.Time, func() bool) {
		h.waiting <- d
		return h.ticks, func() bool { return true }
	}
	ctx, cancel := context.WithCancel(t.Context())
	h.cancel = cancel
	go func() { h.done <- svc.Run(ctx) }()
	t.Cleanup(func() { h.stop() })
	return h
}

// waitIdle waits until the service waits for its next tick.
func (h *serviceHarness) waitIdle() time.Duration {
	h.t.Helper()
	select {
	case d := <-h.waiting:
		return d
	case err := <-h.done:
		h.t.Fatalf("the service stopped: %v", err)
	case <-time.After(await.DefaultTimeout):
		h.t.Fatal("the service never waited for its next run")
	}
	return 0
}

func (h *serviceHarness) tick() { h.ticks <- time.Time{} }

func (h *serviceHarness) stop() error {
	h.cancel()
	select {
	case err := <-h.done:
		h.done <- err
		return err
	case <-time.After(await.DefaultTimeout):
		h.t.Fatal("the service did not stop")
		return nil
	}
}

func (h *serviceHarness) metric(name string) float64 {
	v, _ := h.svc.metrics.snapshot()[name].(float64)
	return v
}

func TestServiceRunsOnScheduleAndSurvivesFailures(t *testing.T) {
	e := newEnv(t)
	e.populate()
	h := startService(t, e, Config{KeepLast: 1})

	// No backup yet: the first runs at once, then the service waits an
	// interval.
	if d := h.waitIdle(); d < 59*time.Minute || d > time.Hour {
		t.Fatalf("waits %v after the first backup, want about the interval", d)
	}
	if h.metric("backups") != 1 || h.metric("failures") != 0 || h.metric("last_copied_objects") != populated || h.metric("last_success_unix_seconds") == 0 {
		t.Fatalf("metrics after the first backup: %v", h.svc.metrics.snapshot())
	}

	// A failed run is counted, and the next tick tries again.
	for _, f := range e.fakes {
		f.setDown(true)
	}
	h.tick()
	h.waitIdle()
	if h.metric("failures") != 1 || h.metric("backups") != 1 || h.svc.metrics.snapshot()["last_error"] == "" {
		t.Fatalf("metrics after a failure: %v", h.svc.metrics.snapshot())
	}
	for _, f := range e.fakes {
		f.setDown(false)
	}
	e.addStream(streamSpec{bucket: "app", name: "later", chunks: 1})
	h.tick()
	h.waitIdle()
	snap := h.svc.metrics.snapshot()
	if snap["backups"] != 2.0 || snap["last_copied_objects"] != 1.0 || snap["last_reused_objects"] != float64(populated) ||
		snap["prunes"] != 2.0 || snap["pruned_backups"] != 1.0 || snap["in_progress"] != 0.0 {
		t.Fatalf("metrics after the third run: %v", snap)
	}
	all, err := List(t.Context(), e.loc)
	if err != nil || len(all) != 1 {
		t.Fatalf("keep_last 1 left %d backups: %v", len(all), err)
	}

	// The same numbers reach OpenTelemetry.
	samples := map[string]telemetry.Sample{}
	h.svc.MetricsSource()(func(s telemetry.Sample) { samples[s.Name] = s })
	if s := samples["backups"]; s.Kind != telemetry.Counter || s.Value != 2 {
		t.Fatalf("backups sample %+v", s)
	}
	if s := samples["in_progress"]; s.Kind != telemetry.Gauge {
		t.Fatalf("in_progress sample %+v", s)
	}
	if err := h.stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
}

func TestServiceStartsFromTheNewestBackup(t *testing.T) {
	e := newEnv(t)
	e.populate()
	e.clock = time.Date(2026, 7, 25, 12, 0, 0, 0, time.UTC)
	e.create(CreateOptions{})
	// The service's clock starts where the backup's was: the next run is
	// an interval after that backup, not now.
	h := startService(t, e, Config{Interval: 6 * time.Hour})
	if d := h.waitIdle(); d < 5*time.Hour || d > 6*time.Hour {
		t.Fatalf("first wait %v, want about 6h after the newest backup", d)
	}
	if h.metric("backups") != 0 {
		t.Fatal("the service backed up at start although a recent backup exists")
	}
}

func TestServiceStopCancelsABackupInFlight(t *testing.T) {
	e := newEnv(t)
	e.populate()
	started := make(chan struct{})
	var once sync.Once
	e.cluster.exportGate = func(ctx context.Context, g uint32) error {
		once.Do(func() { close(started) })
		<-ctx.Done()
		return ctx.Err()
	}
	h := startService(t, e, Config{})
	<-started
	if h.metric("in_progress") != 1 {
		t.Fatal("no backup in progress")
	}
	if err := h.stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	if h.metric("failures") != 0 {
		t.Fatal("a cancelled backup counted as a failure")
	}
	if keys := listKeys(t, e.loc.store, ""); len(keys) != 0 {
		t.Fatalf("the cancelled backup left %v (the lock must be released, no manifest written)", keys)
	}
}

func TestServiceReadiness(t *testing.T) {
	e := newEnv(t)
	cfg := Config{Location: e.loc.String(), Interval: time.Hour, HoldTTL: DefaultHoldTTL, Concurrency: 1}
	svc, err := New(cfg, e.nodes, nil, discard)
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, map[string]any) {
		t.Helper()
		rec := httptest.NewRecorder()
		svc.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		var doc map[string]any
		if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
			t.Fatalf("%s: %v: %s", path, err, rec.Body)
		}
		return rec.Code, doc
	}
	if code, doc := get("/__ursula/ready"); code != http.StatusServiceUnavailable || doc["reason"] != ReasonStarting {
		t.Fatalf("before Run: %d %v", code, doc)
	}
	svc.location = e.loc
	if code, doc := get("/__ursula/ready"); code != http.StatusOK || doc["ready"] != true || doc["cluster_id"] != "prod-1" {
		t.Fatalf("ready: %d %v", code, doc)
	}
	e.fakes[0].setDown(true)
	if code, doc := get("/__ursula/ready"); code != http.StatusOK {
		t.Fatalf("one node down: %d %v", code, doc)
	}
	e.fakes[1].infoOverride = func(i *backupv1.BackupInfo) { i.ClusterId = "other" }
	if code, doc := get("/__ursula/ready"); code != http.StatusServiceUnavailable || doc["reason"] != ReasonClusterMismatch {
		t.Fatalf("nodes of two clusters: %d %v", code, doc)
	}
	for _, f := range e.fakes {
		f.setDown(true)
	}
	if code, doc := get("/__ursula/ready"); code != http.StatusServiceUnavailable || doc["reason"] != ReasonNodesUnreachable {
		t.Fatalf("every node down: %d %v", code, doc)
	}
	for _, f := range e.fakes {
		f.setDown(false)
	}
	e.fakes[1].infoOverride = nil
	svc.location = NewLocation(failingStore{objstore.NewMemory()}, "broken")
	if code, doc := get("/__ursula/ready"); code != http.StatusServiceUnavailable || doc["reason"] != ReasonLocationUnreachable {
		t.Fatalf("location unreachable: %d %v", code, doc)
	}
	if code, doc := get("/__ursula/metrics"); code != http.StatusOK || doc["backups"] != 0.0 {
		t.Fatalf("metrics: %d %v", code, doc)
	}
}

// failingStore fails every call, as an unreachable bucket does.
type failingStore struct{ objstore.Store }

func (failingStore) Head(context.Context, string) (objstore.Info, error) {
	return objstore.Info{}, errors.New("connection refused")
}
