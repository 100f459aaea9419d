package gateway

import (
	"context"
	"maps"
	"net/http"
	runtimemetrics "runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/ursula/ursula/services/platform/httpserver"
	"github.com/ursula/ursula/services/platform/telemetry"
)

// tracer starts the gateway's request spans (see trace.go).
var tracer = telemetry.Tracer("gateway")

// methodIndex numbers the methods counted separately; everything else is
// "OTHER".
var methodNames = [...]string{"GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "OTHER"}

func methodIndex(m string) int {
	switch m {
	case http.MethodGet:
		return 0
	case http.MethodHead:
		return 1
	case http.MethodPut:
		return 2
	case http.MethodPost:
		return 3
	case http.MethodDelete:
		return 4
	case http.MethodOptions:
		return 5
	}
	return 6
}

// metrics holds the gateway's counters. All fields are updated atomically
// without locks.
type metrics struct {
	requests       [len(methodNames)][600]atomic.Uint64
	inFlight       atomic.Int64 // requests being served
	budget         *httpserver.Budget
	conns          atomic.Pointer[httpserver.ConnLimiter] // set by Serve
	sseClients     atomic.Int64
	longPolls      atomic.Int64
	sseEvents      atomic.Uint64
	sseDirect      atomic.Uint64 // SSE events written by hub writers
	sseHubs        atomic.Int64
	bytesAppended  atomic.Uint64
	bytesServed    atomic.Uint64
	upstreamErrors atomic.Uint64

	// duration is the standard http.server.request.duration histogram;
	// durationOpts caches its attribute sets by route, method, status
	// and scheme (an immutable map replaced on a miss), so that recording
	// allocates nothing once a combination was seen.
	duration     metric.Float64Histogram
	durationMu   sync.Mutex
	durationOpts atomic.Pointer[map[durationKey][]metric.RecordOption]
}

// durationKey names one series of http.server.request.duration. Routes
// are the templates of routeOf, a small fixed set.
type durationKey struct {
	route  string
	method uint8
	status uint16
	https  bool
}

// newDuration makes the http.server.request.duration histogram from the
// global meter provider.
func (m *metrics) newDuration() {
	m.duration = telemetry.Latency(telemetry.Meter("gateway"), "http.server.request.duration", "Duration of HTTP server requests.")
}

// recordDuration records one request's duration with the attributes the
// HTTP semantic conventions give the metric.
func (m *metrics) recordDuration(ctx context.Context, d time.Duration, route, method string, status int, https bool) {
	if status < 100 || status >= 600 {
		status = 599
	}
	k := durationKey{route: route, method: uint8(methodIndex(method)), status: uint16(status), https: https}
	var opts []metric.RecordOption
	if cache := m.durationOpts.Load(); cache != nil {
		opts = (*cache)[k]
	}
	if opts == nil {
		opts = m.durationOption(k)
	}
	m.duration.Record(ctx, d.Seconds(), opts...)
}

// durationOption adds k's attribute set to the cache.
func (m *metrics) durationOption(k durationKey) []metric.RecordOption {
	m.durationMu.Lock()
	defer m.durationMu.Unlock()
	old := map[durationKey][]metric.RecordOption{}
	if cache := m.durationOpts.Load(); cache != nil {
		if opts, ok := (*cache)[k]; ok {
			return opts
		}
		old = *cache
	}
	method := methodNames[k.method]
	if method == "OTHER" {
		method = "_OTHER"
	}
	scheme := "http"
	if k.https {
		scheme = "https"
	}
	opts := []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(
		semconv.HTTPRequestMethodKey.String(method),
		semconv.HTTPResponseStatusCode(int(k.status)),
		semconv.HTTPRoute(k.route),
		semconv.URLScheme(scheme),
	))}
	next := maps.Clone(old)
	next[k] = opts
	m.durationOpts.Store(&next)
	return opts
}

func (m *metrics) countRequest(method string, status int) {
	if status < 100 || status >= 600 {
		status = 599
	}
	m.requests[methodIndex(method)][status].Add(1)
}

