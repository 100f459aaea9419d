package otelcheck

import (
	"encoding/hex"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	colmetricpb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Lint runs the Prometheus linter over a text exposition and returns its
// problems as "<metric>: <text>"; an exposition it cannot parse fails tb.
func Lint(tb testing.TB, text string) []string {
	tb.Helper()
	problems, err := promlint.New(strings.NewReader(text)).Lint()
	if err != nil {
		tb.Fatalf("promlint: %v", err)
	}
	var out []string
	for _, p := range problems {
		out = append(out, p.Metric+": "+p.Text)
	}
	return out
}

// Receiver is an OTLP/HTTP receiver: it decodes the protobuf bodies POSTed
// to /v1/traces and /v1/metrics.
type Receiver struct {
	mu       sync.Mutex
	versions map[string]string   // service.name -> service.version
	traces   map[string][]string // trace id -> "<service.name> <span name>"
	units    map[string]string   // metric name -> unit
}

// NewReceiver starts a receiver for the test and returns it with its URL
// (an OTEL_EXPORTER_OTLP_ENDPOINT).
func NewReceiver(tb testing.TB) (*Receiver, string) {
	tb.Helper()
	r := &Receiver{versions: map[string]string{}, traces: map[string][]string{}, units: map[string]string{}}
	srv := httptest.NewServer(r)
	tb.Cleanup(srv.Close)
	return r, srv.URL
}

// Received is a copy of what a Receiver has decoded so far.
type Received struct {
	// Versions maps service.name to the service.version of its spans.
	Versions map[string]string
	// Traces maps a hex trace id to its spans, "<service.name> <span name>".
	Traces map[string][]string
	// Units maps a metric name to its unit.
	Units map[string]string
}

// Received returns what the receiver has decoded so far.
func (r *Receiver) Received() Received {
	r.mu.Lock()
	defer r.mu.Unlock()
	traces := make(map[string][]string, len(r.traces))
	for id, spans := range r.traces {
		traces[id] = append([]string(nil), spans...)
	}
	return Received{Versions: maps.Clone(r.versions), Traces: traces, Units: maps.Clone(r.units)}
}

// ServeHTTP decodes one export.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(req.Body)
	if err != nil || req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var resp proto.Message
	switch req.URL.Path {
	case "/v1/traces":
		var export coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &export); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range export.GetResourceSpans() {
			var name, version string
			for _, kv := range rs.GetResource().GetAttributes() {
				switch kv.GetKey() {
				case "service.name":
					name = kv.GetValue().GetStringValue()
				case "service.version":
					version = kv.GetValue().GetStringValue()
				}
			}
			r.versions[name] = version
			for _, ss := range rs.GetScopeSpans() {
				for _, sp := range ss.GetSpans() {
					id := hex.EncodeToString(sp.GetTraceId())
					r.traces[id] = append(r.traces[id], name+" "+sp.GetName())
				}
			}
		}
		resp = &coltracepb.ExportTraceServiceResponse{}
	case "/v1/metrics":
		var export colmetricpb.ExportMetricsServiceRequest
		if err := proto.Unmarshal(body, &export); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rm := range export.GetResourceMetrics() {
			for _, sm := range rm.GetScopeMetrics() {
				for _, m := range sm.GetMetrics() {
					r.units[m.GetName()] = m.GetUnit()
				}
			}
		}
		resp = &colmetricpb.ExportMetricsServiceResponse{}
	default:
		http.NotFound(w, req)
		return
	}
	out, _ := proto.Marshal(resp)
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}
