package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/ursula/ursula/internal/freeport"
	"github.com/ursula/ursula/tests/await"
	"github.com/ursula/ursula/tests/otelcheck"
)

// The Prometheus and OpenTelemetry conventions, checked against live
// processes: every exposition passes the Prometheus linter, the metrics
// plane serves nothing but metrics and readiness, and OTLP/HTTP export
// carries service.version, units, and SSE spans in their request's trace.

// httpGet GETs url and returns the status and body.
func httpGet(tb testing.TB, url string) (int, string) {
	tb.Helper()
	return httpDo(tb, http.MethodGet, url, nil)
}

func httpDo(tb testing.TB, method, url string, hdr http.Header) (int, string) {
	tb.Helper()
	req, err := http.NewRequestWithContext(tb.Context(), method, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, url, err)
	}
	return resp.StatusCode, string(body)
}

// refusal is a request a read-only plane must refuse, and its status.
type refusal struct {
	method, path string
	want         int
}

// wantRefused sends each request to base (with hdr) and fails tb for each
// answer other than its refusal.
func wantRefused(tb testing.TB, plane, base string, hdr http.Header, rs []refusal) {
	tb.Helper()
	for _, r := range rs {
		if code, _ := httpDo(tb, r.method, base+r.path, hdr); code != r.want {
			tb.Errorf("%s %s on %s: %d, want %d", r.method, r.path, plane, code, r.want)
		}
	}
}

// lintScrape scrapes a Prometheus endpoint, fails tb on any promlint
// problem, and returns the exposition.
func lintScrape(tb testing.TB, what, url string) string {
	tb.Helper()
	code, text := httpGet(tb, url)
	if code != http.StatusOK {
		tb.Fatalf("%s: GET %s: %d %s", what, url, code, text)
	}
	for _, p := range otelcheck.Lint(tb, text) {
		tb.Errorf("%s: promlint: %s", what, p)
	}
	return text
}

// wantSeries fails tb for each metric family name missing from text.
func wantSeries(tb testing.TB, what, text string, names ...string) {
	tb.Helper()
	for _, n := range names {
		if !strings.Contains(text, "\n"+n+" ") && !strings.Contains(text, "\n"+n+"{") {
			tb.Errorf("%s: no %s in the exposition", what, n)
		}
	}
}

