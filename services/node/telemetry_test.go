package node

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/telemetry"
	"github.com/ursula/ursula/tests/await"
	"github.com/ursula/ursula/tests/otelcheck"
)

// TestNodeMetricsDescribed: every numeric value of a live node's metrics
// document has a conventional instrument (or is omitted on purpose), and
// the node's sources pass the Prometheus linter.
func TestNodeMetricsDescribed(t *testing.T) {
	eng := startEngine(t)
	s := newServer(t, eng)
	ctx := t.Context()
	ref := &streamv1.StreamRef{Bucket: "__ds", Stream: "metrics/described"}
	if _, err := s.streams.CreateStream(ctx, &streamv1.CreateStreamRequest{Ref: ref, ContentType: "text/plain"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.streams.Append(ctx, &streamv1.AppendRequest{Ref: ref, ContentType: "text/plain", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if missing := nodeDocument.Undescribed(s.metricsSnapshot()); len(missing) > 0 {
		t.Errorf("metrics document values without an instrument in nodeMetrics: %v", missing)
	}

	tel, err := telemetry.New(ctx, telemetry.Config{Prometheus: true}, telemetry.Identity{ServiceName: "node-test", NodeID: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	for name, src := range map[string]telemetry.Source{"node": s.MetricsSource(), "raft": s.RaftMetricsSource(), "wal": s.WALMetricsSource()} {
		if err := tel.RegisterSource(name, src); err != nil {
			t.Fatal(err)
		}
	}
	rec := httptest.NewRecorder()
	tel.PrometheusHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/__ursula/prometheus", nil))
	body, _ := io.ReadAll(rec.Body)
	text := string(body)
	for _, p := range otelcheck.Lint(t, text) {
		t.Errorf("promlint: %s", p)
	}
	for _, want := range []string{
		"ursula_node_append_requests_total 1",
		"ursula_node_append_bytes_total 1",
		`ursula_node_raft_group_leader_info{leader_node_id="1",raft_group_id="0"} 1`,
		"# TYPE ursula_node_append_time_seconds_total counter",
		"# TYPE ursula_node_raft_groups gauge",
		`ursula_raft_recovery_gates{status="stalled"} 0`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in the exposition", want)
		}
	}
	for _, bad := range []string{"ursula_node_node_id", "ursula_node_raft_group_leader_id", "_ns_total", "_ms ", "ursula_node_raft_group_count"} {
		if strings.Contains(text, bad) {
			t.Errorf("the exposition has %q", bad)
		}
	}
}

// TestMetricsPlane: server.metrics_listen serves the Prometheus
// exposition, the JSON document and readiness, and refuses everything
// else: no mutation, no profile, no audit log, no usage.
func TestMetricsPlane(t *testing.T) {
	eng := startEngine(t)
	cfg := testConfig(freeAddr(t), freeAddr(t))
	cfg.MetricsListen = freeAddr(t)
	cfg.AdminPprof = true
	prom := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "# exposition\n") })
	s, err := New(cfg, eng, Deps{Prometheus: prom}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	hc := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(hc.CloseIdleConnections)
	base := "http://" + cfg.MetricsListen
	await.True(t, "readiness on the metrics plane", func() bool {
		code, _, err := tryDo(t.Context(), hc, http.MethodGet, base+"/__ursula/ready", nil)
		return err == nil && code == http.StatusOK
	})
	resp, err := hc.Get(base + "/__ursula/prometheus")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "# exposition\n" {
		t.Fatalf("GET /__ursula/prometheus: %d %q", resp.StatusCode, body)
	}
	if code, m := do(t, hc, http.MethodGet, base+"/__ursula/metrics", nil); code != http.StatusOK || m["cluster_id"] != testClusterID {
		t.Fatalf("GET /__ursula/metrics: %d %v", code, m["cluster_id"])
	}
	// Even with the admin token, nothing else answers.
	hdr := authed(s, s.Incarnation())
	for _, c := range []struct {
		method, path string
		want         int
	}{
		{http.MethodPost, "/__ursula/prometheus", http.StatusMethodNotAllowed},
		{http.MethodPost, "/__ursula/metrics", http.StatusMethodNotAllowed},
		{http.MethodPost, "/__ursula/feature-level", http.StatusNotFound},
		{http.MethodGet, "/__ursula/feature-level", http.StatusNotFound},
		{http.MethodPost, "/__ursula/raft/0/recovery/accept-unsynced-loss", http.StatusNotFound},
		{http.MethodGet, "/__ursula/usage", http.StatusNotFound},
		{http.MethodGet, "/__ursula/audit", http.StatusNotFound},
		{http.MethodGet, "/debug/pprof/", http.StatusNotFound},
		{http.MethodPost, "/v1/admin/raft/0/transfer-leadership", http.StatusNotFound},
		{http.MethodDelete, "/v1/stream/x", http.StatusNotFound},
	} {
		if code := statusOf(t, hc, c.method, base+c.path, hdr); code != c.want {
			t.Errorf("%s %s on the metrics plane: %d, want %d", c.method, c.path, code, c.want)
		}
	}
	// The admin plane answers what the metrics plane refuses.
	if code := statusOf(t, hc, http.MethodGet, "http://"+cfg.AdminListen+"/__ursula/feature-level", hdr); code != http.StatusOK {
		t.Errorf("GET /__ursula/feature-level on the admin plane: %d, want 200", code)
	}
}

// statusOf sends one request and returns its status code.
func statusOf(tb testing.TB, client *http.Client, method, url string, header http.Header) int {
	tb.Helper()
	req, err := http.NewRequestWithContext(tb.Context(), method, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	req.Header = header.Clone()
	resp, err := client.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestNodeMetricsUnits: every exported value of the catalog has a unit
// and a description.
func TestNodeMetricsUnits(t *testing.T) {
	for name, m := range nodeMetrics {
		if !m.Omit && (m.Unit == "" || m.Help == "") {
			t.Errorf("%s: unit %q, help %q", name, m.Unit, m.Help)
		}
	}
}