// appendJSON appends the metrics snapshot as a JSON object.
func (m *metrics) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"requests":{`...)
	firstMethod := true
	for mi := range m.requests {
		firstStatus := true
		for st := range m.requests[mi] {
			n := m.requests[mi][st].Load()
			if n == 0 {
				continue
			}
			if firstStatus {
				if !firstMethod {
					dst = append(dst, ',')
				}
				firstMethod = false
				dst = append(dst, '"')
				dst = append(dst, methodNames[mi]...)
				dst = append(dst, `":{`...)
				firstStatus = false
			} else {
				dst = append(dst, ',')
			}
			dst = append(dst, '"')
			dst = strconv.AppendInt(dst, int64(st), 10)
			dst = append(dst, `":`...)
			dst = strconv.AppendUint(dst, n, 10)
		}
		if !firstStatus {
			dst = append(dst, '}')
		}
	}
	dst = append(dst, `},"sse_clients":`...)
	dst = strconv.AppendInt(dst, m.sseClients.Load(), 10)
	dst = append(dst, `,"long_polls_in_flight":`...)
	dst = strconv.AppendInt(dst, m.longPolls.Load(), 10)
	dst = append(dst, `,"sse_events":`...)
	dst = strconv.AppendUint(dst, m.sseEvents.Load(), 10)
	dst = append(dst, `,"sse_events_direct":`...)
	dst = strconv.AppendUint(dst, m.sseDirect.Load(), 10)
	dst = append(dst, `,"sse_hubs":`...)
	dst = strconv.AppendInt(dst, m.sseHubs.Load(), 10)
	dst = append(dst, `,"bytes_appended":`...)
	dst = strconv.AppendUint(dst, m.bytesAppended.Load(), 10)
	dst = append(dst, `,"bytes_served":`...)
	dst = strconv.AppendUint(dst, m.bytesServed.Load(), 10)
	dst = append(dst, `,"upstream_errors":`...)
	dst = strconv.AppendUint(dst, m.upstreamErrors.Load(), 10)
	dst = append(dst, `,"requests_in_flight":`...)
	dst = strconv.AppendInt(dst, m.inFlight.Load(), 10)
	dst = append(dst, `,"inflight_body_bytes":`...)
	dst = strconv.AppendInt(dst, m.budget.InUse(), 10)
	dst = append(dst, `,"inflight_body_limit_bytes":`...)
	dst = strconv.AppendInt(dst, m.budget.Limit(), 10)
	dst = append(dst, `,"inflight_body_refusals":`...)
	dst = strconv.AppendUint(dst, m.budget.Refusals(), 10)
	if c := m.conns.Load(); c != nil {
		dst = append(dst, `,"connections":`...)
		dst = strconv.AppendInt(dst, c.Active(), 10)
		dst = append(dst, `,"max_connections":`...)
		dst = strconv.AppendInt(dst, c.Max(), 10)
		dst = append(dst, `,"connections_refused":`...)
		dst = strconv.AppendUint(dst, c.Refused(), 10)
	}
	dst = append(dst, `,"heap_live_bytes":`...)
	dst = strconv.AppendUint(dst, heapLiveBytes(), 10)
	return append(dst, "}\n"...)
}

// heapLiveBytes is the process's live Go heap as of the last collection.
func heapLiveBytes() uint64 {
	s := []runtimemetrics.Sample{{Name: "/gc/heap/live:bytes"}}
	runtimemetrics.Read(s)
	if s[0].Value.Kind() != runtimemetrics.KindUint64 {
		return 0
	}
	return s[0].Value.Uint64()
}

// MetricsSource reads the gateway's counters as telemetry samples: the
// same counters as GET /__ursula/metrics, requests by method and status.
func (g *Gateway) MetricsSource() telemetry.Source { return g.metrics.emit }

// statusAttrs are the status code attributes, built once.
var statusAttrs = func() (a [600]attribute.KeyValue) {
	for i := range a {
		a[i] = semconv.HTTPResponseStatusCode(i)
	}
	return a
}()

func (m *metrics) emit(emit func(telemetry.Sample)) {
	for mi := range m.requests {
		method := semconv.HTTPRequestMethodKey.String(methodNames[mi])
		for st := range m.requests[mi] {
			if n := m.requests[mi][st].Load(); n > 0 {
				emit(telemetry.Sample{Name: "requests", Kind: telemetry.Counter, Unit: "{request}", Help: "HTTP requests answered, by method and status code.",
					Value: float64(n), Attrs: []attribute.KeyValue{method, statusAttrs[st]}})
			}
		}
	}
	for _, c := range []struct {
		name, unit, help string
		v                uint64
	}{
		{"sse_events", "{event}", "SSE events written to clients.", m.sseEvents.Load()},
		{"sse_events_direct", "{event}", "SSE events written to clients by hub writers.", m.sseDirect.Load()},
		{"bytes_appended", "By", "Bytes appended through this gateway.", m.bytesAppended.Load()},
		{"bytes_served", "By", "Stream bytes served to readers.", m.bytesServed.Load()},
		{"upstream_errors", "{error}", "Calls to the storage nodes that failed.", m.upstreamErrors.Load()},
		{"inflight_body_refusals", "{request}", "Requests refused because the in-flight body budget was spent.", m.budget.Refusals()},
	} {
		emit(telemetry.Sample{Name: c.name, Kind: telemetry.Counter, Unit: c.unit, Help: c.help, Value: float64(c.v)})
	}
	for _, c := range []struct {
		name, unit, help string
		v                int64
	}{
		{"sse_clients", "{connection}", "SSE responses open now.", m.sseClients.Load()},
		{"long_polls_in_flight", "{request}", "Long polls waiting now.", m.longPolls.Load()},
		{"sse_hubs", "{hub}", "Upstream subscriptions shared by SSE clients (one per live stream).", m.sseHubs.Load()},
		{"requests_in_flight", "{request}", "HTTP requests being served now.", m.inFlight.Load()},
		{"inflight_body_bytes", "By", "Request body bytes held now (server.http_inflight_body_size budget).", m.budget.InUse()},
		{"inflight_body_limit_bytes", "By", "The in-flight request body budget (server.http_inflight_body_size).", m.budget.Limit()},
	} {
		emit(telemetry.Sample{Name: c.name, Kind: telemetry.Gauge, Unit: c.unit, Help: c.help, Value: float64(c.v)})
	}
	if c := m.conns.Load(); c != nil {
		emit(telemetry.Sample{Name: "connections", Kind: telemetry.Gauge, Unit: "{connection}", Help: "Client connections held now (at most gateway.max_connections).", Value: float64(c.Active())})
		emit(telemetry.Sample{Name: "connections_refused", Kind: telemetry.Counter, Unit: "{connection}", Help: "Client connections refused because gateway.max_connections were held.", Value: float64(c.Refused())})
	}
}
