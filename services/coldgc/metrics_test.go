package coldgc

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ursula/ursula/services/platform/telemetry"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/tests/await"
	"github.com/ursula/ursula/tests/otelcheck"
)

// TestMetricsConventions: every counter of the worker has an instrument,
// the node's document describes the same values under coldgc_<name>, and
// the exposition of the worker's own source passes the Prometheus linter.
func TestMetricsConventions(t *testing.T) {
	w := newWorker(t, &fakeNode{}, objstore.NewMemory())
	if _, err := w.Reclaim(t.Context(), ""); err != nil {
		t.Fatal(err)
	}
	if missing := document.Undescribed(w.snapshot()); len(missing) > 0 {
		t.Errorf("worker values without an instrument: %v", missing)
	}
	doc := map[string]any{}
	w.AddMetrics(doc)
	described := DocumentMetrics()
	if missing := (telemetry.Document{Metrics: described}).Undescribed(doc); len(missing) > 0 {
		t.Errorf("node document values DocumentMetrics does not describe: %v", missing)
	}
	for k := range described {
		if _, ok := doc[k]; !ok {
			t.Errorf("DocumentMetrics describes %s, which AddMetrics does not add", k)
		}
	}
	for name, m := range metrics {
		if m.Unit == "" || m.Help == "" {
			t.Errorf("%s: unit %q, help %q", name, m.Unit, m.Help)
		}
	}

	tel, err := telemetry.New(t.Context(), telemetry.Config{Prometheus: true}, telemetry.Identity{ServiceName: "coldgc-test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	if err := tel.RegisterSource("coldgc", w.MetricsSource()); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	w.Handler(tel.PrometheusHandler()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/__ursula/prometheus", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /__ursula/prometheus: %d", rec.Code)
	}
	text := rec.Body.String()
	for _, p := range otelcheck.Lint(t, text) {
		t.Errorf("promlint: %s", p)
	}
	want := []string{"ursula_build_info{", "ursula_coldgc_passes_total 1"}
	for name, m := range metrics {
		want = append(want, "# HELP ursula_coldgc_"+name+"_total "+m.Help)
	}
	for _, s := range want {
		if !strings.Contains(text, s) {
			t.Errorf("no %q in:\n%s", s, text)
		}
	}
}

// TestHandler: the metrics plane is read-only and ready only while the
// worker runs.
func TestHandler(t *testing.T) {
	w := newWorker(t, &fakeNode{}, objstore.NewMemory())
	prom := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, "# metrics") })
	h := w.Handler(prom)
	do := func(method, path string) int {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec.Code
	}
	if c := do(http.MethodGet, "/__ursula/ready"); c != http.StatusServiceUnavailable {
		t.Errorf("ready before Run: %d, want 503", c)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	await.True(t, "ready while Run runs", func() bool { return do(http.MethodGet, "/__ursula/ready") == http.StatusOK })
	tests := []struct {
		name, method, path string
		want               int
	}{
		{"prometheus", http.MethodGet, "/__ursula/prometheus", http.StatusOK},
		{"head", http.MethodHead, "/__ursula/ready", http.StatusOK},
		{"post prometheus", http.MethodPost, "/__ursula/prometheus", http.StatusMethodNotAllowed},
		{"post ready", http.MethodPost, "/__ursula/ready", http.StatusMethodNotAllowed},
		{"json metrics", http.MethodGet, "/__ursula/metrics", http.StatusNotFound},
		{"pprof", http.MethodGet, "/debug/pprof/", http.StatusNotFound},
		{"root", http.MethodGet, "/", http.StatusNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if c := do(tc.method, tc.path); c != tc.want {
				t.Errorf("%s %s: %d, want %d", tc.method, tc.path, c, tc.want)
			}
		})
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if c := do(http.MethodGet, "/__ursula/ready"); c != http.StatusServiceUnavailable {
		t.Errorf("ready after Run: %d, want 503", c)
	}
}

// TestMetricsPlane: the plane binds, serves the handler, and stops with
// its context.
func TestMetricsPlane(t *testing.T) {
	w := newWorker(t, &fakeNode{}, objstore.NewMemory())
	p := NewMetricsPlane("127.0.0.1:0", w, nil, w.logger)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-p.Listening():
	case err := <-done:
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + p.Addr().String() + "/__ursula/prometheus")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /__ursula/prometheus without an exporter: %d, want 404", resp.StatusCode)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