// sseLive opens a live SSE read of stream from the start, with hdr, and
// reads the history; once the gateway follows the stream for it (its
// sse_hubs gauge: the shared upstream subscription runs), it appends
// "live;" and reads it as a live event, then closes the read.
func sseLive(tb *testing.T, c *Client, stream string, hdr http.Header) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), await.DefaultTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.BaseURL+StreamRoot+stream+"?offset=-1&live=sse", nil)
	if err != nil {
		tb.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("SSE read: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("SSE read: %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	// nextData returns the next data event's payload.
	nextData := func() string {
		inData := false
		for sc.Scan() {
			switch line := sc.Text(); {
			case line == "event: data":
				inData = true
			case inData && strings.HasPrefix(line, "data:"):
				return line[len("data:"):]
			}
		}
		tb.Fatalf("SSE read ended without data: %v", sc.Err())
		return ""
	}
	nextData()
	await.True(tb, "the gateway's upstream subscription for the SSE read", func() bool {
		code, body := httpGet(tb, c.BaseURL+"/__ursula/metrics")
		var m struct {
			Hubs int `json:"sse_hubs"`
		}
		return code == http.StatusOK && json.Unmarshal([]byte(body), &m) == nil && m.Hubs > 0
	})
	mustStatus(tb, "append", 204)(c.Append(ctx, stream, "text/plain", []byte("live;"), nil))
	for {
		if strings.Contains(nextData(), "live;") {
			return
		}
	}
}

// exercise creates stream and does what fills every histogram: appends,
// a read, and a live SSE read.
func exercise(tb *testing.T, c *Client, stream string, sseHdr http.Header) {
	tb.Helper()
	ctx := tb.Context()
	mustStatus(tb, "create", 201)(c.Create(ctx, stream, "text/plain", nil))
	for range 3 {
		mustStatus(tb, "append", 204)(c.Append(ctx, stream, "text/plain", []byte("event;"), nil))
	}
	mustStatus(tb, "read", 200)(c.Read(ctx, stream, "-1"))
	sseLive(tb, c, stream, sseHdr)
}

// TestPrometheusConventionsAllInOne lints a live all-in-one process's
// exposition on its metrics plane (server.metrics_listen), finds the
// latency histograms and ursula_build_info there, and finds nothing else
// served on that plane.
func TestPrometheusConventionsAllInOne(t *testing.T) {
	bin, err := Binary("ursula")
	if err != nil {
		t.Fatal(err)
	}
	flags, err := DefinedFlags(bin, DefaultListenFlags...)
	if err != nil {
		t.Fatal(err)
	}
	srv := StartServer(t, Options{Binary: bin, ListenFlags: append(flags, "server.metrics_listen")})
	exercise(t, NewClient(srv.URL()), "obs/all", nil)

	metricsBase := "http://" + srv.Addrs["server.metrics_listen"]
	text := lintScrape(t, "all-in-one metrics plane", metricsBase+"/__ursula/prometheus")
	wantSeries(t, "all-in-one", text,
		"ursula_build_info",
		"http_server_request_duration_seconds_count",
		"ursula_node_append_duration_seconds_count",
		"ursula_node_read_duration_seconds_count",
		"ursula_raft_apply_duration_seconds_count",
		"ursula_raft_persist_duration_seconds_count",
		"ursula_node_append_requests_total",
		"ursula_gateway_requests_total",
		`ursula_raft_recovery_gates`,
	)
	// The admin plane serves the same exposition.
	lintScrape(t, "all-in-one admin plane", "http://"+srv.Addrs["server.admin_listen"]+"/__ursula/prometheus")

	if code, body := httpGet(t, metricsBase+"/__ursula/ready"); code != http.StatusOK {
		t.Errorf("GET /__ursula/ready on the metrics plane: %d %s", code, body)
	}
	if code, body := httpGet(t, metricsBase+"/__ursula/metrics"); code != http.StatusOK || !strings.Contains(body, `"append_requests"`) {
		t.Errorf("GET /__ursula/metrics on the metrics plane: %d %.200s", code, body)
	}
	// Nothing that changes anything, even with the admin token.
	auth := http.Header{"Authorization": {srv.AdminAuth(t)}}
	wantRefused(t, "the metrics plane", metricsBase, auth, []refusal{
		{http.MethodPost, "/__ursula/prometheus", http.StatusMethodNotAllowed},
		{http.MethodPost, "/__ursula/feature-level", http.StatusNotFound},
		{http.MethodPost, "/__ursula/raft/0/recovery/accept-unsynced-loss", http.StatusNotFound},
		{http.MethodGet, "/__ursula/audit", http.StatusNotFound},
		{http.MethodGet, "/debug/pprof/", http.StatusNotFound},
		{http.MethodPut, StreamRoot + "obs/other", http.StatusNotFound},
	})
}

// TestPrometheusConventionsSplit lints the expositions of a storage node
// and of a gateway in front of a 3-node cluster.
func TestPrometheusConventionsSplit(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Nodes: 3, GroupCount: 4, Gateway: true})
	exercise(t, c.Client(), "obs/split", nil)
	gw := lintScrape(t, "gateway", c.GatewayURL()+"/__ursula/prometheus")
	wantSeries(t, "gateway", gw, "ursula_build_info", "http_server_request_duration_seconds_count", "ursula_gateway_requests_total", "ursula_upstream_node_up")
	for _, n := range c.Nodes {
		text := lintScrape(t, "node", "http://"+n.Config.AdminListen+"/__ursula/prometheus")
		wantSeries(t, "node", text, "ursula_build_info", "ursula_node_raft_groups", "ursula_raft_apply_duration_seconds_count",
			"ursula_raft_persist_duration_seconds_count", "ursula_node_raft_messages_sent_total", "ursula_node_raft_peer_connected")
	}
}

// TestPrometheusConventionsColdGC scrapes ursula-coldgc's only listener,
// its metrics plane (server.metrics_listen), beside a 2-node cluster: the
// exposition passes the linter and shows the build and a pass counter that
// grows, under service.name ursula-coldgc; the plane answers ready and
// refuses anything else.
func TestPrometheusConventionsColdGC(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Nodes: 2, GroupCount: 2})
	addrs, err := freeport.Addrs(1)
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + addrs[0]
	cmd := c.StartColdGC(t, filepath.Join(c.Dir, "cold"), "", "-server.metrics_listen", addrs[0])
	await.True(t, "ursula-coldgc ready on its metrics plane", func() bool {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, base+"/__ursula/ready", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	text := lintScrape(t, "coldgc", base+"/__ursula/prometheus")
	wantSeries(t, "coldgc", text, "ursula_build_info", "ursula_coldgc_passes_total", "ursula_coldgc_errors_total")
	if !strings.Contains(text, `service_name="ursula-coldgc"`) {
		t.Errorf("coldgc: no target_info with service.name ursula-coldgc in the exposition")
	}
	first := sampleValue(t, text, "ursula_coldgc_passes_total")
	await.True(t, "ursula_coldgc_passes_total grows", func() bool {
		return sampleValue(t, lintScrape(t, "coldgc", base+"/__ursula/prometheus"), "ursula_coldgc_passes_total") > first
	})
	wantRefused(t, "the coldgc metrics plane", base, nil, []refusal{
		{http.MethodPost, "/__ursula/prometheus", http.StatusMethodNotAllowed},
		{http.MethodPost, "/__ursula/ready", http.StatusMethodNotAllowed},
		{http.MethodDelete, "/__ursula/prometheus", http.StatusMethodNotAllowed},
		{http.MethodGet, "/__ursula/metrics", http.StatusNotFound},
		{http.MethodGet, "/debug/pprof/", http.StatusNotFound},
		{http.MethodPost, "/", http.StatusNotFound},
	})
	if cmd.ProcessState != nil {
		t.Fatalf("ursula-coldgc exited: %v", cmd.ProcessState)
	}
}

// sampleValue returns the value of the series name (without labels) in a
// Prometheus exposition.
func sampleValue(tb testing.TB, text, name string) float64 {
	tb.Helper()
	for line := range strings.Lines(text) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			f, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
			if err != nil {
				tb.Fatalf("%s: %v", name, err)
			}
			return f
		}
	}
	tb.Fatalf("no %s in the exposition", name)
	return 0
}

