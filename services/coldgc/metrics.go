package coldgc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/ursula/ursula/services/platform/httpserver"
	"github.com/ursula/ursula/services/platform/telemetry"
)

// documentPrefix prefixes the worker's values in a node's metrics document
// (AddMetrics): coldgc_passes, coldgc_errors, ...
const documentPrefix = "coldgc_"

// metrics describes the worker's counters, by sample name: the names of
// the worker's own source (ursula.coldgc.<name>, in the coldgc target) and,
// prefixed with documentPrefix, of the values AddMetrics adds to the
// all-in-one node's document. One table for both, so that the two
// exports cannot drift apart.
var metrics = map[string]telemetry.Metric{
	"passes":              counter("{pass}", "Cold GC passes."),
	"reclaimed_entries":   counter("{entry}", "Cold-tier entries reclaimed."),
	"deleted_objects":     counter("{object}", "Cold objects deleted."),
	"errors":              counter("{error}", "Cold GC errors."),
	"compactions":         counter("{compaction}", "Cold GC compactions."),
	"corrupt_objects":     counter("{object}", "Corrupt cold objects found."),
	"compaction_rejected": counter("{compaction}", "Cold GC compactions refused."),
	"orphans_deleted":     counter("{object}", "Orphaned cold objects deleted."),
	"sweeps":              counter("{sweep}", "Orphan sweeps."),
	"held_skips":          counter("{object}", "Objects a pass skipped because a backup holds them."),
}

func counter(unit, help string) telemetry.Metric {
	return telemetry.Metric{Kind: telemetry.Counter, Unit: unit, Help: help}
}

// document reads the worker's own metrics document (values by sample name).
var document = telemetry.Document{Metrics: metrics}

// DocumentMetrics describes the values AddMetrics adds to a metrics
// document, by document key, for that document's telemetry.Document.
// The map is the caller's.
func DocumentMetrics() map[string]telemetry.Metric {
	out := make(map[string]telemetry.Metric, len(metrics))
	for k, m := range metrics {
		out[documentPrefix+k] = m
	}
	return out
}

// snapshot returns the worker's counters by sample name.
func (w *Worker) snapshot() map[string]any {
	st := &w.stats
	return map[string]any{
		"passes":              float64(st.Passes.Load()),
		"reclaimed_entries":   float64(st.Reclaimed.Load()),
		"deleted_objects":     float64(st.DeletedObjects.Load()),
		"errors":              float64(st.Errors.Load()),
		"compactions":         float64(st.Compactions.Load()),
		"corrupt_objects":     float64(st.CorruptObjects.Load()),
		"compaction_rejected": float64(st.CompactRejected.Load()),
		"orphans_deleted":     float64(st.OrphansDeleted.Load()),
		"sweeps":              float64(st.Sweeps.Load()),
		"held_skips":          float64(st.HeldSkips.Load()),
	}
}

// AddMetrics adds the worker's counters to a metrics document (the
// all-in-one node's), as coldgc_<name>; DocumentMetrics describes them.
func (w *Worker) AddMetrics(out map[string]any) {
	for k, v := range w.snapshot() {
		out[documentPrefix+k] = v
	}
}

// MetricsSource reads the worker's counters as telemetry samples
// (instruments ursula.coldgc.<name> when registered as "coldgc"; in
// Prometheus ursula_coldgc_passes_total, ...).
func (w *Worker) MetricsSource() telemetry.Source {
	return func(emit func(telemetry.Sample)) { document.Emit(w.snapshot(), emit) }
}

// Ready reasons of the metrics plane's GET /__ursula/ready.
const (
	// ReasonNotRunning: the worker's Run has not started or has returned.
	ReasonNotRunning = "not_running"
)

// Handler serves the worker's metrics plane, read-only: GET
// /__ursula/prometheus (prometheus, the process's exporter; without one,
// 404) and GET /__ursula/ready (200 while Run runs: the cold store is open
// and its format checked, as New's caller did before; 503 otherwise).
// Every other request is 404, or 405 for another method on those paths.
func (w *Worker) Handler(prometheus http.Handler) http.Handler {
	mux := http.NewServeMux()
	if prometheus != nil {
		mux.Handle("GET /__ursula/prometheus", prometheus)
	}
	mux.HandleFunc("GET /__ursula/ready", w.serveReady)
	return mux
}

func (w *Worker) serveReady(rw http.ResponseWriter, _ *http.Request) {
	doc := map[string]any{"ready": true}
	code := http.StatusOK
	if !w.running.Load() {
		doc["ready"], doc["reason"] = false, ReasonNotRunning
		code = http.StatusServiceUnavailable
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(code)
	_ = json.NewEncoder(rw).Encode(doc)
}

// MetricsPlane serves a worker's Handler on one address (the coldgc
// target's server.metrics_listen, its only listener).
type MetricsPlane struct {
	addr      string
	handler   http.Handler
	logger    *slog.Logger
	listening chan struct{}

	mu    sync.Mutex
	bound net.Addr
}

// NewMetricsPlane returns a plane serving w.Handler(prometheus) on addr
// (host:port); it binds nothing until Run.
func NewMetricsPlane(addr string, w *Worker, prometheus http.Handler, logger *slog.Logger) *MetricsPlane {
	return &MetricsPlane{addr: addr, handler: w.Handler(prometheus), logger: logger, listening: make(chan struct{})}
}

// Listening is closed once Run has bound the address.
func (p *MetricsPlane) Listening() <-chan struct{} { return p.listening }

// Addr is the bound address (nil before Listening is closed).
func (p *MetricsPlane) Addr() net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bound
}

// Run serves until ctx ends, then shuts the listener down; it fails when
// the address cannot be bound or the server stops on its own.
func (p *MetricsPlane) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("coldgc: listen on metrics plane %s: %w", p.addr, err)
	}
	p.mu.Lock()
	p.bound = ln.Addr()
	p.mu.Unlock()
	srv := httpserver.Config{}.Server(p.handler, slog.NewLogLogger(p.logger.Handler(), slog.LevelWarn))
	served := make(chan error, 1)
	go func() { served <- srv.Serve(httpserver.LimitConnections(ln, httpserver.SidePlaneMaxConnections, nil)) }()
	close(p.listening)
	p.logger.Info("cold GC metrics plane listening", "metrics", ln.Addr().String())
	select {
	case err := <-served:
		return fmt.Errorf("coldgc: metrics plane: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