// otlpEnv points a process at the receiver by OTLP/HTTP, exporting often.
func otlpEnv(endpoint string) []string {
	return []string{
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint,
		"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_METRIC_EXPORT_INTERVAL=500",
		"OTEL_BSP_SCHEDULE_DELAY=100",
	}
}

// tracedSSE runs exercise with a fresh sampled traceparent on the SSE
// read and returns its trace id.
func tracedSSE(t *testing.T, c *Client, stream string) string {
	t.Helper()
	var id [16]byte
	var span [8]byte
	_, _ = rand.Read(id[:])
	_, _ = rand.Read(span[:])
	traceID := hex.EncodeToString(id[:])
	exercise(t, c, stream, http.Header{"Traceparent": {"00-" + traceID + "-" + hex.EncodeToString(span[:]) + "-01"}})
	return traceID
}

// checkOTLP waits until the receiver holds, in the SSE read's trace, each
// of wantSpans ("<service> <span name>", a name ending in "/Subscribe"
// matching any Subscribe RPC span), and metrics with units; then checks
// service.version of every service and the units of the given metrics.
func checkOTLP(t *testing.T, recv *otelcheck.Receiver, traceID string, wantSpans []string, services []string, units map[string]string) {
	t.Helper()
	if !await.Until(await.DefaultTimeout, func() bool {
		trace := recv.Received().Traces[traceID]
		for _, want := range wantSpans {
			found := false
			for _, got := range trace {
				found = found || got == want || (strings.HasSuffix(want, "/Subscribe") && strings.HasPrefix(got, strings.Fields(want)[0]+" ") && strings.HasSuffix(got, "/Subscribe"))
			}
			if !found {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("the SSE read's trace %s holds %q, want %q", traceID, recv.Received().Traces[traceID], wantSpans)
	}
	await.True(t, "metrics with units at the receiver", func() bool {
		got := recv.Received().Units
		for name := range units {
			if _, ok := got[name]; !ok {
				return false
			}
		}
		return true
	})
	got := recv.Received()
	for _, svc := range services {
		if v := got.Versions[svc]; v == "" {
			t.Errorf("spans of service %s without service.version: %v", svc, got.Versions)
		}
	}
	for name, want := range units {
		if u := got.Units[name]; u != want {
			t.Errorf("metric %s: unit %q, want %q", name, u, want)
		}
	}
	for name, unit := range got.Units {
		if unit == "" && (strings.HasPrefix(name, "ursula.") || strings.HasPrefix(name, "http.")) {
			t.Errorf("metric %s has no unit", name)
		}
	}
}

// TestOTLPHTTPExport runs the all-in-one binary with
// OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf against a receiver in the
// test: spans arrive with service.version, the SSE read's upstream
// subscription is in the request's trace, and metrics arrive with units.
func TestOTLPHTTPExport(t *testing.T) {
	recv, endpoint := otelcheck.NewReceiver(t)
	srv := StartServer(t, Options{Env: otlpEnv(endpoint)})
	traceID := tracedSSE(t, NewClient(srv.URL()), "obs/otlp")
	checkOTLP(t, recv, traceID,
		[]string{"ursula GET /v1/stream/{stream...}", "ursula /Subscribe"},
		[]string{"ursula"},
		map[string]string{
			"http.server.request.duration": "s",
			"ursula.node.append.duration":  "s",
			"ursula.raft.persist.duration": "s",
			"ursula.node.append_bytes":     "By",
			"ursula.node.append_requests":  "{request}",
			"ursula.build_info":            "{build}",
		})
}

// TestOTLPHTTPExportCluster: the same with a gateway in front of a
// 3-node cluster, every process exporting to the receiver: the SSE read's
// trace runs from the gateway's request span through the gateway's
// Subscribe call to the node's.
func TestOTLPHTTPExportCluster(t *testing.T) {
	recv, endpoint := otelcheck.NewReceiver(t)
	for _, kv := range otlpEnv(endpoint) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v) // inherited by every process the cluster starts
	}
	c := StartCluster(t, ClusterOptions{Nodes: 3, GroupCount: 4, Gateway: true})
	traceID := tracedSSE(t, c.Client(), "obs/otlp-cluster")
	checkOTLP(t, recv, traceID,
		[]string{"ursula-gateway GET /v1/stream/{stream...}", "ursula-gateway /Subscribe", "ursula-node /Subscribe"},
		[]string{"ursula-gateway", "ursula-node"},
		map[string]string{
			"http.server.request.duration":   "s",
			"ursula.node.append.duration":    "s",
			"ursula.raft.apply.duration":     "s",
			"ursula.node.raft_messages_sent": "{message}",
			"ursula.upstream.known_nodes":    "{node}",
			"ursula.build_info":              "{build}",
		})
}
